"""Worker memory per 1,000 ranks tracked, on the real Tansu broker.

One worker per size processes a few steps of a job with that many ranks
(simulator ``large_1024`` / ``large_4096`` layouts, plus their hosts' telemetry);
once everything is processed its resident memory (VmRSS) and the size of its
newest state snapshot are read. The slope between the sizes is the cost per
1,000 ranks; the smallest size shows the fixed cost of a worker.

    .venv/bin/python bench/streams_memory.py [--steps 3]

Prints numbers and writes bench/results/streams_memory.json.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path

from streams_throughput import processed, publish_sliced  # noqa: I001 - bench/ is on sys.path

from failslow.schema import Topics
from failslow.simulator import SCENARIOS, simulate
from failslow.stack import create_topics, free_port, start_broker
from failslow.worker_process import WorkerProcess

RESULTS = Path(__file__).parent / "results"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def snapshot_bytes(port: int) -> float:
    import urllib.request

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("failslow_stream_snapshot_bytes{"))


def measure(bootstrap: str, scenario: str, steps: int) -> dict:
    events = list(simulate(SCENARIOS[scenario], seed=0, steps=steps).events())
    ranks = max(e["rank"] for e in events if e["kind"] == "step") + 1
    topics = Topics(f"m{uuid.uuid4().hex[:8]}.")
    create_topics(bootstrap, topics)
    publish_sliced(bootstrap, topics, events)
    del events
    port = free_port()
    worker = WorkerProcess(bootstrap, topics, group="mem", metrics_port=port,
                           extra=["--snapshot-interval", "2"])
    try:
        deadline = time.monotonic() + 300
        while processed([port]) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        last, stable = -1.0, 0
        while stable < 8 and time.monotonic() < deadline:  # 4 s with no new events
            now = processed([port])
            stable = stable + 1 if now == last else 0
            last = now
            time.sleep(0.5)
        time.sleep(2.5)  # one more snapshot
        busy = rss_bytes(worker.proc.pid)
        # The snapshot writer hands freed heap back to the OS at most every 10 s
        # (streams.snapshots.release_freed_memory): what the worker holds once settled.
        time.sleep(10.5)
        return {"scenario": scenario, "ranks": ranks, "rss_bytes": rss_bytes(worker.proc.pid),
                "rss_just_processed_bytes": busy,
                "snapshot_bytes": snapshot_bytes(port), "events": last}
    finally:
        worker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", metavar="SCENARIO",
                    help="one run (e.g. large_1024 --steps 30: how RSS grows with the steps "
                         "read as a backlog), no slope")
    args = ap.parse_args()
    broker = start_broker()
    try:
        runs = [measure(broker.bootstrap, s, args.steps)
                for s in ([args.only] if args.only else
                          ("healthy_16", "large_1024", "large_4096"))]
    finally:
        broker.stop(2)
    for r in runs:
        print(f"{r['ranks']:>5} ranks, {args.steps} steps, {r['events']:.0f} events: RSS "
              f"{r['rss_bytes'] / 2**20:7.1f} MiB settled "
              f"({r['rss_just_processed_bytes'] / 2**20:.1f} MiB just after processing) "
              f"({r['rss_bytes'] / 2**20 / r['ranks'] * 1000:.0f} MiB per 1,000 ranks, fixed "
              f"cost included), snapshot {r['snapshot_bytes'] / 2**10:8.1f} KiB (zlib)")
    if args.only:
        return
    a, b = runs[1], runs[2]
    per_k = (b["rss_bytes"] - a["rss_bytes"]) / ((b["ranks"] - a["ranks"]) / 1000)
    snap_k = (b["snapshot_bytes"] - a["snapshot_bytes"]) / ((b["ranks"] - a["ranks"]) / 1000)
    print(f"per 1,000 ranks tracked: {per_k / 2**20:.1f} MiB of worker memory, "
          f"{snap_k / 2**10:.1f} KiB of snapshot")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "streams_memory.json").write_text(json.dumps(
        {"runs": runs, "rss_bytes_per_1k_ranks": per_k, "snapshot_bytes_per_1k_ranks": snap_k},
        indent=2))


if __name__ == "__main__":
    main()
