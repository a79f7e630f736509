"""Throughput of `failslow detect`: JSON decode + validation + detection, one core.

Writes simulated traces to a temporary folder, then times the very code the CLI
runs (``failslow.commands.detect.detect_lines``) over the file's lines, best of
``--repeat`` runs. Also times the detector alone on pre-decoded events.
Prints events/s; writes bench/results/detect_throughput.json.

    .venv/bin/python bench/detect_throughput.py [--scenario NAME ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.commands.detect import detect_lines  # noqa: E402
from models.pipeline import Detector  # noqa: E402
from simulator import SCENARIOS, simulate  # noqa: E402


def best_of(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", nargs="*",
                    default=["gpu_thermal_30", "gpu_power_20", "pipeline_stage_slow"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenario:
            path = Path(tmp) / f"{name}.jsonl"
            n = simulate(SCENARIOS[name], seed=0).write_jsonl(path)
            lines = path.read_bytes().splitlines()
            events = [orjson.loads(line) for line in lines]
            kinds: dict[str, int] = {}
            for e in events:
                kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1

            def full(lines=lines):
                detect_lines(lines, Detector(), lambda inc: None, lambda no, why: None)

            def core(events=events):
                det = Detector()
                det.process_batch(events)
                det.flush()
            t_full = best_of(args.repeat, full)
            t_core = best_of(args.repeat, core)
            results[name] = {"events": n, "kinds": kinds,
                             "detect_events_per_s": round(n / t_full),
                             "detector_only_events_per_s": round(n / t_core)}
            print(f"{name:24s} {n:8d} events  failslow detect (decode+validate+detect): "
                  f"{n / t_full:10,.0f} ev/s   detector alone: {n / t_core:10,.0f} ev/s")
    total = sum(r["events"] for r in results.values())
    full_s = sum(r["events"] / r["detect_events_per_s"] for r in results.values())
    print(f"{'overall':24s} {total:8d} events  {total / full_s:10,.0f} ev/s (one core)")
    out = ROOT / "bench" / "results" / "detect_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"scenarios": results,
                                  "overall_events_per_s": round(total / full_s)},
                                 option=orjson.OPT_INDENT_2))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
