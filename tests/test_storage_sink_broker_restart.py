"""Issue 17: a sink that keeps running while Tansu (memory only) is restarted on the same
port. The new broker's partitions start empty at offset 0 while the sink still holds its
old, higher positions, and Tansu does not answer OFFSET_OUT_OF_RANGE for them: the sink
used to wait until the new partition grew past its old position and skip every record
below it. Now it notices the partition's end falling below what it saw before, logs one
warning and reads the partition again from its start."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer
from storage_support import ch, minimal_event  # noqa: F401 - fixture
from waiting import wait_until

from failslow.schema import Topics, encode
from failslow.stack import create_topics, free_port, start_broker
from failslow.storage.sink import Sink

pytestmark = pytest.mark.integration


def _publish(bootstrap: str, topic: str, job: str, n: int) -> None:
    """``n`` step events of job ``job``, one record each (so the partition's offsets grow
    by ``n``), all on the same partition (one key)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, encode({**minimal_event("step", i), "job_id": job}), key=b"job")
    assert p.flush(15) == 0


def _steps(client, job: str) -> int:
    return int(client.query(f"SELECT count() FROM steps FINAL WHERE job_id = '{job}'")[1][0][0])


def test_a_sink_that_outlives_a_broker_restart_skips_nothing_published_after_it(
        tmp_path, ch, caplog) -> None:  # noqa: F811
    n, m = 120, 40            # fewer records after the restart than the sink's old position
    port = free_port()
    b = start_broker(port, log_path=tmp_path / "tansu.log")
    topics = Topics(prefix=f"r{uuid.uuid4().hex[:8]}.")
    stop = threading.Event()
    sink = Sink(ch, b.bootstrap, topics, group_id="restart-sink", max_delay_s=0.2)
    thread = threading.Thread(target=sink.run, kwargs={"stop": stop}, daemon=True)
    caplog.set_level(logging.WARNING, logger="failslow.sink")
    try:
        create_topics(b.bootstrap, topics, partitions=2)
        thread.start()
        _publish(b.bootstrap, topics.for_kind("step"), "before", n)
        wait_until(lambda: _steps(ch, "before") == n, timeout=60, what="the first steps in chdb")
        # In a live system the sink always holds an unwritten batch: when the restarted
        # broker makes the group rebalance, the sink writes it and commits its old, high
        # positions to the NEW broker, and is handed them back. Hold one here too.
        sink.max_delay_s = 3600.0
        seen = sink.stats.messages
        _publish(b.bootstrap, topics.for_kind("step"), "held", 10)
        wait_until(lambda: sink.stats.messages >= seen + 10, timeout=20,
                   what="the held batch consumed")

        b.proc.kill()                                   # type: ignore[union-attr]
        b.proc.wait()                                   # type: ignore[union-attr]
        b = start_broker(port, log_path=tmp_path / "tansu.log")
        create_topics(b.bootstrap, topics, partitions=2)  # what an operator (or `up`) does
        sink.max_delay_s = 0.2
        _publish(b.bootstrap, topics.for_kind("step"), "after", m)

        wait_until(lambda: _steps(ch, "after") == m, timeout=45,
                   what=f"the {m} steps published after the broker restart in chdb")
    finally:
        stop.set()
        thread.join(20)
        b.stop(1)
    assert not thread.is_alive()
    # One WARNING line says what was lost (topic, partition, position, end) and what now.
    lost = [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "the broker lost" in r.getMessage()
            and topics.for_kind("step") in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in caplog.records]
    assert f"{topics.for_kind('step')} partition " in lost[0]
    assert f"position {n + 10} end " in lost[0], lost[0]
    assert _steps(ch, "before") == n and _steps(ch, "held") == 10


def test_the_notifier_outlives_a_broker_restart_and_pages_new_incidents_once(
        tmp_path, caplog) -> None:
    """The notifier has the same shape (issue 17): after the restart it reads the new
    incidents topic from its start; what it notified before stays silent (the router's
    state in the outbox), each new incident is notified exactly once. (Without a held
    batch the old notifier happened to get this right too, by its group rejoining with
    no committed offsets: this test guards the no-re-page side of the fix.)"""
    from http_receiver import HttpReceiver
    from test_alerting_service import Running, incident

    from failslow.alerting import NotifyService, WebhookNotifier

    n, m = 12, 4
    port = free_port()
    b = start_broker(port, log_path=tmp_path / "tansu.log")
    topics = Topics(prefix=f"n{uuid.uuid4().hex[:8]}.")
    caplog.set_level(logging.WARNING, logger="failslow.alerting")

    def publish(tag: str, count: int) -> None:
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        for i in range(count):
            p.produce(topics.for_kind("incident"), encode(incident(f"{tag}:{i}")), key=b"job0")
        assert p.flush(15) == 0

    try:
        create_topics(b.bootstrap, topics, partitions=1)
        with HttpReceiver() as rx:
            svc = NotifyService(b.bootstrap, topics, {"webhook": WebhookNotifier(rx.url("/h"))},
                                tmp_path, group_id="restart-notify")
            with Running(svc):
                publish("before", n)
                rx.wait_for(n, "/h", timeout=30)
                b.proc.kill()                           # type: ignore[union-attr]
                b.proc.wait()                           # type: ignore[union-attr]
                b = start_broker(port, log_path=tmp_path / "tansu.log")
                create_topics(b.bootstrap, topics, partitions=1)
                publish("before", 2)                    # replayed by the worker: silent
                publish("after", m)
                rx.wait_for(n + m, "/h", timeout=45)
                time.sleep(2.0)                         # nothing more may come
            ids = [r.json()["incident_id"] for r in rx.received("/h")]
    finally:
        b.stop(1)
    assert sorted(ids) == sorted([f"before:{i}" for i in range(n)]
                                 + [f"after:{i}" for i in range(m)]), ids
    lost = [r.getMessage() for r in caplog.records if "the broker lost" in r.getMessage()]
    assert len(lost) == 1 and topics.for_kind("incident") in lost[0], lost
