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
a time, so one snapshot's chunks are normally contiguous. A snapshot is found by its
``sid`` header, not by contiguity, so chunks of an undelivered snapshot that the broker
still took later cannot spoil the next one.

A snapshot that cannot be delivered (the broker unreachable for longer than a chunk's
flush, 10 s) is skipped, not fatal (issue 17: a 10 s outage made the worker exit 70):
``try_write_blob`` returns None, the worker acks nothing for it and snapshots again on
its next round (after ``RETRY_S``, so an outage costs one flush wait, not one per
partition). Snapshots only bound the replay after a restart; until one is written the
job topic is simply not acked past the previous one.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition as AioPartition
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from failslow.schema import kafka_security
from failslow.schema.errors import FailslowError
from failslow.schema.kafka_security import client_conf, reader_conf
from failslow.streams.quiet import RDKAFKA_LOG

CHUNK_BYTES = 512 * 1024
FLUSH_S = 10.0   # the longest one chunk may take to be acknowledged
RETRY_S = 5.0    # after an undelivered snapshot, no other is tried for this long
TRIM_EVERY_S = 10.0
UNTIL_WAIT_S = 15.0  # the longest a scan waits for a partition's known end (``until``)
log = logging.getLogger("failslow.worker")


def release_freed_memory() -> bool:
    """Hand the heap memory that Python freed back to the OS (glibc ``malloc_trim``);
    False where there is no glibc. A worker reading a backlog peaks at ~3x its live
    objects (decoded batches, fetch buffers, a snapshot's JSON and zlib copies) and glibc
    keeps the freed pages: measured on a 1,024-rank job after 20 steps, 506 MiB of RSS
    with 73 MiB of live Python objects, 365 MiB after one trim (issue 17)."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC is False:
        return False
    _LIBC.malloc_trim(0)
    return True


_LIBC: Any = None


class SnapshotError(FailslowError):
    """A snapshot could not be written to the broker."""


class _Record:
    """An aiokafka record with the calls of a confluent-kafka message ``scan``'s callers make."""

    __slots__ = ("_r",)

    def __init__(self, record: Any) -> None:
        self._r = record

    def value(self) -> bytes | None:
        return self._r.value  # type: ignore[no-any-return]

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self._r.headers or ())

    def offset(self) -> int:
        return int(self._r.offset)

    def error(self) -> Any:
        return None  # aiokafka raises a fetch's errors or retries them; none reaches here


class _Reader:
    """A partition reader for ``scan``, with the calls of a confluent-kafka consumer it
    makes (``assign``, ``consume``, ``close``), on aiokafka and a private event loop in
    the calling thread (a take-over thread: it has no loop of its own).

    Not librdkafka: it kills the process (SIGSEGV in its own thread) when a topic it is
    fetching is deleted and created again on Tansu (``route_stage.HostMapReader`` says how;
    a scan while the topic was recreated: 4 of 4 runs). The worker scans the snapshot and
    incident topics when partitions are assigned, which after a broker restart is when
    its topic watch recreates the internal topics. aiokafka fetches by topic name."""

    def __init__(self, bootstrap: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._tp: Any = None
        self._consumer: Any = None
        try:
            self._consumer = self._loop.run_until_complete(self._start(bootstrap))
        except KafkaError:
            self._consumer = None  # no broker: every poll is empty (as librdkafka's were)

    @staticmethod
    async def _start(bootstrap: str) -> Any:
        # "latest" as librdkafka's default: a start past the end reads nothing
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="latest", fetch_max_wait_ms=50,
            **kafka_security.current().aiokafka())
        try:
            await consumer.start()
        except KafkaError:
            await consumer.stop()
            raise
        return consumer

    def assign(self, parts: list[TopicPartition]) -> None:
        (tp,) = parts
        self._tp = AioPartition(tp.topic, tp.partition)
        if self._consumer is not None:
            self._loop.run_until_complete(self._assign(max(0, tp.offset)))

    async def _assign(self, offset: int) -> None:  # aiokafka wants its loop running
        self._consumer.assign([self._tp])
        self._consumer.seek(self._tp, offset)

    def consume(self, num_messages: int, timeout: float) -> list[_Record]:
        if self._consumer is None:
            time.sleep(timeout)
            return []
        got = self._loop.run_until_complete(self._consumer.getmany(
            self._tp, timeout_ms=int(timeout * 1000), max_records=num_messages))
        return [_Record(r) for r in got.get(self._tp, ())]

    def close(self) -> None:
        try:
            if self._consumer is not None:
                self._loop.run_until_complete(self._consumer.stop())
        finally:
            self._loop.close()


def _reader(bootstrap: str) -> _Reader:
    return _Reader(bootstrap)


def _offsets_reader(bootstrap: str) -> Consumer:
    # librdkafka for ListOffsets only (no fetch: not the path that crashes, see _Reader)
    return Consumer(reader_conf(bootstrap, f"failslow-restore-{uuid.uuid4().hex}", {
        "session.timeout.ms": 6000, "enable.partition.eof": False, "logger": RDKAFKA_LOG}))


