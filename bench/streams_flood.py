"""Worker memory under a flood of invented jobs, hosts, ranks and groups, on the real Tansu.

Three runs, each a fresh worker with its metrics endpoint:
  calm     the real job alone (simulator ``gpu_thermal_30``: 16 ranks, one slow GPU)
  flood    the same job, then --flood events of each hostile kind interleaved with it:
           a new job id per step event, a new host per GPU sample, and one job that
           invents a new rank, host and collective group in every event
  raised   the flood with the caps raised out of reach (probation of new jobs and the
           holding of unknown hosts' samples still bound it)
Events are published live, ``--speed`` times the trace's pace, to a running worker
(``--backlog``: all of them before it starts; the worker then reads 15x more data at full
speed, and its RSS measures that read-ahead more than its state). Once everything is
processed, the worker's resident memory (VmRSS) is read, with the incidents of the real
job and the events the caps dropped. Target: flood within 2x calm.

    .venv/bin/python bench/streams_flood.py [--flood 50000] [--speed 10 | --backlog]

Prints numbers and writes bench/results/streams_flood.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from flood_support import hostile_events  # noqa: E402, I001 - tests/ put on sys.path
from streams_memory import rss_bytes  # noqa: E402 - bench/ is on sys.path
from streams_throughput import processed, publish_sliced

from failslow.collectors.publisher import Publisher
from failslow.stack import create_topics, free_port, start_broker
from failslow.worker_process import WorkerProcess
from failslow.schema import Topics
from failslow.simulator import SCENARIOS, simulate

RESULTS = Path(__file__).parent / "results"
SIZED = ["--max-jobs", "16", "--max-hosts", "64", "--max-ranks-per-job", "64",
         "--max-groups-per-job", "256", "--max-hosts-per-job", "16"]
UNCAPPED = ["--max-jobs", "100000000", "--max-hosts", "100000000", "--max-ranks-per-job",
            "100000000", "--max-groups-per-job", "100000000", "--max-hosts-per-job", "100000000"]


def flood_events(t0: float, t1: float, n: int) -> list[dict]:
    return [e for u in range(n) for e in hostile_events(t0 + (t1 - t0) * u / n, u, 1 << 24)]


def metric(port: int, name: str) -> float:
    return processed([port], name)


def publish_live(bootstrap: str, topics: Topics, events: list[dict], speed: float) -> None:
    """Publish 1 s slices of event time, ``speed`` slices per wall second."""
    pub = Publisher(bootstrap, topics)
    t0, start = time.monotonic(), 0
    for n in range(1, len(events) + 1):
        if n == len(events) or events[n]["ts"] - events[start]["ts"] >= 1.0:
            pub.publish(events[start:n])
            start = n
            due = t0 + (events[start - 1]["ts"] - events[0]["ts"]) / speed
            time.sleep(max(0.0, due - time.monotonic()))
    if pub.flush(120):
        raise SystemExit("publisher could not deliver everything")
    pub.close()


def measure(bootstrap: str, label: str, events: list[dict], extra: list[str],
            speed: float | None) -> dict:
    topics = Topics(f"f{uuid.uuid4().hex[:8]}.")
    create_topics(bootstrap, topics)
    if speed is None:
        publish_sliced(bootstrap, topics, events)
    port = free_port()
    worker = WorkerProcess(bootstrap, topics, group="flood", metrics_port=port, extra=extra)
    try:
        if speed is not None:
            time.sleep(8.0)  # the worker joins its group (~3 s on Tansu)
            publish_live(bootstrap, topics, events, speed)
        # Every published event is valid, so the worker counts each one once.
        deadline = time.monotonic() + 900
        last = 0.0
        while last < len(events) and time.monotonic() < deadline:
            time.sleep(0.5)
            last = metric(port, "failslow_stream_events_total")
        time.sleep(5.0)  # idle sources released, incidents emitted
        return {"run": label, "events": last, "rss_bytes": rss_bytes(worker.proc.pid),
                "incidents": metric(port, "failslow_stream_incidents_total"),
                "capped": metric(port, "failslow_stream_capped_events_total")}
    finally:
        worker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=50_000,
                    help="events of each hostile kind (4 kinds) [50000]")
    ap.add_argument("--speed", type=float, default=10.0,
                    help="publish live at this many times the trace's pace [10]")
    ap.add_argument("--backlog", action="store_true",
                    help="publish everything before the worker starts (a backlog) instead")
    ap.add_argument("--sized", action="store_true",
                    help="caps sized for this cluster (4x its one 16-rank job) instead of the "
                    "defaults, which let a hostile job grow as large as a 32k-rank one")
    args = ap.parse_args()
    speed = None if args.backlog else args.speed
    caps = SIZED if args.sized else []
    real = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0).events())
    first_step = min(e["ts"] for e in real if e["kind"] == "step")
    t1 = max(e["ts"] for e in real)
    flooded = sorted(real + flood_events(first_step + 5.0, t1, args.flood), key=lambda e: e["ts"])
    broker = start_broker()
    try:
        runs = [measure(broker.bootstrap, "calm", real, caps, speed),
                measure(broker.bootstrap, "flood", flooded, caps, speed)]
        if not args.sized:
            runs.append(measure(broker.bootstrap, "raised", flooded, UNCAPPED, speed))
    finally:
        broker.stop(2)
    for r in runs:
        print(f"{r['run']:>8}: {r['events']:>9.0f} events, worker RSS "
              f"{r['rss_bytes'] / 2**20:7.1f} MiB, incidents {r['incidents']:.0f}, "
              f"capped {r['capped']:.0f}")
    ratio = runs[1]["rss_bytes"] / runs[0]["rss_bytes"]
    print(f"flood / calm RSS: {ratio:.2f}x (target < 2x)")
    RESULTS.mkdir(exist_ok=True)
    mode = ("backlog" if speed is None else f"live x{speed:g}") + (", sized caps" if caps else "")
    print(f"mode: {mode}")
    name = "streams_flood" + ("_backlog" if speed is None else "") + ("_sized" if caps else "")
    name += ".json"
    (RESULTS / name).write_text(json.dumps(
        {"mode": mode, "flood_per_kind": args.flood, "runs": runs, "flood_over_calm": ratio},
        indent=2))


if __name__ == "__main__":
    main()
