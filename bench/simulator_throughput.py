"""Simulator throughput: events per second generated and written to a JSON Lines file.

The simulator feeds the throughput benchmarks of the pipeline, so it must never be
their bottleneck (target >= 500k events/s to a file). Measures, per scenario, the
wall time of ``trace.write_jsonl`` (physics + telemetry + JSON lines formatted from
numpy columns + file; no dicts) and of iterating ``trace.events()`` (dicts only),
best of ``--repeat``. The machine is shared, so the process CPU time of the file
path is reported too (``file_cpu_events_per_s``): it varies less with other load.

    .venv/bin/python bench/simulator_throughput.py [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.simulator import SCENARIOS, simulate  # noqa: E402

# (scenario, steps): a small DP job, a 64-rank hybrid job, and the large ones.
CASES = [("healthy_16", 120), ("pipeline_stage_slow", 40), ("large_1024", 10),
         ("large_4096", 8)]


def measure(name: str, steps: int, repeat: int, folder: str) -> dict:
    path = os.path.join(folder, f"{name}.jsonl")
    best_file = best_iter = best_cpu = float("inf")
    n = size = 0
    for _ in range(repeat):
        trace = simulate(SCENARIOS[name], seed=0, steps=steps)
        t, cpu = time.perf_counter(), time.process_time()
        n = trace.write_jsonl(path)
        best_file = min(best_file, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        size = os.path.getsize(path)
        trace = simulate(SCENARIOS[name], seed=0, steps=steps)
        t = time.perf_counter()
        count = sum(1 for _ in trace.events())
        best_iter = min(best_iter, time.perf_counter() - t)
        assert count == n
    world = sum(j.hosts for j in SCENARIOS[name].jobs) * SCENARIOS[name].gpus_per_host
    return {"scenario": name, "ranks": world, "steps": steps, "events": n,
            "bytes": size, "file_s": round(best_file, 3),
            "file_events_per_s": round(n / best_file),
            "file_cpu_events_per_s": round(n / best_cpu), "iter_s": round(best_iter, 3),
            "iter_events_per_s": round(n / best_iter),
            "simulated_s_per_wall_s": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="skip the 4,096-rank case")
    args = ap.parse_args()
    cases = CASES[:-1] if args.quick else CASES
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, steps in cases:
            row = measure(name, steps, args.repeat, folder)
            truth = json.loads(Path(folder, f"{name}.jsonl.truth.json").read_text())
            row["simulated_s_per_wall_s"] = round(
                (truth["end_ts"] - truth["start_ts"]) / row["file_s"], 1)
            rows.append(row)
            print(f"{name:22s} {row['ranks']:5d} ranks {row['events']:9,d} events "
                  f"{row['bytes'] / 1e6:7.1f} MB  file {row['file_events_per_s']:9,d} ev/s "
                  f"(cpu {row['file_cpu_events_per_s']:9,d})  "
                  f"iterate {row['iter_events_per_s']:9,d} ev/s  "
                  f"{row['simulated_s_per_wall_s']:6.1f}x real time", flush=True)
    total_events = sum(r["events"] for r in rows)
    total_s = sum(r["file_s"] for r in rows)
    summary = {"bench": "simulator_throughput", "cpu": platform.processor() or platform.machine(),
               "cores": os.cpu_count(), "load1_at_end": os.getloadavg()[0],
               "target_file_events_per_s": 500_000,
               "overall_file_events_per_s": round(total_events / total_s), "cases": rows}
    print(f"overall to file: {summary['overall_file_events_per_s']:,d} events/s "
          f"(target 500,000; load average {summary['load1_at_end']:.2f} on "
          f"{summary['cores']} cores)")
    out = ROOT / "bench/results/simulator_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