def scan(bootstrap: str, topic: str, partition: int, start: int = 0,
         idle_polls: int = 2, limit: int | None = None, until: int | None = None,
         wait_s: float = UNTIL_WAIT_S) -> list[Any]:
    """All messages of one partition from ``start`` until the broker has nothing more
    (``idle_polls`` empty 0.2 s polls in a row: end offsets cannot be trusted on Tansu).

    ``until``: an offset the partition is known to reach (its high watermark): the scan
    does not stop on empty polls before a message at ``until - 1`` or later arrived,
    for ``wait_s`` at most. On a loaded machine the first fetch can take longer than a
    few 0.2 s polls, and a scan that gave up then restored no snapshot (issue 16: half of
    a killed worker's partitions of a 131,072-rank job restarted without state, at load
    12)."""
    consumer = _reader(bootstrap)
    out: list[Any] = []
    deadline = time.monotonic() + wait_s
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        empty = 0
        last = start - 1
        while limit is None or len(out) < limit:
            msgs = consumer.consume(num_messages=1000, timeout=0.2)
            good = [m for m in msgs if m.error() is None]
            empty = 0 if good else empty + 1
            if good:
                last = max(last, good[-1].offset() or 0)
            out.extend(good)
            if empty >= idle_polls and (until is None or last >= until - 1
                                        or time.monotonic() > deadline):
                break
    finally:
        consumer.close()
    return out[:limit] if limit is not None else out


def high_offset(bootstrap: str, topic: str, partition: int) -> int | None:
    """The high watermark of one partition, or None when the broker does not answer."""
    consumer = _offsets_reader(bootstrap)
    try:
        _, hi = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5.0)
        return int(hi)
    except KafkaException:
        return None
    finally:
        consumer.close()


class SnapshotStore:
    """Write and read snapshots of home partitions (``topic`` partition = home partition)."""

    def __init__(self, bootstrap: str, topic: str,
                 barrier: Callable[[], None] | None = None) -> None:
        """``barrier`` runs before each write (in the writer's thread): the worker's sends
        must be acknowledged before a snapshot that counts them as done is written."""
        self.bootstrap = bootstrap
        self.topic = topic
        self.barrier = barrier
        self.skipped = 0          # snapshots not delivered (skipped), in all
        self._skipping = 0        # ... since the last delivered one
        self._retry_at = 0.0
        self._trim_at = 0.0
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
            left = self._producer.flush(FLUSH_S)
            if left or errors:
                why = errors[0] if errors else f"not acknowledged within {FLUSH_S:.0f} s"
                # nothing of it may land later, behind a newer snapshot's chunks
                self._producer.purge()
                self._producer.poll(0)
                raise SnapshotError(f"snapshot of partition {partition} not delivered: {why}")
        return len(blob)

    def try_write_blob(self, partition: int, blob: bytes) -> int | None:
        """``write_blob`` after the ``barrier``; None when the snapshot was not delivered
        (or not tried: an undelivered one less than ``RETRY_S`` ago). One log line when
        snapshots stop being delivered and one when they are again."""
        if self.barrier is not None:
            self.barrier()
        if time.monotonic() < self._retry_at:
            self._skip()
            return None
        try:
            size = self.write_blob(partition, blob)
        except SnapshotError as exc:
            self._retry_at = time.monotonic() + RETRY_S
            if not self._skipping:
                log.warning("%s; snapshots are skipped until the broker takes them again "
                            "(the job topic is not acked meanwhile; nothing is lost)", exc)
            self._skip()
            return None
        if self._skipping:
            log.warning("snapshots delivered again (%d skipped)", self._skipping)
            self._skipping = 0
        if time.monotonic() >= self._trim_at:  # in the writer's thread, not the loop's
            self._trim_at = time.monotonic() + TRIM_EVERY_S
            release_freed_memory()
        return size

    def _skip(self) -> None:
        self.skipped += 1
        self._skipping += 1

    def read_latest(self, partition: int) -> dict | None:
        """The newest complete snapshot of ``partition``, or None."""
        hi = high_offset(self.bootstrap, self.topic, partition) or 0
        if hi > 0:
            tail = scan(self.bootstrap, self.topic, partition, start=hi - 1, idle_polls=1,
                        limit=1, until=hi)
            if tail:
                h = dict(tail[0].headers() or [])
                n, i = int(h.get("of", b"0")), int(h.get("chunk", b"-1"))
                if n and i == n - 1:
                    msgs = scan(self.bootstrap, self.topic, partition, start=hi - n,
                                idle_polls=1, limit=n, until=hi)
                    snap = _assemble(msgs)
                    if snap is not None:
                        return snap
        return _newest(scan(self.bootstrap, self.topic, partition, until=hi or None))



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
    """The newest complete snapshot in a scan of a whole partition: the one whose last
    chunk comes last, its chunks gathered by ``sid`` (another snapshot's chunks may sit
    between them)."""
    chunks: dict[bytes, dict[int, Any]] = {}
    complete: list[bytes] = []   # sids in the order their snapshots became complete
    for m in msgs:
        h = dict(m.headers() or [])
        sid, n, i = h.get("sid"), int(h.get("of", b"0")), int(h.get("chunk", b"-1"))
        if not isinstance(sid, bytes) or not 0 <= i < n:
            continue
        got = chunks.setdefault(sid, {})
        got[i] = m
        if len(got) == n:
            complete.append(sid)
    for sid in reversed(complete):
        got = chunks[sid]
        snap = _assemble([got[i] for i in range(len(got))])
        if snap is not None:
            return snap
    return None
