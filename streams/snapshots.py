"""Periodic snapshots of home-partition state on the internal snapshot topic, and reading
back a partition's snapshot and emitted incidents when a worker takes it over.

Why not faust tables: on Tansu a changelog restore stops early (end offsets are
wrong) and nothing is compacted. A snapshot here is one zlib-compressed JSON
document (the Detector's ``state_dict()``, watermark, offsets), cut into chunks
of <= 512 KiB, each chunk produced and flushed on its own so that every chunk
is its own record batch: then even Tansu's end offset (newest batch's base
offset + 1) is right, and the newest snapshot is read from the tail without
scanning the topic. If the tail does not hold a complete snapshot the whole
partition is scanned and the newest complete one wins.

Snapshot topic partition = home partition; a single worker owns a partition at
a time, so one snapshot's chunks are contiguous.
"""

from __future__ import annotations

import uuid
import zlib
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from schema.errors import FailslowError
from schema.kafka_security import client_conf
from streams.quiet import RDKAFKA_LOG

CHUNK_BYTES = 512 * 1024


class SnapshotError(FailslowError):
    """A snapshot could not be written to the broker."""


def _reader(bootstrap: str) -> Consumer:
    return Consumer(client_conf(bootstrap, {
        "group.id": f"failslow-restore-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "fetch.wait.max.ms": 50,
        "session.timeout.ms": 6000, "enable.partition.eof": False,
        "logger": RDKAFKA_LOG}))


def scan(bootstrap: str, topic: str, partition: int, start: int = 0,
         idle_polls: int = 2, limit: int | None = None) -> list[Any]:
    """All messages of one partition from ``start`` until the broker has nothing more
    (``idle_polls`` empty 0.2 s polls in a row: end offsets cannot be trusted on Tansu)."""
    consumer = _reader(bootstrap)
    out: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        empty = 0
        while empty < idle_polls and (limit is None or len(out) < limit):
            msgs = consumer.consume(num_messages=1000, timeout=0.2)
            good = [m for m in msgs if m.error() is None]
            empty = 0 if good else empty + 1
            out.extend(good)
    finally:
        consumer.close()
    return out[:limit] if limit is not None else out


class SnapshotStore:
    """Write and read snapshots of home partitions (``topic`` partition = home partition)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._producer = Producer(client_conf(bootstrap, {
            "linger.ms": 0, "compression.type": "none", "acks": "all",
            "message.max.bytes": 2 * CHUNK_BYTES, "logger": RDKAFKA_LOG}))

    def write(self, partition: int, snap: dict) -> int:
        """Write one snapshot; returns its size in bytes once the broker holds all of it."""
        return self.write_blob(partition, self.encode(snap))

    @staticmethod
    def encode(snap: dict) -> bytes:
        """A snapshot as written (JSON, zlib level 1): the CPU-bound part of ``write``."""
        return zlib.compress(orjson.dumps(snap, option=orjson.OPT_SERIALIZE_NUMPY), 1)

    def write_blob(self, partition: int, blob: bytes) -> int:
        """Write an ``encode``d snapshot; returns its size once the broker holds all of it."""
        chunks = [blob[i:i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)] or [b""]
        sid = uuid.uuid4().hex.encode()
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for i, chunk in enumerate(chunks):
            headers: list[tuple[str, str | bytes | None]] = [
                ("sid", sid), ("chunk", str(i).encode()), ("of", str(len(chunks)).encode())]
            self._producer.produce(self.topic, chunk, key=str(partition).encode(),
                                   partition=partition, headers=headers, on_delivery=delivered)
            left = self._producer.flush(10.0)
            if left or errors:
                raise SnapshotError(f"snapshot of partition {partition} not delivered: "
                                    f"{errors[0] if errors else 'timeout'}")
        return len(blob)

    def read_latest(self, partition: int) -> dict | None:
        """The newest complete snapshot of ``partition``, or None."""
        try:
            hi = self._high(partition)
        except KafkaException:
            hi = 0
        if hi > 0:
            tail = scan(self.bootstrap, self.topic, partition, start=hi - 1, idle_polls=1, limit=1)
            if tail:
                h = dict(tail[0].headers() or [])
                n, i = int(h.get("of", b"0")), int(h.get("chunk", b"-1"))
                if n and i == n - 1:
                    msgs = scan(self.bootstrap, self.topic, partition, start=hi - n,
                                idle_polls=1, limit=n)
                    snap = _assemble(msgs)
                    if snap is not None:
                        return snap
        return _newest(scan(self.bootstrap, self.topic, partition))

    def _high(self, partition: int) -> int:
        consumer = _reader(self.bootstrap)
        try:
            _, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                   timeout=5.0)
        finally:
            consumer.close()
        return int(hi)


def _assemble(msgs: list[Any]) -> dict | None:
    """One snapshot from its chunk messages in order, or None if they do not form one."""
    if not msgs:
        return None
    heads = [dict(m.headers() or []) for m in msgs]
    sid, n = heads[0].get("sid"), int(heads[0].get("of", b"0"))
    if n != len(msgs) or any(h.get("sid") != sid or int(h.get("chunk", b"-1")) != i
                             for i, h in enumerate(heads)):
        return None
    return orjson.loads(zlib.decompress(b"".join(m.value() or b"" for m in msgs)))


def _newest(msgs: list[Any]) -> dict | None:
    """The last complete snapshot in a scan of a whole partition."""
    newest: dict | None = None
    run: list[Any] = []
    for m in msgs:
        h = dict(m.headers() or [])
        if int(h.get("chunk", b"-1")) == 0:
            run = []
        run.append(m)
        if int(h.get("chunk", b"-1")) == int(h.get("of", b"0")) - 1:
            newest = _assemble(run) or newest
            run = []
    return newest
