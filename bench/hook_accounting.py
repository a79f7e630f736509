"""How honest the training hook's step accounting is under DDP overlap (4 ranks, gloo, CPU).

The job of tests/hook_jobs.py (an MLP with ~8 MB of gradients in several DDP buckets,
~0.1-0.2 s steps), run ``--runs`` times benign and ``--runs`` times with rank 2 doing 2x
the compute (real extra matmuls in forward and backward) from step ``--slow-from``.
Prints, for ``compute_s`` as the hook reports it (time blocked on communication taken
out) and as it was (``compute_sum_s``: the sum of op durations taken out):

* benign spread: per step, (max - min) / median of the ranks' compute, p50 and p90;
  and per run, (max - min) / median of the ranks' median compute (steady imbalance);
* with a 2x peer: each healthy rank's median compute relative to the benign phase of
  the same run (1.0 = unchanged), and the slow rank's.

    .venv/bin/python bench/hook_accounting.py [--runs 2] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hook_jobs import med, run_ddp, spread  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--slow-from", type=int, default=12)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    warm, lo, hi = 2, args.slow_from, args.steps
    fields = {"hook": "compute_s", "sum_of_ops": "compute_sum_s"}
    benign: dict[str, list[float]] = {k: [] for k in fields}
    rank_spread: dict[str, list[float]] = {k: [] for k in fields}
    healthy: dict[str, list[float]] = {k: [] for k in fields}
    slow: dict[str, list[float]] = {k: [] for k in fields}
    step_s = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            b = run_ddp(Path(tmp) / f"benign{run}", steps=hi, factor=1.0, batch=args.batch)
            step_s += [s["duration_s"] for steps in b.values() for s in steps[warm:]]
            for k, f in fields.items():
                benign[k] += spread(b, f, warm, hi)
                meds = sorted(med(steps, f, warm, hi) for steps in b.values())
                rank_spread[k].append((meds[-1] - meds[0]) / statistics.median(meds)
                                      if statistics.median(meds) > 0 else float("inf"))
            r = run_ddp(Path(tmp) / f"slow{run}", steps=hi, slow_rank=2, slow_from=lo,
                        factor=2.0, batch=args.batch)
            for k, f in fields.items():
                for rank, steps in r.items():
                    base = med(steps, f, warm, lo)
                    ratio = med(steps, f, lo, hi) / base if base > 0 else float("inf")
                    (slow if rank == 2 else healthy)[k].append(ratio)
    out = {"runs": args.runs, "steps": hi, "step_s_median": round(statistics.median(step_s), 3)}
    for k in fields:
        out[k] = {"benign_spread_p50_pct": round(100 * _pct(benign[k], 0.5), 1),
                  "benign_spread_p90_pct": round(100 * _pct(benign[k], 0.9), 1),
                  "benign_rank_medians_spread_pct": [round(100 * x, 1) for x in rank_spread[k]],
                  "healthy_compute_vs_benign": [round(x, 2) for x in healthy[k]],
                  "slow_compute_vs_benign": [round(x, 2) for x in slow[k]]}
    print(json.dumps(out, indent=2))
    path = ROOT / "bench/results/hook_accounting.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
