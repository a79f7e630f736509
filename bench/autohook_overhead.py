"""What the no-code hook costs a process it is armed in, and one it is not.

Answers "does `failslow run --install-hook` / `FAILSLOW_TRACE_DIR` slow down Python, or
a job it cannot instrument?". In a fresh virtual environment that sees this one's
packages (``--without-pip``, a .pth adding this site-packages), timed in alternating
rounds, medians:

- ``startup_ms``: ``python -c pass`` without failslow's .pth, with it and
  ``FAILSLOW_TRACE_DIR`` unset (every other Python of the environment), and with it set
  (the hook armed: a finder waits for torch.distributed);
- ``import_torch_ms``: ``python -c "import torch.distributed"`` without and with the hook
  armed (init_process_group and destroy_process_group are wrapped at import);
- ``step_us``: one ``optimizer.step()`` of a 64x64 linear layer in a one-rank gloo job,
  without and with the hook armed (the global post-hook ends and begins a step), fastest
  of 5 batches of 2,000.

    .venv/bin/python bench/autohook_overhead.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
lin = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(lin.parameters(), lr=0.0)
lin(torch.randn(4, 64)).sum().backward()
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(2000):
        opt.step()
    best = min(best, (time.perf_counter() - t0) / 2000)
print(best * 1e6)
dist.destroy_process_group()
"""


def fresh_env(where: Path) -> tuple[str, Path]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = str(where / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "00-parent.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    subprocess.run([sys.executable, "-m", "failslow.cli", "run", "--install-hook",
                    "--site-dir", str(site)], check=True, capture_output=True)
    return python, site / "failslow-hook.pth"


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "bench/results/autohook_overhead.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        python, pth = fresh_env(Path(tmp) / "venv")
        off = pth.with_suffix(".off")
        base = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_")}
        armed = {**base, "FAILSLOW_TRACE_DIR": str(Path(tmp) / "traces"),
                 "FAILSLOW_RUN_ID": "bench", "MASTER_ADDR": "127.0.0.1"}
        runs: dict[str, list[float]] = {k: [] for k in (
            "startup_no_pth", "startup_pth_unset", "startup_armed", "torch_unset",
            "torch_armed")}
        for _ in range(args.rounds):
            pth.rename(off)
            runs["startup_no_pth"].append(timed([python, "-c", "pass"], base))
            off.rename(pth)
            runs["startup_pth_unset"].append(timed([python, "-c", "pass"], base))
            runs["startup_armed"].append(timed([python, "-c", "pass"], armed))
        for _ in range(max(3, args.rounds // 3)):
            cmd = [python, "-c", "import torch.distributed"]
            runs["torch_unset"].append(timed(cmd, base))
            runs["torch_armed"].append(timed(cmd, armed))
        step = {}
        for name, env in (("unset", base), ("armed", armed)):
            from failslow.stack import free_port

            out = subprocess.run([python, "-c", STEP], capture_output=True, text=True, check=True,
                                 env={**env, "MASTER_ADDR": "127.0.0.1",
                                      "MASTER_PORT": str(free_port())})
            step[name] = float(out.stdout.split()[-1])
    med = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    result = {
        "startup_ms": {"no_pth": med["startup_no_pth"], "pth_unset": med["startup_pth_unset"],
                       "armed": med["startup_armed"]},
        "import_torch_ms": {"unset": med["torch_unset"], "armed": med["torch_armed"]},
        "step_us": {k: round(v, 2) for k, v in step.items()},
        "rounds": args.rounds, "loadavg": os.getloadavg(), "ts": time.time(),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
