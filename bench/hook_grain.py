"""Collective-timing records and bytes per rank-step on the wire, ``comm`` vs ``collective``
grain, from a real DDP job (4 ranks, gloo on CPU) instrumented by the training hook.

The job of tests/hook_jobs.py (an MLP with ~8 MB of gradients), with DDP buckets of
``--bucket-mb``, ``--extra-ops`` small all-reduces per step besides DDP's (public
Megatron traces run 26-166 ops per rank-step), and ``--pad`` seconds of sleep per step
standing in for a bigger model's compute, so steps take ~1 s. Run once per
grain; every rank writes JSON Lines (one event per line, as the publisher's JSON is);
counted per rank-step after the warm-up: collective-timing records (``comm`` or
``collective`` events), their bytes, and the ops they cover. Step events are the same in
both grains and counted apart.

    .venv/bin/python bench/hook_grain.py [--steps 12] [--pad 0.95] [--extra-ops 40]
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

import orjson  # noqa: E402
from hook_jobs import read_events, run_ddp  # noqa: E402

TIMING = ("comm", "collective")


def measure(out: Path, grain: str, args: argparse.Namespace) -> dict:
    steps = run_ddp(out, world=args.world, steps=args.steps, factor=1.0, batch=args.batch,
                    grain=grain, window_s=args.window, pad_s=args.pad,
                    bucket_mb=args.bucket_mb, extra_ops=args.extra_ops)
    lo = args.warmup
    rank_steps = args.world * (args.steps - lo)
    records = nbytes = ops = step_bytes = 0
    for evs in read_events(out, args.world).values():
        for ev in evs:
            if ev.get("step") is None or ev["step"] < lo:
                continue
            size = len(orjson.dumps(ev)) + 1
            if ev["kind"] in TIMING:
                records += 1
                nbytes += size
                ops += sum(o["n"] for o in ev["ops"]) if ev["kind"] == "comm" else 1
            elif ev["kind"] == "step":
                step_bytes += size
    durations = [s["duration_s"] for by in steps.values() for s in by[lo:]]
    return {"step_s_median": round(statistics.median(durations), 3),
            "ops_per_rank_step": round(ops / rank_steps, 2),
            "records_per_rank_step": round(records / rank_steps, 2),
            "bytes_per_rank_step": round(nbytes / rank_steps),
            "step_event_bytes_per_rank_step": round(step_bytes / rank_steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--pad", type=float, default=0.95, help="sleep per step, seconds")
    ap.add_argument("--window", type=float, default=1.0, help="window_s of the comm grain")
    ap.add_argument("--bucket-mb", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--extra-ops", type=int, default=40,
                    help="small all-reduces per step besides DDP's (real jobs: 26-166 ops)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/hook_grain.json"))
    args = ap.parse_args()
    result: dict = {"world": args.world, "steps": args.steps, "warmup": args.warmup,
                    "pad_s": args.pad, "window_s": args.window, "bucket_mb": args.bucket_mb,
                    "extra_ops": args.extra_ops}
    with tempfile.TemporaryDirectory() as tmp:
        for grain in TIMING:
            result[grain] = measure(Path(tmp) / grain, grain, args)
    print(json.dumps(result, indent=2))
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
