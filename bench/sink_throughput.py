"""Throughput of the storage path: Writer -> chdb, and Kafka (Tansu) -> Sink -> chdb.

Prints rows/s and writes bench/results/sink_throughput.json. Sizes are flags so a
busy machine can run a small version:  python bench/sink_throughput.py --rows 200000

The writer looks up the keys already stored before each insert (storage.dedupe: raw rows
and rollups exact under at-least-once delivery). Its cost: the writer's rows/s with the
lookup and, alternating in the same run, without it (``--repeats``), and the rows/s of a
redelivery (every row already stored: the lookup, the join, no insert).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import orjson

from failslow.schema import Topics, encode
from failslow.stack import create_topics, start_broker
from failslow.storage import writer as writer_module
from failslow.storage.client import connect
from failslow.storage.migrations import migrate
from failslow.storage.sink import Sink
from failslow.storage.writer import Writer

RESULTS = Path(__file__).parent / "results" / "sink_throughput.json"


def step_events(n: int, world: int = 64) -> list[dict]:
    return [{"v": 1, "kind": "step", "ts": 1.7e9 + i / world, "job_id": "job0", "rank": i % world,
             "world_size": world, "host": f"h{(i % world) // 8}", "step": i // world,
             "duration_s": 1.0 + (i % 7) * 0.01, "gpu": i % 8, "compute_s": 0.8,
             "comm_s": 0.15, "data_s": 0.05, "tokens": 4096} for i in range(n)]


def gpu_events(n: int) -> list[dict]:
    return [{"v": 1, "kind": "gpu", "ts": 1.7e9 + i / 64, "host": f"h{(i % 64) // 8}",
             "gpu": i % 8, "uuid": f"GPU-{i % 64}", "sm_clock_mhz": 1980.0,
             "max_sm_clock_mhz": 1980.0, "util_pct": 97.0, "power_w": 650.0, "temp_c": 61.0,
             "clocks_event_reasons": 0, "pcie_gen": 5, "pcie_width": 16, "xid": [],
             "ecc_sbe_total": 0, "mem_used_bytes": 60 << 30} for i in range(n)]


def _write_all(client, events: list[dict], batch: int, dedupe: bool) -> float:
    """Seconds to write ``events`` in batches, with or without the dedupe lookup."""
    saved = writer_module.fresh_rows
    if not dedupe:
        writer_module.fresh_rows = lambda *args: None
    try:
        w = Writer(client)
        t0 = time.perf_counter()
        for i in range(0, len(events), batch):
            w.write(events[i:i + batch])
        return time.perf_counter() - t0
    finally:
        writer_module.fresh_rows = saved


def bench_writer(client, rows: int, batch: int, repeats: int) -> dict:
    out: dict = {}
    for name, make, table in (("step", step_events, "steps"), ("gpu", gpu_events, "gpu")):
        events = make(rows)
        times: dict[str, list[float]] = {"dedupe": [], "no_dedupe": [], "redelivered": []}
        for _ in range(repeats):
            for mode in ("dedupe", "no_dedupe"):
                client.execute(f"TRUNCATE TABLE {table}")
                times[mode].append(_write_all(client, events, batch, mode == "dedupe"))
            times["redelivered"].append(_write_all(client, events, batch, True))
        best = {mode: min(ts) for mode, ts in times.items()}
        out[f"writer_{name}_rows_per_s"] = round(rows / best["dedupe"])
        out[f"writer_{name}_rows_per_s_without_dedupe"] = round(rows / best["no_dedupe"])
        out[f"writer_{name}_redelivered_rows_per_s"] = round(rows / best["redelivered"])
        out[f"writer_{name}_dedupe_cost_pct"] = round(
            100 * (best["dedupe"] / best["no_dedupe"] - 1), 1)
    return out


def bench_sink(client, events: int, per_message: int) -> dict:
    broker = start_broker()
    try:
        topics = Topics(prefix=f"bench{uuid.uuid4().hex[:6]}.")
        create_topics(broker.bootstrap, topics, partitions=4)
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                      "compression.type": "lz4"})
        data = step_events(events)
        for i in range(0, events, per_message):
            chunk = data[i:i + per_message]
            p.produce(topics.for_kind("step"), encode(chunk), key=f"job{i % 4}")
            p.poll(0)
        assert p.flush(60) == 0
        stop = threading.Event()
        sink = Sink(client, broker.bootstrap, topics, group_id="bench")
        thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
        thread.start()
        t_first = t_done = None
        while t_done is None:
            n = client.query("SELECT count() FROM steps")[1][0][0]
            now = time.perf_counter()
            if n and t_first is None:
                t_first, n_first = now, n
            if n >= events:
                t_done = now
            time.sleep(0.05)
        stop.set()
        thread.join(30)
        rate = (events - n_first) / (t_done - t_first) if t_done > t_first else float("nan")
        # None when the whole backlog landed between two looks (too small to time)
        return {"sink_kafka_to_chdb_events_per_s": None if rate != rate else round(rate),
                "sink_events": events,
                "sink_events_per_message": per_message, "sink_stats": sink.stats.as_dict()}
    finally:
        broker.stop(timeout=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=300_000, help="rows per kind for the writer")
    ap.add_argument("--batch", type=int, default=20_000, help="rows per writer batch")
    ap.add_argument("--sink-events", type=int, default=300_000)
    ap.add_argument("--per-message", type=int, default=500, help="events per Kafka message")
    ap.add_argument("--repeats", type=int, default=3,
                    help="writer runs per mode (with / without the dedupe lookup); best kept")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="failslow-bench-"))
    try:
        client = connect(f"chdb://{folder / 'chdb'}?database=bench_writer", own=True)
        migrate(client)
        result = {"machine": f"{platform.machine()} {platform.node()}", "rows": args.rows,
                  "batch": args.batch, "repeats": args.repeats,
                  "load1_before": round(os.getloadavg()[0], 2),
                  **bench_writer(client, args.rows, args.batch, args.repeats)}
        client.close()
        sink_client = connect(f"chdb://{folder / 'chdb'}?database=bench_sink", own=True)
        migrate(sink_client)
        result.update(bench_sink(sink_client, args.sink_events, args.per_message))
        sink_client.close()
        result["load1_after"] = round(os.getloadavg()[0], 2)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
