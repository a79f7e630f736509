"""Where the floor of `failslow detect`'s input path is (issue 14): CPU per rank-step.

Simulates a comm-grain trace (default ``large_1024``, 20 steps, every device sample, and
the agents' on-change + heartbeat sampling), then times, in CPU seconds of this process,
best of ``--repeat``, each layer of the input path alone over the same lines in memory:

1. ``split``: the lines only (reading and splitting the bytes: nearly free);
2. ``decode``: ``orjson.loads`` of every line (the fastest JSON decoder for Python);
3. ``decode+validate``: that plus the contract's validation (``schema.fast.all_valid``,
   the one validator the worker, the sink and detect share);
4. ``detect``: the whole CLI path (``failslow.commands.detect.detect_lines``).

Each layer's rank-steps per CPU second is the most the input path could reach if every
layer above it were free: the ``decode`` line is the ceiling of any pure-Python detector
that reads this wire format one JSON object per event. Writes
bench/results/decode_floor.json.

With ``--batched`` the trace is what the host agents publish by default (one columnar batch
per host and window or sample, ``schema.batches.batch_trace``) and ``decode+validate`` is
the check ``failslow detect`` runs on a chunk of batches; it writes
bench/results/decode_floor_batched.json. That line is the ceiling of a detector that reads
the batched wire format with orjson and the contract's checks, however fast the detector
itself were.

    .venv/bin/python bench/decode_floor.py [--scenario large_1024] [--steps 20] [--repeat 3]
        [--batched]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.collectors.samplers import filter_trace  # noqa: E402
from failslow.commands.detect import BATCH, _all_valid, detect_lines  # noqa: E402
from failslow.models.pipeline import Detector  # noqa: E402
from failslow.schema.batches import batch_trace  # noqa: E402
from failslow.simulator import SCENARIOS, simulate  # noqa: E402

TARGET = 40_000     # rank-steps per CPU second (issue 14)


def best(fn, repeat: int) -> float:
    """Least process CPU time of ``repeat`` calls of ``fn``, with the garbage collector off
    as ``failslow detect`` runs (its collections would walk the simulated trace held here)."""
    spent = []
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            c0 = time.process_time()
            fn()
            spent.append(time.process_time() - c0)
        finally:
            gc.enable()
    return min(spent)


def layers(lines: list[bytes], repeat: int) -> dict[str, float]:
    """CPU seconds of each layer over ``lines``."""
    blob = b"".join(lines)
    loads = orjson.loads

    def decode() -> None:
        for i in range(0, len(lines), BATCH):
            [loads(x) for x in lines[i:i + BATCH]]

    def decode_validate() -> None:
        for i in range(0, len(lines), BATCH):
            if not _all_valid([loads(x) for x in lines[i:i + BATCH]]):
                raise SystemExit("an invalid event in a simulated trace")

    def detect() -> None:
        detect_lines(iter(lines), Detector(), lambda inc: None, lambda no, why: None)

    return {"split": best(lambda: blob.splitlines(keepends=True), repeat),
            "decode": best(decode, repeat),
            "decode+validate": best(decode_validate, repeat),
            "detect": best(detect, repeat)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="large_1024")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batched", action="store_true",
                    help="the host agents' columnar batches, as `failslow simulate` writes")
    args = ap.parse_args()
    sim = simulate(SCENARIOS[args.scenario], seed=0, steps=args.steps, grain="comm")
    events = list(sim.events())
    out: dict = {"scenario": args.scenario, "steps": args.steps, "grain": "comm",
                 "clock": f"process CPU time, best of {args.repeat}",
                 "batched": args.batched,
                 "loadavg_before": os.getloadavg(), "target_rank_steps_per_s": TARGET,
                 "samplings": {}}
    for sampling, evs in (("every sample", events), ("on change + heartbeat", None)):
        evs = evs if evs is not None else filter_trace(events)
        rank_steps = sum(1 for e in evs if e["kind"] == "step")
        if args.batched:
            evs = list(batch_trace(evs))
        lines = [orjson.dumps(e) + b"\n" for e in evs]
        cpu = layers(lines, args.repeat)
        row = {"events": len(lines), "rank_steps": rank_steps,
               "events_per_rank_step": round(len(lines) / rank_steps, 2),
               "bytes_per_rank_step": round(sum(map(len, lines)) / rank_steps),
               "cpu_s": {k: round(v, 4) for k, v in cpu.items()},
               "us_per_rank_step": {k: round(v / rank_steps * 1e6, 2) for k, v in cpu.items()},
               "rank_steps_per_cpu_s_if_later_layers_free": {
                   k: round(rank_steps / v) if v else None for k, v in cpu.items()}}
        out["samplings"][sampling] = row
        print(f"{args.scenario}, {sampling}: {len(lines):,} lines, {rank_steps:,} rank-steps "
              f"({row['events_per_rank_step']} lines, {row['bytes_per_rank_step']} B each)")
        for k, v in cpu.items():
            rate = rank_steps / v if v else float("inf")
            print(f"  {k:16s} {v:7.3f} CPU s  {v / rank_steps * 1e6:7.2f} us/rank-step  "
                  f"-> at most {rate:9,.0f} rank-steps/CPU s   (target {TARGET:,})")
    out["loadavg_after"] = os.getloadavg()
    dest = ROOT / "bench" / "results" / ("decode_floor_batched.json" if args.batched
                                          else "decode_floor.json")
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest.relative_to(ROOT)}; load {out['loadavg_before'][0]:.1f} -> "
          f"{out['loadavg_after'][0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
