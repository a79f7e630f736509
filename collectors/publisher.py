"""The Kafka publisher every producer of failslow events uses (collectors, hook, simulator, replay).

``publish(events)`` groups events per (topic, key) of CONTRACT.md into JSON
array messages of at most ``batch_events`` events and ``max_message_bytes`` bytes
(``schema.limits.MESSAGE_MAX_BYTES``, the limit the worker and the sink apply too) and
hands them to librdkafka (compressed, lingered). An event that alone is larger goes to
the dead-letter topic instead, with the reason (``stats["too_large"]``), and a message
librdkafka refuses is counted as failed: ``publish`` never raises for what it is given. One background thread serves the delivery
callbacks; it is the only thread that polls the producer, so delivery reports
are seen in the order librdkafka emits them (per partition: produce order).

With a ``spool_dir`` nothing handed to ``publish`` is lost to a broker outage:

* direct mode: messages go straight to librdkafka. The first failed delivery
  (``delivery_timeout_s`` without an answer from the broker) switches to
  spooling: the messages still queued in librdkafka are purged so they fail in
  order behind it, and every failed message is written to the spool.
* spooling mode: new messages wait in memory until librdkafka has settled the
  ones it holds, then go to the spool tail, so the spool keeps produce order.
  The background thread replays the spool from its head, a window at a time,
  and removes a record only once the broker acknowledged it; a failed window
  backs off and is tried again. An empty spool switches back to direct mode.
* the spool is bounded (``spool_max_bytes``): when full, the oldest messages
  are dropped, counted in ``stats["dropped"]`` and logged.
* ``close()`` flushes; what is still undelivered then is spooled to disk and
  replayed by the next Publisher started on the same directory.

Without a spool, failed deliveries are counted in ``stats["failed"]`` and logged.

>>> pub = Publisher("127.0.0.1:9092")        # doctest: +SKIP
>>> pub.publish([{"v": 1, "kind": "host", "ts": 1.0, "host": "h0"}])   # doctest: +SKIP
>>> pub.close()                              # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from failslow.collectors.spool import Record, Spool
from failslow.schema import Topics, encode_deadletter
from failslow.schema.errors import FailslowError
from failslow.schema.events import Event
from failslow.schema.kafka_security import client_conf
from failslow.schema.limits import MESSAGE_MAX_BYTES, pack_messages
from failslow.schema.topics import key_for

log = logging.getLogger(__name__)

_REPLAY_WINDOW = 256  # spool records replayed per round trip
_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # waits between failed replay windows
_SPOOL_RETRY_S = 30.0  # after a failed spool write, how long publishing bypasses the spool


class PublisherError(FailslowError):
    """The publisher was misconfigured or used after close()."""


class Publisher:
    """Batching, compressing, spooling Kafka producer for CONTRACT.md events.

    bootstrap: Kafka bootstrap servers. topics: topic names (prefix).
    spool_dir: folder of the on-disk spool (None: no spool, failures are counted).
    compression: librdkafka codec (``lz4``, ``zstd``, ``gzip``, ``snappy``, ``none``).
    linger_ms: librdkafka linger, milliseconds. batch_events: most events in one message.
    max_message_bytes: most bytes in one message value (an event alone larger than that is
    dead-lettered).
    delivery_timeout_s: how long librdkafka retries a message before it fails (and spools).
    spool_max_bytes: size bound of the spool, bytes. config: extra librdkafka settings.
    spool_fsync: when spooled messages are forced to disk (``collectors.spool``: always,
    interval, never). A spool that cannot be written (full disk, read-only folder) is
    said once in the log; publishing goes on live, and what could not be spooled while
    the broker is down is counted in ``failed``.
    """

    def __init__(self, bootstrap: str, topics: Topics | None = None,
                 spool_dir: str | None = None, compression: str = "lz4",
                 linger_ms: float = 20, batch_events: int = 500,
                 delivery_timeout_s: float = 15.0, spool_max_bytes: int = 256 << 20,
                 config: dict[str, Any] | None = None, spool_fsync: str = "interval",
                 max_message_bytes: int = MESSAGE_MAX_BYTES) -> None:
        if batch_events < 1:
            raise PublisherError(f"batch_events must be >= 1, not {batch_events}")
        if max_message_bytes < 1024:
            raise PublisherError(f"max_message_bytes must be >= 1024, not {max_message_bytes}")
        self.topics = topics or Topics()
        self.batch_events = batch_events
        self.max_message_bytes = max_message_bytes
        conf: dict[str, Any] = client_conf(bootstrap, {
            "compression.type": compression,
            "linger.ms": linger_ms,
            "message.timeout.ms": int(delivery_timeout_s * 1000),
            # One request in flight per connection keeps retries in produce order without
            # the idempotent producer, whose producer id a restarted broker does not know.
            "max.in.flight.requests.per.connection": 1,
            "enable.idempotence": False,
            "acks": "all",
            "socket.keepalive.enable": True,
            "reconnect.backoff.max.ms": 1000,
            "error_cb": self._on_error,
            # librdkafka's own info lines repeat every reconnect while a broker is down;
            # error_cb reports each new problem once instead.
            "log_level": 4,
        })
        conf.update(config or {})
        try:
            self._producer = Producer(conf)
        except KafkaException as exc:
            raise PublisherError(f"cannot create the Kafka producer: {exc.args[0].str()}") from None
        self._lock = threading.Condition(threading.RLock())
        self._spool: Spool | None = None
        if spool_dir:
            try:
                self._spool = Spool(spool_dir, max_bytes=spool_max_bytes, fsync=spool_fsync)
            except ValueError as exc:
                raise PublisherError(str(exc)) from None
            except OSError as exc:
                log.warning("spool %s is unusable (%s): publishing without a spool", spool_dir,
                            exc.strerror or exc)
        self._spool_error = ""          # the spool's last write error, until one succeeds
        self._spool_retry = 0.0         # when to try the spool again after a failed write
        self._spooling = bool(self._spool and len(self._spool))
        self._held: list[tuple[str, str, bytes, int]] = []
        self._direct_events = 0  # events inside librdkafka sent in direct mode
        self._direct_msgs = 0
        self._purge_due = False
        self._replay_ok: set[tuple[int, int]] = set()
        self._next_replay = 0.0
        self._failures_in_row = 0
        self._last_error: dict[int, str] = {}  # error code -> its last logged problem
        self._closed = False
        self._stats = dict.fromkeys(
            ("published", "produced", "delivered", "failed", "spooled", "dropped",
             "messages_delivered", "replayed", "too_large"), 0)
        if self._spooling:
            log.warning("spool %s holds %d undelivered events from a previous run; replaying",
                        spool_dir, self._spool.events if self._spool else 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="failslow-publisher",
                                        daemon=True)
        self._thread.start()

    # -- public ------------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Counts of events: published (accepted), produced (handed to librdkafka, replays
        included), delivered (acknowledged by the broker), failed (lost: no spool), spooled
        (written to the spool), dropped (evicted from a full spool); plus spool_events (now in
        the spool), spool_bytes (its size on disk), pending (not yet delivered),
        messages_delivered and too_large (events larger than ``max_message_bytes``, sent to
        the dead-letter topic instead: each counts as one event published and delivered)."""
        with self._lock:
            out = dict(self._stats)
            out["spool_events"] = self._spool.events if self._spool else 0
            out["spool_bytes"] = self._spool.size_bytes if self._spool else 0
            out["pending"] = self._pending_events()
            return out

    def publish(self, events: Iterable[Event | Mapping[str, Any]]) -> None:
        """Queue events of any kinds (``schema.events`` records: GpuEvent, CommEvent,
        ...); grouped per (topic, key) into JSON-array messages."""
        groups: dict[tuple[str, str], list[Event | Mapping[str, Any]]] = defaultdict(list)
        for ev in events:
            groups[(self.topics.for_kind(ev["kind"]), key_for(ev))].append(ev)
        n = self.batch_events
        with self._lock:
            if self._closed:
                raise PublisherError("publish() after close()")
            for (topic, key), evs in groups.items():
                for i in range(0, len(evs), n):
                    messages, oversized = pack_messages(evs[i:i + n], self.max_message_bytes)
                    for value, count in messages:
                        self._stats["published"] += count
                        self._route(topic, key, value, count)
                    for value in oversized:
                        self._too_large(topic, key, value)

    def _too_large(self, topic: str, key: str, value: bytes) -> None:
        error = (f"event of {len(value)} bytes is larger than the {self.max_message_bytes}-byte "
                 "message limit: not published")
        self._stats["too_large"] += 1
        self._stats["published"] += 1
        log.warning("%s (topic %s, key %s): sent to %s", error, topic, key,
                    self.topics.deadletter)
        self._route(self.topics.deadletter, key, encode_deadletter(error, topic, value), 1)

    def flush(self, timeout: float = 10.0) -> int:
        """Wait until everything published is delivered, at most ``timeout`` seconds;
        returns the number of events still undelivered (in librdkafka or in the spool)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while (left := self._pending_events()) and time.monotonic() < deadline:
                self._lock.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            return left

    def close(self, timeout: float = 10.0) -> int:
        """Flush for at most ``timeout`` seconds, then stop. Undelivered events go to the
        spool (replayed by the next Publisher on it) or are counted as failed; returns how
        many events were not delivered."""
        with self._lock:
            if self._closed:
                return 0
        left = self.flush(timeout)
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._closed = True
            if self._direct_msgs:
                # Their delivery reports arrive as purge failures: spooled or counted.
                self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._producer.flush(1.0)  # serves the purge reports
        with self._lock:
            self._settle_held()
            left = self._pending_events()
            if self._spool is not None:
                if left:
                    log.warning("closing with %d undelivered events kept in the spool %s",
                                left, self._spool.directory)
                self._spool.close()
        return left

    # -- routing -----------------------------------------------------------------------------

    def _pending_events(self) -> int:
        spooled = self._spool.events if self._spool else 0
        return self._direct_events + spooled + sum(h[3] for h in self._held)

    def _spool_usable(self) -> bool:
        return self._spool is not None and time.monotonic() >= self._spool_retry

    def _route(self, topic: str, key: str, value: bytes, n: int) -> None:
        if not self._spooling or not self._spool_usable():
            self._produce_direct(topic, key, value, n)
        elif self._direct_msgs or self._held:
            self._held.append((topic, key, value, n))
        else:
            self._to_spool(topic, key, value, n)

    def _produce_direct(self, topic: str, key: str, value: bytes, n: int) -> None:
        def report(err: KafkaError | None, _msg: Any) -> None:
            self._on_direct(err, topic, key, value, n)

        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=report)
                break
            except BufferError:
                # librdkafka's queue is full: wait for the serving thread to drain it.
                self._lock.wait(0.05)
            except KafkaException as exc:
                # Refused outright (e.g. a message.max.bytes set below ours): no retry helps.
                self._stats["failed"] += n
                log.error("lost %d events for %s: %s", n, topic, exc.args[0].str())
                return
        self._direct_msgs += 1
        self._direct_events += n
        self._stats["produced"] += n

    def _on_direct(self, err: KafkaError | None, topic: str, key: str, value: bytes,
                   n: int) -> None:
        with self._lock:
            self._direct_msgs -= 1
            self._direct_events -= n
            if err is None:
                self._stats["delivered"] += n
                self._stats["messages_delivered"] += 1
            elif self._spool is not None and self._spool_usable():
                if not self._spooling:
                    log.warning("delivery to %s failed (%s); spooling to %s until the broker "
                                "answers", topic, err.str(), self._spool.directory)
                    self._spooling = True
                    self._purge_due = True
                    self._next_replay = time.monotonic() + _BACKOFF_S[0]
                self._to_spool(topic, key, value, n)
            else:
                self._stats["failed"] += n
                log.error("lost %d events for %s: %s", n, topic, err.str())
            self._lock.notify_all()

    def _to_spool(self, topic: str, key: str, value: bytes, n: int) -> None:
        spool = self._spool
        assert spool is not None
        try:
            dropped = spool.append(topic, key, value, n)
        except OSError as exc:
            self._stats["failed"] += n
            self._spool_retry = time.monotonic() + _SPOOL_RETRY_S
            error = exc.strerror or str(exc)
            if error != self._spool_error:
                self._spool_error = error
                log.warning("spool %s cannot be written (%s): publishing goes on live without "
                            "it; events the broker does not take meanwhile are lost (counted "
                            "as failed)", spool.directory, error)
            return
        self._spool_error = ""
        self._stats["spooled"] += n
        if dropped:
            self._stats["dropped"] += dropped
            log.warning("spool %s is full (%d bytes): dropped the %d oldest events "
                        "(%d dropped so far)", spool.directory, spool.max_bytes,
                        dropped, self._stats["dropped"])

    def _settle_held(self) -> None:
        if self._direct_msgs == 0 and self._held:
            for topic, key, value, n in self._held:
                self._to_spool(topic, key, value, n)
            self._held.clear()

    def _on_error(self, err: KafkaError) -> None:
        # Transport errors repeat while the broker is down: log each new one once, per
        # kind (a refused SASL login repeats every retry, its "(after N ms in state X)"
        # tail differs, alternating with "1/1 brokers are down").
        problem = err.str().split(" (after ")[0]
        if self._last_error.get(err.code()) != problem:
            self._last_error[err.code()] = problem
            log.info("kafka: %s", err.str())

    # -- serving thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)
            with self._lock:
                if self._purge_due:
                    self._purge_due = False
                    self._producer.purge(in_queue=True, in_flight=False, blocking=False)
                if not self._spooling:
                    continue
                self._settle_held()
                if self._direct_msgs or self._held:
                    continue
                assert self._spool is not None
                if not len(self._spool):
                    self._spooling = False
                    log.warning("broker answers again: spool %s drained",
                                self._spool.directory)
                    self._lock.notify_all()
                    continue
                if time.monotonic() < self._next_replay:
                    continue
                window = self._spool.peek(_REPLAY_WINDOW)
            self._replay(window)

    def _replay(self, window: list[Record]) -> None:
        """Produce one window of spooled records; commit the acknowledged prefix."""
        results: dict[tuple[int, int], bool] = {}
        sent = 0
        for rec in window:
            if rec.pos in self._replay_ok:
                continue

            def report(err: KafkaError | None, _msg: Any, pos=rec.pos) -> None:
                results[pos] = err is None

            try:
                self._producer.produce(rec.topic, rec.value, rec.key, on_delivery=report)
            except BufferError:
                break
            sent += 1
            with self._lock:
                self._stats["produced"] += rec.events
        while len(results) < sent and not self._stop.is_set():
            self._producer.poll(0.05)
        with self._lock:
            assert self._spool is not None
            done: list[Record] = []
            for rec in window:
                ok = rec.pos in self._replay_ok or results.get(rec.pos, False)
                if not ok:
                    break
                done.append(rec)
            for rec in window:
                if results.get(rec.pos):
                    self._stats["delivered"] += rec.events
                    self._stats["messages_delivered"] += 1
                    self._stats["replayed"] += rec.events
                    self._replay_ok.add(rec.pos)  # never resent, even if the prefix stalls
            for rec in done:
                self._replay_ok.discard(rec.pos)
            self._spool.commit(done)
            if len(done) < len(window):
                self._failures_in_row += 1
                wait = _BACKOFF_S[min(self._failures_in_row, len(_BACKOFF_S)) - 1]
                self._next_replay = time.monotonic() + wait
            else:
                self._failures_in_row = 0
            self._lock.notify_all()

