"""Kafka -> ClickHouse: the consumer loop of `failslow sink`, reusable in a thread.

At-least-once: offsets are committed only after ClickHouse acknowledged every row
of the batch they cover (and the dead letters of that batch were delivered). A
crash replays at most the uncommitted batch; the tables are built so that a
replay is harmless where it matters (ReplacingMergeTree natural keys, and
`incidents_current` picks the latest row per incident_id).

Bad records never stop the loop: a value that fails `schema.decode_lenient`, one larger
than ``schema.limits.MESSAGE_MAX_BYTES`` that is not an array cut to fit (the worker's
rule too), or an event whose values do not fit the columns goes to the dead-letter topic
AND the `dead_letters` table, and is counted.

Each bad record lands in `dead_letters` once (issue 33 item 7). The sink reads every event
topic and judges each record itself, so it owns the rows of the records it rejects (with
their partition and offset). A record read back from the dead-letter topic is stored only
when this sink does not reject it too: not one it produced itself (header
``failslow-source: sink``), and not a record of an event topic that fails the sink's own
checks (the worker and `notify` report those as well). What another stage rejects for a
reason of its own (e.g. the worker's producer-clock check, a producer's too-large event)
is stored from the topic.

A broker that lost its topics (Tansu restarted on the same port without its data, or a
topic recreated) is noticed by the topic ids changing (``kafka_security.TopicIdWatch``,
checked every second): one WARNING line, and the lost topics' partitions are read again
from their start, so nothing published after the restart is skipped (issue 17).

>>> stop = threading.Event()                                       # doctest: +SKIP
>>> Sink(client, "127.0.0.1:9092", Topics()).run(stop, max_seconds=10)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from failslow.schema import Topics, decode_lenient, encode_deadletter
from failslow.schema.codec import DEADLETTER_RAW_MAX
from failslow.schema.kafka_security import TopicIdWatch, client_conf, group_consumer_conf
from failslow.schema.limits import MESSAGE_MAX_BYTES, split_value, too_large
from failslow.storage.client import Client
from failslow.storage.errors import StorageError
from failslow.storage.migrations import migrate
from failslow.storage.writer import KIND_TABLE, Writer, WriteResult

log = logging.getLogger("failslow.sink")

SOURCE_HEADER = "failslow-source"
SOURCE = b"sink"
ERROR_LIMIT = 2000  # characters of joined error text kept per dead letter
_TRUNCATED = re.compile(r"\.\.\. \[truncated: (\d+) bytes\]$")


def consumer_config(bootstrap: str, group_id: str) -> dict[str, Any]:
    """The sink's consumer: ``kafka_security.group_consumer_conf``."""
    return group_consumer_conf(bootstrap, group_id)


