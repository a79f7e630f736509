"""Read what was published back from a real broker (tests only; Kafka is never faked)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from failslow.schema import decode


def read_messages(bootstrap: str, topic: str, expect_events: int | None = None,
                  timeout: float = 20.0, partitions: int = 4) -> list[tuple[str, list[dict]]]:
    """(key, events) of every message on ``topic``, per partition in offset order.

    Reads by assignment (no consumer-group join, which Tansu answers slowly) until
    ``expect_events`` events arrived, or until the topic stays quiet for 1.5 s.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[tuple[str, list[dict]]] = []
    n = 0
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if expect_events is not None and n >= expect_events:
                break
            if expect_events is None and time.monotonic() - quiet_since > 1.5:
                break
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            events = decode(msg.value())
            out.append((msg.key().decode(), events))
            n += len(events)
            quiet_since = time.monotonic()
    finally:
        consumer.close()
    return out


def read_events(bootstrap: str, topic: str, expect_events: int | None = None,
                timeout: float = 20.0) -> list[dict]:
    """Every event on ``topic`` (messages flattened), per partition in offset order."""
    return [ev for _, evs in read_messages(bootstrap, topic, expect_events, timeout) for ev in evs]
