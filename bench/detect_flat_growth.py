"""Where does `failslow detect`'s CPU per rank-step grow with the job's size? (issue 31)

``bench/detect_flat.py`` says how much the CPU per rank-step grows from one size to another;
this says in which functions. Each size's trace (the one ``detect_flat.py`` keeps:
``flat_RANKS_ppPP_STEPs_STEPS.jsonl`` in ``--trace-dir``) is read by child processes running
the CLI's own ``detect_lines`` under a CPU-time sampler (``ITIMER_PROF``: the kernel's tick,
4 ms here, no code of the run traced, so unlike cProfile it adds nothing per call and leaves
the caches as the run leaves them; cProfile's cost per call hides the growth: at 0e2e716 it
read 890 and 868 us per rank-step at 1,024 and 16,384 ranks, unprofiled 145 and 209).
A size is read by as many children as it takes to gather ``--min-samples`` samples (each a
fresh process, as ``detect_flat.py`` runs one). Each function's share of the samples times
the runs' CPU time, over the rank-steps read, is its CPU per rank-step: own (``self``, the
code of the function and the C calls it makes) and inclusive (``cum``). Printed and written:
both sizes' values per function and the difference, largest first, and the trace's input per
rank-step by kind (lines, rows, bytes: what grows because the input grows).

    .venv/bin/python bench/detect_flat_growth.py [--ranks 1024 16384] [--trace-dir DIR]
        [--min-samples 8000] [--root TREE] [--top 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.schema.batches import BATCH_KINDS  # noqa: E402

CHILD = """
import collections, pickle, signal, sys, time
from failslow.commands.detect import detect_lines
from failslow.models.pipeline import Detector
own, cum = collections.Counter(), collections.Counter()