@dataclass
class SinkStats:
    messages: int = 0        # Kafka records consumed
    rows: int = 0            # rows ClickHouse acknowledged (all tables, dead letters included)
    events: int = 0          # CONTRACT events written to their tables
    dead_letters: int = 0    # records/events rejected by this sink
    dead_letters_shared: int = 0  # dead letters of other stages this sink rejected too
    write_errors: int = 0    # failed ClickHouse writes (retried)
    failing_writes: int = 0  # failed tries in a row of the batch being written; 0 once acked
    commits: int = 0         # offset commits after acknowledged batches
    kafka_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Sink:
    """Consume every topic under ``topics`` and write it into ClickHouse in batches."""

    def __init__(self, client: Client, bootstrap: str, topics: Topics,
                 group_id: str = "failslow-sink", database: str | None = None,
                 batch_rows: int = 20_000, max_delay_s: float = 0.5,
                 max_buffered_rows: int = 200_000, retry_max_s: float = 5.0,
                 extra_config: dict[str, Any] | None = None):
        self.client = client
        self.topics = topics
        self.bootstrap = bootstrap
        self.writer = Writer(client, database, max_rows=max_buffered_rows,
                             repair=lambda: migrate(client, database))
        self.batch_rows = batch_rows
        self.max_delay_s = max_delay_s
        self.retry_max_s = retry_max_s
        self.config = {**consumer_config(bootstrap, group_id), **(extra_config or {})}
        self.stats = SinkStats()
        self._offsets: dict[tuple[str, int], int] = {}
        self._consumer: Any = None
        self._producer: Any = None
        self._stop = threading.Event()
        self._deadline: float | None = None
        self._positions: dict[tuple[str, int], int] = {}   # next offset, per partition read
        self._topic_ids = TopicIdWatch(bootstrap, topics.all(), log)
        self._kind_topic = {table: topics.for_kind(kind) for kind, table in KIND_TABLE.items()}

    def run(self, stop: threading.Event | None = None, max_seconds: float | None = None,
            idle_exit_s: float | None = None) -> SinkStats:
        """Consume until ``stop`` is set, ``max_seconds`` passed, or nothing arrived for
        ``idle_exit_s`` after the first record. Always flushes and commits before returning."""
        from confluent_kafka import Consumer

        self._stop = stop or threading.Event()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self._deadline = deadline
        self._consumer = Consumer(self.config)
        self._consumer.subscribe(self.topics.all(), on_revoke=self._on_revoke)
        last_flush = last_data = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                if idle_exit_s is not None and self.stats.messages and \
                        now - last_data >= idle_exit_s:
                    break
                if self._offsets and (self.writer.pending >= self.batch_rows
                                      or now - last_flush >= self.max_delay_s):
                    self._ack()
                    last_flush = time.monotonic()
                for lost in self._topic_ids.check(self._consumer, self._positions):
                    self._offsets.pop(lost, None)   # an offset of the lost log: never commit it
                msgs = self._consumer.consume(num_messages=2000, timeout=0.1)
                if msgs:
                    last_data = time.monotonic()
                for msg in msgs:
                    self._handle(msg)
        except StorageError as exc:
            log.error("stopping: %s", exc)
        finally:
            self._close()
        return self.stats

    def _close(self) -> None:
        try:
            self._ack(final=True)
        except StorageError as exc:
            log.error("stopping with an unwritten batch (it will be consumed again): %s", exc)
        self._consumer.close()
        if self._producer is not None:
            self._producer.flush(10.0)
            self._producer = None

    def _on_revoke(self, consumer: Any, partitions: Any) -> None:
        # Write and commit what we hold before another member takes these partitions.
        try:
            self._ack(final=True)
        except StorageError as exc:
            log.warning("rebalance with an unwritten batch (it will be consumed again): %s", exc)

    def _handle(self, msg: Any) -> None:
        if msg.error():
            self.stats.kafka_errors += 1
            log.warning("kafka: %s", msg.error())
            return
        self.stats.messages += 1
        value = msg.value() or b""
        if msg.topic() == self.topics.deadletter:
            self._from_deadletter_topic(msg, value)
        elif len(value) > MESSAGE_MAX_BYTES and split_value(value) is None:
            self._dead(msg.topic(), msg.key(), too_large(len(value)), value, msg.partition(),
                       msg.offset(), _msg_ts(msg))
        else:
            events, errors = decode_lenient(value, self.topics.kinds_of(msg.topic()))
            for event in events:
                self._buffer(self.writer.add, event)
            if errors:
                self._dead(msg.topic(), msg.key(), "; ".join(errors), value,
                           msg.partition(), msg.offset(), _msg_ts(msg))
        self._offsets[(msg.topic(), msg.partition())] = \
            self._positions[(msg.topic(), msg.partition())] = msg.offset() + 1

    def _from_deadletter_topic(self, msg: Any, value: bytes) -> None:
        if (SOURCE_HEADER, SOURCE) in (msg.headers() or []):
            return  # ours: already in the table
        try:
            rec = orjson.loads(value)
            row: dict[str, Any] = {"topic": str(rec["topic"]), "error": str(rec["error"]), "raw": str(rec["raw"])}
            if self._rejects(row["topic"], row["error"], row["raw"]):
                self.stats.dead_letters_shared += 1
                return  # this sink read the record itself and has its own row
        except (orjson.JSONDecodeError, KeyError, TypeError):
            row = {"topic": msg.topic(), "error": "deadletter: not {error, topic, raw}",
                   "raw": value.decode("utf-8", errors="replace")}
        row.update(ts=_msg_ts(msg), key=_text(msg.key()), reporter="deadletter-topic",
                   partition=None, offset=None)
        self._buffer(self.writer.add_dead_letter, row)

    def _rejects(self, topic: str, error: str, raw: str) -> bool:
        """Whether this sink rejects the record another stage dead-lettered: a record of an
        event topic that fails the sink's own checks. A raw text cut by the dead-letter
        encoding (over DEADLETTER_RAW_MAX) is judged by its error: only the shared
        too-large reason is known to be the sink's too."""
        if self.topics.kinds_of(topic) is None:
            return False
        cut = _TRUNCATED.search(raw)
        if cut is not None:
            return error == too_large(int(cut.group(1)))
        _, errors = decode_lenient(raw.encode(), self.topics.kinds_of(topic))
        return bool(errors)

    def _dead(self, topic: str, key: bytes | str | None, error: str, raw: bytes | str,
              partition: int | None, offset: int | None, ts: float) -> None:
        """One rejected record: to the dead-letter topic and the dead_letters table."""
        error = error[:ERROR_LIMIT]
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(client_conf(self.bootstrap, {"linger.ms": 20}))
        self._producer.produce(self.topics.deadletter, encode_deadletter(error, topic, raw),
                               key=key, headers=[(SOURCE_HEADER, SOURCE)])
        self._producer.poll(0)
        self.stats.dead_letters += 1
        raw_text = _cut(raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw)
        self._buffer(self.writer.add_dead_letter, {
            "ts": ts, "topic": topic, "partition": partition, "offset": offset,
            "key": _text(key), "error": error, "raw": raw_text, "reporter": "sink"})

    def _buffer(self, add: Any, row: dict[str, Any]) -> None:
        # Back-pressure: a full buffer is written (and committed) before reading on.
        if not add(row):
            self._ack()
            if not add(row):
                raise StorageError("writer buffer still full after a flush")

    def _flush(self) -> None:
        result = self.writer.flush()
        self._count(result)
        if result.rejected:
            now = time.time()
            for event, error in result.rejected:
                topic = self._kind_topic.get(KIND_TABLE.get(event.get("kind", ""), ""), "")
                self._dead(topic, None, error, orjson.dumps(event), None, None, now)
            self._count(self.writer.flush())

    def _count(self, result: WriteResult) -> None:
        self.stats.rows += result.rows
        self.stats.events += result.events - result.tables.get("dead_letters", 0)

    def _ack(self, final: bool = False) -> None:
        """Write the buffer (retrying with backoff while ClickHouse fails; once stopping,
        three tries then StorageError), deliver the dead letters, then commit
        the offsets the batch covers."""
        backoff, attempts = 0.2, 0
        while True:
            try:
                self._flush()
                break
            except StorageError as exc:
                attempts += 1
                self.stats.write_errors += 1
                self.stats.failing_writes = attempts
                if self._stopping() and attempts >= 3:
                    raise
                log.warning("ClickHouse write failed (retrying in %.1f s): %s", backoff, exc)
                if self._stopping() or final:
                    time.sleep(backoff)
                else:
                    self._stop.wait(backoff)
                backoff = min(backoff * 2, self.retry_max_s)
        self.stats.failing_writes = 0
        if self._producer is not None and self._producer.flush(10.0):
            raise StorageError("dead letters not delivered to Kafka; offsets not committed")
        self._commit()

    def _stopping(self) -> bool:
        return self._stop.is_set() or (
            self._deadline is not None and time.monotonic() >= self._deadline)

    def _commit(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        if not self._offsets:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._offsets.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
            self.stats.commits += 1
            self._offsets.clear()
        except KafkaException as exc:
            # e.g. a rebalance took the partitions: the new owner re-reads, rows are idempotent
            log.warning("offset commit failed (records may be written again): %s", exc)


def _msg_ts(msg: Any) -> float:
    kind, ms = msg.timestamp()
    return ms / 1000.0 if kind and ms > 0 else time.time()


def _text(value: bytes | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", errors="replace")


def _cut(text: str) -> str:
    """A dead letter's raw text in the table, cut as on the dead-letter topic."""
    size = len(text.encode("utf-8", errors="replace"))
    if size <= DEADLETTER_RAW_MAX:
        return text
    return text[:DEADLETTER_RAW_MAX] + f"... [truncated: {size} bytes]"
