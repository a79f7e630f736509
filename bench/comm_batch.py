"""What the ``comm`` windows cost the detector (issue 31): CPU per rank-step of the comm
path, per-rank ``comm`` events against the hosts' ``comm_batch`` es taken as columns.

Simulates a comm-grain trace (default ``large_1024``, 20 steps), gathers it per host and
window as the agents publish it (``schema.batches.batch_trace``), then feeds the
detector the same trace both ways, decoded, its ``comm`` / ``comm_batch`` and ``step``
events only (device samples cost the same both ways and are measured elsewhere:
``bench/detect_throughput.py``). The comm path is timed from inside, in CPU seconds of
this process (the trace held in memory frozen out of the garbage collector's scans), best of
``--repeat``: the detector's comm entry points (a window or a batch
taken: the step evidence, the sub-step evidence and the pipeline pairs, with the
judgements they make) and the sums of the windows when a step is judged
(``CommWindows._sum``). A tree from before the columns (``JobState.add_comm`` and
``P2PMonitor.add_comm`` as the entry points) is timed the same way: run this file from
a copy of that tree. Prints the numbers and whether both inputs gave the same incidents,
and writes them to bench/results/comm_batch.json.

    .venv/bin/python bench/comm_batch.py [--scenario large_1024] [--steps 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.models import comm as comm_mod  # noqa: E402
from failslow.models import job as job_mod  # noqa: E402
from failslow.models import p2p as p2p_mod  # noqa: E402
from failslow.models import pipeline  # noqa: E402
from failslow.schema.batches import batch_trace  # noqa: E402
from failslow.simulator import SCENARIOS, simulate  # noqa: E402

KINDS = frozenset(("comm", "comm_batch", "step"))


class Clock:
    """CPU seconds spent inside the wrapped methods (nested calls counted once)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.depth = 0

    def wrap(self, cls: type, name: str) -> None:
        fn: Callable[..., Any] = getattr(cls, name)

        def timed(*args: Any, **kw: Any) -> Any:
            if self.depth:
                return fn(*args, **kw)
            self.depth = 1
            t0 = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                self.spent += time.process_time() - t0
                self.depth = 0

        setattr(cls, name, timed)


def feed(events: list[dict], clock: Clock) -> tuple[float, float, list[dict]]:
    """(comm path CPU s, whole detector CPU s, incidents) over ``events``."""
    det = pipeline.Detector()
    clock.spent = 0.0
    out: list[dict] = []
    t0 = time.process_time()
    for i in range(0, len(events), 5000):
        out += det.process_batch(events[i:i + 5000])
    out += det.flush()
    return clock.spent, time.process_time() - t0, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="large_1024")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    trace = simulate(SCENARIOS[args.scenario], seed=1, steps=args.steps)
    per_rank = [e for e in trace.events() if e["kind"] in KINDS]
    batched = [e for e in batch_trace(per_rank) if e["kind"] in KINDS]
    ranks = len({e["rank"] for e in per_rank if e["kind"] == "step"})
    # The whole trace is held here, never by a detector: out of the collector's scans
    # (each full scan would walk its millions of objects, both inputs alike).
    gc.collect()
    gc.freeze()
    rank_steps = sum(e["kind"] == "step" for e in per_rank)
    clock = Clock()
    columnar = hasattr(pipeline.Detector, "_comm_batch")
    if columnar:
        for name in ("_comm_batch", "_comm_windows", "_comm_nostep"):
            clock.wrap(pipeline.Detector, name)
    else:      # a tree from before the columns
        clock.wrap(job_mod.JobState, "add_comm")
        clock.wrap(p2p_mod.P2PMonitor, "add_comm")
    sums = Clock()
    sums.wrap(comm_mod.CommWindows, "_sum")
    inputs = {"per-rank comm": per_rank}
    if columnar:
        inputs["comm_batch"] = batched
    print(f"{args.scenario}: {ranks} ranks, {rank_steps} rank-steps, "
          f"{sum(e['kind'] == 'comm' for e in per_rank)} comm windows, "
          f"{sum(e['kind'] == 'comm_batch' for e in batched)} comm_batch; "
          f"{'columnar' if columnar else 'per-event'} tree, best of {args.repeat}")
    incidents = {}
    results: dict[str, Any] = {"scenario": args.scenario, "ranks": ranks,
                               "rank_steps": rank_steps, "columnar_tree": columnar,
                               "load_avg": os.getloadavg()[0], "inputs": {}}
    for label, events in inputs.items():
        best = None
        for _ in range(args.repeat):
            comm_s, total_s, out = feed(events, clock)
            row = (comm_s + sums.spent, comm_s, sums.spent, total_s)
            sums.spent = 0.0
            best = row if best is None or row[0] < best[0] else best
        incidents[label] = out
        assert best is not None
        path, entry, summed, total = best
        results["inputs"][label] = {"comm_path_cpu_s": round(path, 4),
                                    "us_per_rank_step": round(1e6 * path / rank_steps, 2),
                                    "entry_points_cpu_s": round(entry, 4),
                                    "step_sums_cpu_s": round(summed, 4),
                                    "detector_comm_step_cpu_s": round(total, 4)}
        print(f"  {label:14s} comm path {path:6.3f} s CPU = {1e6 * path / rank_steps:5.1f} us "
              f"per rank-step ({rank_steps / path:8.0f} rank-steps per CPU s; entry points "
              f"{entry:.3f} s, step sums {summed:.3f} s); detector on comm+step "
              f"{total:.3f} s")
    same = len(incidents) < 2 or incidents["per-rank comm"] == incidents["comm_batch"]
    if len(incidents) == 2:
        print(f"  incidents: {len(incidents['comm_batch'])}, "
              f"{'identical' if same else 'DIFFERENT'} between the inputs")
        results["identical_incidents"] = same
    out = ROOT / "bench" / "results" / "comm_batch.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
