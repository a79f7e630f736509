"""The notify loop: ``<prefix>incidents`` -> router -> outbox -> endpoints.

Per polled batch: decode leniently (bad records go to ``<prefix>deadletter``
with the reason), route, write notifications and de-duplication state to the
outbox in one transaction, make sure the dead letters reached the broker, and
only then commit the consumed offsets. Delivery runs from the outbox, so an
endpoint that is down delays its notifications but never loses one, and a
restart resumes where the last one stopped.

Run it in a thread (the demo) or in the foreground (``failslow notify``)::

    svc = NotifyService(bootstrap, Topics("failslow."), notifiers, state_dir)
    svc.run(stop_event)     # returns after stop_event is set: outbox flushed, offsets committed
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer

from failslow.alerting.base import Notifier
from failslow.alerting.dispatch import Backoff, Dispatcher
from failslow.alerting.outbox import Outbox
from failslow.alerting.router import Policy, Router
from failslow.schema import Topics, decode_lenient, encode_deadletter
from failslow.schema.kafka_security import TopicIdWatch, client_conf, group_consumer_conf

log = logging.getLogger("failslow.alerting")

OUTBOX_FILE = "notify.sqlite"
# Resolved incidents are remembered this long (s) so a replayed resolve stays silent.
RESOLVED_RETENTION_S = 7 * 24 * 3600.0
PRUNE_EVERY_S = 3600.0


class NotifyService:
    """Consumes incidents with confluent-kafka and delivers notifications durably.

    ``state_dir`` holds ``notify.sqlite`` (outbox + de-duplication state).
    ``stats`` counts consumed messages, incidents, dead letters, notifications
    queued / delivered / retried / rejected, and rate-limited ones.
    """

    def __init__(self, bootstrap: str, topics: Topics, notifiers: Mapping[str, Notifier],
                 state_dir: Path, policy: Policy | None = None,
                 group_id: str = "failslow-notify", offset_reset: str = "earliest",
                 backoff: Backoff | None = None, poll_timeout_s: float = 0.2,
                 flush_timeout_s: float = 5.0, clock: Callable[[], float] = time.time,
                 kafka_config: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.notifiers = dict(notifiers)
        self.state_dir = Path(state_dir)
        self.policy = policy or Policy()
        self.group_id = group_id
        self.offset_reset = offset_reset
        self.backoff = backoff
        self.poll_timeout_s = poll_timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.clock = clock
        self.kafka_config = dict(kafka_config or {})
        self.stats: Counter[str] = Counter()
        self.ready = threading.Event()
        self._positions: dict[tuple[str, int], int] = {}  # next offset, per partition read

    def _consumer_config(self) -> dict[str, Any]:
        return group_consumer_conf(self.bootstrap, self.group_id, {
            "auto.offset.reset": self.offset_reset, **self.kafka_config})

    def run(self, stop: threading.Event) -> None:
        """Consume and deliver until ``stop`` is set; then deliver what is due for up to
        ``flush_timeout_s`` seconds, commit, and close. What is still undelivered stays
        in the outbox for the next run."""
        outbox = Outbox(self.state_dir / OUTBOX_FILE)
        router = Router(self.policy, self.notifiers, outbox.load_incidents())
        dispatcher = Dispatcher(outbox, self.notifiers, self.backoff, clock=self.clock)
        consumer = Consumer(self._consumer_config())
        producer = Producer(client_conf(self.bootstrap, {"linger.ms": 5}))
        consumer.subscribe([self.topics.for_kind("incident")])
        # A broker that lost the topic (Tansu restarted without its data) leaves the consumer
        # beyond the new topic's end: read it from its start (issue 17). Replayed incidents
        # stay silent: the router remembers what it notified (outbox state).
        watch = TopicIdWatch(self.bootstrap, [self.topics.for_kind("incident")], log)
        self._positions.clear()
        pending = outbox.pending()
        if pending:
            log.info("outbox holds %d undelivered notification(s) from a previous run", pending)
        self.ready.set()
        last_prune = self.clock()
        try:
            while not stop.is_set():
                watch.check(consumer, self._positions)
                # consume() would wait out its whole timeout for a full batch; wait for
                # the first record only, then take whatever else is already fetched.
                first = consumer.poll(self.poll_timeout_s)
                if first is not None:
                    msgs = [first, *consumer.consume(num_messages=499, timeout=0)]
                    self._handle(msgs, router, outbox, producer, consumer, stop)
                now = self.clock()
                self._queue(outbox, router, router.summaries(now), now)
                if now - last_prune > PRUNE_EVERY_S:
                    outbox.record([], {}, now, forget=router.prune(now - RESOLVED_RETENTION_S))
                    last_prune = now
                dispatcher.drain(budget_s=2.0)
                self._sync_stats(dispatcher, router, outbox)
        finally:
            dispatcher.drain(budget_s=self.flush_timeout_s)
            self._sync_stats(dispatcher, router, outbox)
            producer.flush(self.flush_timeout_s)
            consumer.close()
            dispatcher.shutdown()
            outbox.close()
            if self.stats["outbox_pending"]:
                log.warning("%d notification(s) left in the outbox for the next run",
                            self.stats["outbox_pending"])

    def _handle(self, msgs: list, router: Router, outbox: Outbox, producer: Any,
                consumer: Any, stop: threading.Event) -> None:
        now = self.clock()
        notes = []
        dead = 0
        for msg in msgs:
            if msg.error():
                # Partition EOF and transient broker errors: librdkafka retries by itself.
                log.debug("consumer: %s", msg.error())
                continue
            self.stats["consumed"] += 1
            self._positions[(msg.topic(), msg.partition())] = msg.offset() + 1
            value = msg.value()
            events, errors = decode_lenient(value) if value else ([], ["value: empty"])
            for ev in events:
                if ev["kind"] != "incident":
                    errors.append(f"event.kind: {ev['kind']!r} on the incidents topic")
                    continue
                self.stats["incidents"] += 1
                notes.extend(router.decide(ev, now))
            for error in errors:
                producer.produce(self.topics.deadletter, key=msg.key(),
                                 value=encode_deadletter(error, msg.topic(), value))
                dead += 1
        self._queue(outbox, router, notes, now)
        if dead:
            self.stats["deadletters"] += dead
            log.warning("%d bad record(s) sent to %s", dead, self.topics.deadletter)
            while producer.flush(1.0):
                if stop.is_set():
                    # Uncommitted, the bad records come back to the next run rather than vanish.
                    return
                log.warning("waiting for %s to acknowledge dead letters", self.topics.deadletter)
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:
            # E.g. during a rebalance: the records come back and the router, which has
            # already seen them, stays silent about them.
            log.warning("offset commit failed: %s", exc)

    def _queue(self, outbox: Outbox, router: Router, notes: list, now: float) -> None:
        states = router.take_dirty()
        if outbox.record(notes, states, now):
            self.stats["queued"] += len(notes)

    def _sync_stats(self, dispatcher: Dispatcher, router: Router, outbox: Outbox) -> None:
        for k, v in dispatcher.stats.items():
            self.stats[k] = v
        self.stats["suppressed"] = router.suppressed_total
        self.stats["outbox_pending"] = outbox.pending()