def tick(sig, frame):
    code = frame.f_code
    own[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
    seen = set()
    while frame is not None:
        code = frame.f_code
        k = (code.co_filename, code.co_firstlineno, code.co_name)
        if k not in seen:
            seen.add(k)
            cum[k] += 1
        frame = frame.f_back

signal.signal(signal.SIGPROF, tick)
with open(sys.argv[1], "rb") as f:
    c0 = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
    detect_lines(f, Detector(), lambda inc: None, lambda no, why: None)
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    cpu = time.process_time() - c0
with open(sys.argv[2], "wb") as o:
    pickle.dump({"cpu": cpu, "self": own, "cum": cum}, o)
"""


def trace_path(trace_dir: Path, ranks: int, pp: int, step_s: float, steps: int) -> Path:
    return trace_dir / f"flat_{ranks}_pp{pp}_{step_s:g}s_{steps}.jsonl"


def composition(path: Path) -> dict[str, dict[str, float]]:
    """Lines, rows and bytes per rank-step of each kind of the trace."""
    lines: collections.Counter[str] = collections.Counter()
    rows: collections.Counter[str] = collections.Counter()
    size: collections.Counter[str] = collections.Counter()
    with path.open("rb") as f:
        for line in f:
            obj = orjson.loads(line)
            kind = obj.get("kind")
            bk = BATCH_KINDS.get(kind)
            lines[kind] += 1
            rows[kind] += len(obj[bk.row_key]) if bk is not None else 1
            size[kind] += len(line)
    rs = rows["step_batch"] + rows["step"]
    return {k: {"lines": round(lines[k] / rs, 4), "rows": round(rows[k] / rs, 4),
                "bytes": round(size[k] / rs, 1)} for k in sorted(lines)} | {
        "rank_steps": {"lines": rs, "rows": rs, "bytes": path.stat().st_size}}


def sample(path: Path, root: str, min_samples: int) -> dict:
    """The samples of as many runs of ``path`` (fresh processes) as ``min_samples`` takes."""
    tot = {"cpu": 0.0, "runs": 0, "self": collections.Counter(), "cum": collections.Counter()}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.pkl"
        while sum(tot["self"].values()) < min_samples:
            subprocess.run([sys.executable, "-c", CHILD, str(path), str(out)],
                           env={**os.environ, "PYTHONPATH": root}, cwd=root, check=True)
            got = pickle.loads(out.read_bytes())
            tot["cpu"] += got["cpu"]
            tot["runs"] += 1
            tot["self"].update(got["self"])
            tot["cum"].update(got["cum"])
    return tot


def per_rank_step(s: dict, which: str, rank_steps: int) -> dict[str, float]:
    n = sum(s["self"].values())
    scale = 1e6 * s["cpu"] / n / (rank_steps * s["runs"])
    out = {}
    for (fn, line, name), k in s[which].items():
        short = fn.split("/failslow/")[-1] if "/failslow/" in fn else fn.split("/")[-1]
        out[f"{short}:{line} {name}"] = k * scale
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", nargs=2, type=int, default=[1024, 16384])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--trace-dir", default="/tmp/s5/flat",
                    help="where detect_flat.py --trace-dir kept the traces")
    ap.add_argument("--min-samples", type=int, default=8000)
    ap.add_argument("--root", default=str(ROOT), help="the source tree whose detect runs")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "detect_flat_growth.json"))
    args = ap.parse_args()
    sizes = []
    load0 = [round(x, 1) for x in os.getloadavg()]
    for ranks in args.ranks:
        path = trace_path(Path(args.trace_dir), ranks, args.pp, args.step_s, args.steps)
        if not path.exists():
            raise SystemExit(f"{path}: no such trace (bench/detect_flat.py --trace-dir "
                             f"{args.trace_dir} --ranks {ranks} writes it)")
        comp = composition(path)
        rs = int(comp["rank_steps"]["rows"])
        s = sample(path, args.root, args.min_samples)
        sizes.append({"ranks": ranks, "rank_steps": rs, "runs": s["runs"],
                      "samples": sum(s["self"].values()),
                      "us_per_rank_step": round(1e6 * s["cpu"] / (rs * s["runs"]), 1),
                      "input_per_rank_step": comp,
                      "self": per_rank_step(s, "self", rs), "cum": per_rank_step(s, "cum", rs)})
        print(f"{ranks:>7,} ranks: {sizes[-1]['us_per_rank_step']} us per rank-step, "
              f"{s['runs']} runs, {sizes[-1]['samples']} samples", flush=True)
    a, b = sizes
    table = {}
    for which in ("self", "cum"):
        rows = [(b[which].get(k, 0.0) - a[which].get(k, 0.0), a[which].get(k, 0.0),
                 b[which].get(k, 0.0), k) for k in set(a[which]) | set(b[which])]
        rows.sort(reverse=True)
        table[which] = [{"function": k, "us_small": round(x, 2), "us_large": round(y, 2),
                         "growth_us": round(d, 2)} for d, x, y, k in rows[:args.top]]
        print(f"\n{which}: us per rank-step at {a['ranks']:,} and {b['ranks']:,} ranks, "
              "largest growth first")
        for d, x, y, k in rows[:args.top]:
            print(f"  {d:+7.2f} {x:8.2f} {y:8.2f}  {k}")
    print("\ninput per rank-step (lines, rows, bytes):")
    for kind in a["input_per_rank_step"]:
        if kind == "rank_steps":
            continue
        x, y = a["input_per_rank_step"][kind], b["input_per_rank_step"].get(kind, {})
        print(f"  {kind:12s} " + "  ".join(
            f"{m} {x[m]:g} -> {y.get(m, 0):g}" for m in ("lines", "rows", "bytes")))
    for s in sizes:
        del s["self"], s["cum"]
    Path(args.out).write_text(json.dumps({
        "note": args.note, "root": args.root, "load_before": load0,
        "load_after": [round(x, 1) for x in os.getloadavg()],
        "clock": "process CPU time; ITIMER_PROF samples of fresh processes",
        "sizes": sizes, "growth": table}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
