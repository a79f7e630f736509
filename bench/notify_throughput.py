"""How fast the alerting layer routes, stores and delivers; prints numbers and writes
bench/results/notify_throughput.json.

    .venv/bin/python bench/notify_throughput.py [--incidents 2000]

Measures: router decisions/s (pure), outbox writes/s (SQLite WAL, synchronous=FULL,
one transaction per batch of 100), webhook deliveries/s to a local HTTP receiver
(one POST each), and end to end through a real Tansu broker: incidents/s from
produce to delivered, and the latency of single incidents (produce -> received).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the local HTTP receiver the tests use

from http_receiver import HttpReceiver  # noqa: E402

from failslow.alerting import (  # noqa: E402
    Dispatcher,
    Notification,
    NotifyService,
    Outbox,
    Policy,
    Router,
    WebhookNotifier,
)
from failslow.schema import Topics, encode  # noqa: E402
from failslow.stack import create_topics, start_broker  # noqa: E402


def incident(i: int, **kw) -> dict:
    ev = {"v": 1, "kind": "incident", "ts": 100.0, "incident_id": f"job{i % 50}:slow_rank:r{i}:1",
          "job_id": f"job{i % 50}", "status": "open", "fault": "slow_rank",
          "severity": "critical", "onset_ts": 90.0, "detected_ts": 100.0,
          "slowdown_pct": 20.0, "rank": i % 64, "host": f"h{i % 8}"}
    ev.update(kw)
    return ev


def bench_router(n: int) -> float:
    r = Router(Policy(rates={}), ["console", "slack", "pagerduty", "webhook"])
    events = []
    for i in range(n // 10):
        events.append(incident(i))
        events.extend(incident(i, slowdown_pct=20.0 + k) for k in range(8))
        events.append(incident(i, status="resolved"))
    t0 = time.perf_counter()
    for ev in events:
        r.decide(ev, 0.0)
    return len(events) / (time.perf_counter() - t0)


def bench_outbox(n: int, tmp: Path) -> float:
    box = Outbox(tmp / "outbox.sqlite")
    notes = [Notification("webhook", "open", incident(i)) for i in range(n)]
    t0 = time.perf_counter()
    for k in range(0, n, 100):
        box.record(notes[k:k + 100], {}, 0.0)
    rate = n / (time.perf_counter() - t0)
    box.close()
    return rate


def bench_delivery(n: int, tmp: Path) -> float:
    box = Outbox(tmp / "deliver.sqlite")
    box.record([Notification("webhook", "open", incident(i)) for i in range(n)], {}, 0.0)
    with HttpReceiver() as rx:
        d = Dispatcher(box, {"webhook": WebhookNotifier(rx.url("/hook"))})
        t0 = time.perf_counter()
        while box.pending():
            d.drain(budget_s=10.0)
        rate = n / (time.perf_counter() - t0)
    box.close()
    return rate


def bench_end_to_end(n: int, singles: int, tmp: Path) -> tuple[float, list[float]]:
    broker = start_broker()
    try:
        topics = Topics("bench.")
        create_topics(broker.bootstrap, topics)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        with HttpReceiver() as rx:
            svc = NotifyService(broker.bootstrap, topics,
                                {"webhook": WebhookNotifier(rx.url("/hook"))}, tmp,
                                policy=Policy(rates={}), group_id="bench-notify")
            stop = threading.Event()
            th = threading.Thread(target=svc.run, args=(stop,))
            th.start()
            # Warm up (consumer-group join), then time single incidents one by one.
            producer.produce(topics.for_kind("incident"), key=b"w", value=encode(incident(-1)))
            producer.flush(10)
            rx.wait_for(1, timeout=30)
            latencies = []
            for i in range(singles):
                t0 = time.perf_counter()
                producer.produce(topics.for_kind("incident"), key=b"s",
                                 value=encode(incident(10_000_000 + i)))
                producer.flush(10)
                rx.wait_for(2 + i, timeout=30)
                latencies.append((time.perf_counter() - t0) * 1000.0)
            t0 = time.perf_counter()
            for i in range(n):
                producer.produce(topics.for_kind("incident"), key=f"job{i % 50}".encode(),
                                 value=encode(incident(i)))
            producer.flush(10)
            rx.wait_for(1 + singles + n, timeout=120)
            rate = n / (time.perf_counter() - t0)
            stop.set()
            th.join(30)
        return rate, latencies
    finally:
        broker.stop(timeout=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--incidents", type=int, default=2000)
    ap.add_argument("--singles", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        results = {
            "router_decisions_per_s": round(bench_router(100_000)),
            "outbox_writes_per_s": round(bench_outbox(10_000, tmpdir)),
            "webhook_deliveries_per_s": round(bench_delivery(args.incidents, tmpdir)),
        }
        rate, lat = bench_end_to_end(args.incidents, args.singles, tmpdir / "e2e")
    lat.sort()
    results.update({
        "end_to_end_incidents_per_s": round(rate),
        "end_to_end_latency_ms_p50": round(statistics.median(lat), 1),
        "end_to_end_latency_ms_max": round(lat[-1], 1),
        "incidents": args.incidents, "singles": args.singles,
        "machine": f"{platform.machine()} {platform.node()}",
    })
    for k, v in results.items():
        print(f"{k:32s} {v}")
    out = ROOT / "bench" / "results" / "notify_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
