"""CPU cost of device telemetry per GPU-second, next to the cost of the job's own events
(steps and comm windows), in the offline path the worker shares (`failslow detect`):
decode + validation of the messages as the Publisher sends them (one array per topic,
key and second), then the Detector.

The Detector's share is measured by difference: the same trace with and without its
``gpu``/``nic``/``host`` samples (best of ``--repeat`` runs each, process CPU time).
The comm trace comes from ``bench/comm_grain.py`` (the simulator's, or converted).

    .venv/bin/python bench/telemetry_cost.py [--scenario large_1024] [--steps 20]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import orjson  # noqa: E402
from comm_grain import trace_events  # noqa: E402

from failslow.models.pipeline import Detector  # noqa: E402
from failslow.schema.fast import all_valid  # noqa: E402
from failslow.schema.topics import key_for  # noqa: E402

TELEMETRY = ("gpu", "nic", "host")


def _cpu(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def decode_cost(events: list[dict], repeat: int) -> dict[str, float]:
    """kind -> CPU s to decode and validate its messages (orjson + the compiled check)."""
    values: dict[str, list[bytes]] = defaultdict(list)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for ev in events:
        groups[(int(ev["ts"]), ev["kind"], key_for(ev))].append(ev)
    for (_, kind, _), evs in groups.items():
        values[kind].append(orjson.dumps(evs))

    def run(vs: list[bytes]) -> None:
        for v in vs:
            if not all_valid(orjson.loads(v)):
                raise SystemExit("invalid trace")

    return {kind: _cpu(lambda vs=vs: run(vs), repeat) for kind, vs in values.items()}


def detector_cost(events: list[dict], repeat: int) -> float:
    return _cpu(lambda: Detector().process_batch(events), repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="large_1024")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "telemetry_cost.json"))
    args = ap.parse_args()
    events, source = trace_events(args.scenario, args.steps, "comm", 1.0)
    counts = Counter(e["kind"] for e in events)
    gpus = len({(e["host"], e["gpu"]) for e in events if e["kind"] == "gpu"})
    span = events[-1]["ts"] - events[0]["ts"]
    gpu_s = gpus * span
    decode = decode_cost(events, args.repeat)
    job = [e for e in events if e["kind"] not in TELEMETRY]
    det_all = detector_cost(events, args.repeat)
    det_job = detector_cost(job, args.repeat)
    tel_decode = sum(decode.get(k, 0.0) for k in TELEMETRY)
    job_decode = sum(v for k, v in decode.items() if k not in TELEMETRY)
    us = 1e6 / gpu_s
    result = {
        "machine": f"{platform.machine()} {platform.node()}", "scenario": args.scenario,
        "steps": args.steps, "comm_trace": source, "gpus": gpus, "span_s": round(span, 1),
        "events_per_gpu_s": {k: round(n / gpu_s, 3) for k, n in sorted(counts.items())},
        "decode_us_per_event": {k: round(decode[k] / counts[k] * 1e6, 2) for k in sorted(decode)},
        "telemetry_us_per_gpu_s": {"decode": round(tel_decode * us, 1),
                                   "detector": round((det_all - det_job) * us, 1),
                                   "total": round((tel_decode + det_all - det_job) * us, 1)},
        "job_events_us_per_gpu_s": {"decode": round(job_decode * us, 1),
                                    "detector": round(det_job * us, 1),
                                    "total": round((job_decode + det_job) * us, 1)},
    }
    tel, own = result["telemetry_us_per_gpu_s"]["total"], result["job_events_us_per_gpu_s"]["total"]
    result["telemetry_share"] = round(tel / (tel + own), 3)
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
