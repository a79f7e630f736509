"""`failslow detect`'s CPU per rank-step, this tree against another revision's WHOLE tree
(decoder and detector both), on the same traces: the large simulator scenarios (tp8 pp4 /
tp8 pp8, comm grain, 1 Hz GPU/NIC/host telemetry), per rank and batched as the host agents
publish them (``schema.batches.batch_trace``: ``comm_batch``, ``gpu_batch``, ``nic_batch``).

``--base REV`` is checked out with ``git worktree`` into a temporary folder; each run is a
child process with that tree first on ``PYTHONPATH`` (this tree's for the others), reading
the trace file with ``failslow.commands.detect.detect_lines``, best of ``--repeat`` runs
by process CPU time (what else runs on the machine does not count against it). A
revision that does not know a batch kind only runs the per-rank trace.

    .venv/bin/python bench/detect_trees.py [--base 083fb33] [--steps 30 20] [--repeat 2]

Prints one line per (tree, scenario, input) and writes bench/results/detect_trees.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.schema.batches import batch_trace  # noqa: E402
from failslow.simulator import SCENARIOS, simulate  # noqa: E402

CHILD = """
import sys, time
from failslow.commands.detect import detect_lines
from failslow.models.pipeline import Detector
best = None
for _ in range(int(sys.argv[2])):
    c0 = time.process_time()
    with open(sys.argv[1], "rb") as f:
        detect_lines(f, Detector(), lambda inc: None, lambda no, why: None)
    t = time.process_time() - c0
    best = t if best is None else min(best, t)
print(best)
"""


def run(tree: Path, trace: Path, repeat: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(trace), str(repeat)], env=env,
                         cwd=tree, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="083fb33", help="the revision to compare with")
    ap.add_argument("--scenario", nargs="*", default=["large_1024", "large_4096"])
    ap.add_argument("--steps", nargs="*", type=int, default=[30, 20],
                    help="steps per scenario (one each, in order)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(wt), base], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            for name, steps in zip(args.scenario, args.steps, strict=True):
                evs = list(simulate(SCENARIOS[name], seed=0, steps=steps).events())
                rank_steps = sum(e["kind"] == "step" for e in evs)
                traces = {"per-rank": evs, "batched": list(batch_trace(evs))}
                for what, items in traces.items():
                    path = Path(tmp) / f"{name}.{what}.jsonl"
                    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in items))
                    for label, tree in ((base, wt), ("this tree", ROOT)):
                        if what == "batched" and tree is wt:
                            continue        # the base may not know every batch kind
                        cpu = run(tree, path, args.repeat)
                        row = {"tree": label, "scenario": name, "input": what,
                               "rank_steps": rank_steps, "lines": len(items),
                               "cpu_s": round(cpu, 3),
                               "us_per_rank_step": round(1e6 * cpu / rank_steps, 1),
                               "rank_steps_per_cpu_s": round(rank_steps / cpu)}
                        rows.append(row)
                        print(f"{label:10s} {name:11s} {what:8s} {row['lines']:8,} lines "
                              f"{row['us_per_rank_step']:7.1f} us/rank-step "
                              f"{row['rank_steps_per_cpu_s']:7,} rank-steps per CPU s",
                              flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                           check=False, capture_output=True)
    out = ROOT / "bench" / "results" / "detect_trees.json"
    out.write_text(json.dumps({"base": base, "clock": "process CPU time, best of "
                               f"{args.repeat}", "rows": rows}, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
