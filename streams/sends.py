"""No send of the worker is lost without the worker knowing (issue 17).

faust's ``topic.send()`` returns once a record is *queued*; when the broker later refuses it
(after a broker restart Tansu answers "Unknown broker error" for a while), faust only logs a
WARNING (``_on_published error``) and drops the record, and the next commit acknowledges
the input it came from: measured ~239 internal.job records lost in one broker restart.
And a send to a topic that vanished (an in-memory broker restarted) waits for its metadata
for faust's 20-minute request timeout, a worker that looks alive and does nothing.

``Sends`` wraps the worker's output topics (``track``) and keeps every send's delivery
future until the broker has acknowledged it:

- a send that fails makes the worker fail loudly at once (one ERROR line naming the topic
  and the error, exit 70): nothing that the failed record carried is acknowledged, so
  the restarted worker reads it again from the committed offsets (at-least-once; the job
  stage's de-duplication and the incident history make the replay exact);
- ``confirm()`` waits until every send so far is acknowledged and raises ``SendLost`` if
  one failed. The route stage calls it at the end of each batch, before faust acks the
  batch's input (``take_events`` acks after the loop body); the snapshot store calls
  ``barrier()`` before it writes a snapshot, because a snapshot acks the job topic up to
  its offsets and records the incidents it emitted as emitted;
- ``TopicWatch`` (a daemon thread) watches the worker's topics (internal and input) by
  their ids (the internal topics decide: an input topic recreated alone is read again by
  faust's own rebalance) with ``schema.kafka_security.TopicIdWatch``, the watcher of the sink and the
  notifier too: every second, and after each offset commit of the worker. An in-memory
  broker restarted without its data has none of them, or has them auto-created by the
  first client that asked for their metadata (Tansu does that, with no retention); a
  topic deleted and recreated has a new id. Then (once): no commit of the worker goes out
  any more; the internal topics are made the worker's again (created, or recreated with
  its partitions, or given its retention); the start of each lost topic's partition the
  worker has assigned is committed, through the worker's own consumer; and the worker
  exits (code 70) so that its supervisor starts it afresh: its partitions' state and
  positions referred to topics that no longer exist. The committed start is what closes
  the race of a worker that rejoined the new broker's group before the watch noticed
  (aiokafka rejoins ~1 s after the restart; Tansu then takes any offset the member
  commits, measured): an input record fetched before the restart and acknowledged after
  the rejoin commits its old, high offset there, and the next worker would skip the new
  topic's first records. The commit checked right after it lands, or the watch a second
  later, overwrites it with the start before the worker exits. At start the topics'
  partitions are checked (and a retention missing, as on a topic Tansu auto-created, is
  set); later only an id change counts, so an operator's retention change is left alone.
  While the broker is unreachable the check is skipped (the clients wait for it and the
  stop deadline bounds a SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from failslow.schema.kafka_security import TopicIdWatch, client_conf
from failslow.streams import StreamsError, quiet

log = logging.getLogger("failslow.worker")
LOST_EXIT = 70  # streams.app.CRASH_EXIT: a supervisor restarts the worker
WATCH_ENV = "FAILSLOW_TOPIC_WATCH_S"  # seconds between two topic checks (tests slow it)


class SendLost(StreamsError):
    """A record the worker sent was not acknowledged by the broker."""


def die(why: str, exit_code: int = LOST_EXIT) -> None:
    """One ERROR line, then exit at once: no later commit or snapshot may ack anything."""
    log.error("%s; exiting so the worker restarts from its committed offsets "
              "(nothing acknowledged is lost)", why)
    logging.shutdown()
    os._exit(exit_code)


class Sends:
    """Every send of the worker, kept until the broker acknowledges it (see module doc)."""

    def __init__(self, on_lost: Callable[[str], None] = die) -> None:
        self.on_lost = on_lost
        self.failed: str | None = None
        self.sent = 0
        self._pending: set[asyncio.Future] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def track(self, topic: Any) -> TrackedTopic:
        """``topic`` (a faust topic) whose sends are tracked here."""
        return TrackedTopic(topic, self)

    async def send(self, topic: Any, **kwargs: Any) -> Any:
        if self.failed is not None:
            raise SendLost(self.failed)
        self._loop = self._loop or asyncio.get_running_loop()
        fut = await topic.send(**kwargs)
        self.sent += 1
        if isinstance(fut, asyncio.Future):
            if fut.done():
                self._settled(topic.get_topic_name(), fut)
            else:
                self._pending.add(fut)
                fut.add_done_callback(partial(self._settled, topic.get_topic_name()))
        return fut

    def _settled(self, name: str, fut: asyncio.Future) -> None:
        self._pending.discard(fut)
        exc = (asyncio.CancelledError() if fut.cancelled() else fut.exception())
        if exc is not None and self.failed is None:
            self.failed = f"a record sent to {name} was not delivered ({exc!r})"
            self.on_lost(self.failed)

    @property
    def pending(self) -> int:
        """Sends not yet acknowledged."""
        return len(self._pending)

    async def confirm(self) -> None:
        """Return once every send so far is acknowledged; ``SendLost`` if one failed."""
        while self._pending and self.failed is None:
            await asyncio.wait(list(self._pending))
        if self.failed is not None:
            raise SendLost(self.failed)

    def barrier(self) -> None:
        """``confirm()`` from another thread (the snapshot writer's): blocks until every
        send made before the call is acknowledged; ``SendLost`` if one failed."""
        loop = self._loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if loop is None or not loop.is_running() or on_loop:  # on_loop: cannot block it
            if self.failed is not None:
                raise SendLost(self.failed)
            return
        asyncio.run_coroutine_threadsafe(self.confirm(), loop).result()


class TrackedTopic:
    """A faust topic whose ``send`` goes through ``Sends`` (what ``Outputs`` calls)."""

    def __init__(self, topic: Any, sends: Sends) -> None:
        self.topic = topic
        self.sends = sends

    async def send(self, **kwargs: Any) -> Any:
        return await self.sends.send(self.topic, **kwargs)

    def get_topic_name(self) -> str:
        return str(self.topic.get_topic_name())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.topic, name)


# -- the internal topics ---------------------------------------------------------------------

def internal_topics_wrong(admin: AdminClient, configs: dict[str, dict[str, str]],
                          partitions: int, timeout: float = 5.0,
                          strict: bool = True) -> dict[str, str]:
    """Internal topic -> what is wrong with it (missing; other partition count; not the
    retention the worker set, i.e. created by someone else); {} when all are right.
    ``strict`` False (a topic whose id the worker has not seen change): only a retention
    missing altogether counts, a value another than the worker's may be an operator's.
    Raises ``KafkaException`` when the broker does not answer."""
    meta = admin.list_topics(timeout=timeout)
    wrong: dict[str, str] = {}
    present = []
    for name in configs:
        t = meta.topics.get(name)
        if t is None or t.error is not None:
            wrong[name] = "missing"
        elif len(t.partitions) != partitions:
            wrong[name] = f"{len(t.partitions)} partitions, not {partitions}"
        else:
            present.append(name)
    if present:
        res = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in present]
        for r, fut in admin.describe_configs(res, request_timeout=timeout).items():
            got = fut.result()
            want = configs[r.name].get("retention.ms")
            have = got.get("retention.ms")
            # A retention set on the topic is the worker's or an operator's (docs/streams.md
            # says how to change it). None (Tansu), or the broker's default where it is not
            # ours (Kafka), means someone else created it: a broker auto-creates a topic a
            # client asks about. (Tansu calls every value a default.)
            foreign = have is None or (strict and have.is_default and have.value != want)
            if want is not None and foreign:
                wrong[r.name] = (f"retention.ms {have.value if have else None}, not {want} "
                                 "(not created by a worker)")
    return wrong


def recreate(admin: AdminClient, configs: dict[str, dict[str, str]], partitions: int,
             wrong: dict[str, str], timeout: float = 10.0) -> None:
    """Make the ``wrong`` internal topics the worker's again: a missing one is created, one
    with other partitions is deleted and created, one with other settings gets the
    worker's (each step tolerates a concurrent worker doing the same)."""
    names = list(wrong)
    drop = [n for n in names if "partitions" in wrong[n]]
    if drop:
        for fut in admin.delete_topics(drop, operation_timeout=timeout).values():
            try:
                fut.result()
            except KafkaException as exc:
                if "UNKNOWN_TOPIC" not in str(exc):
                    raise
        time.sleep(0.5)
    create = [n for n in names if wrong[n] == "missing" or n in drop]
    if create:
        new = [NewTopic(n, num_partitions=partitions, replication_factor=1, config=configs[n])
               for n in create]
        for fut in admin.create_topics(new, operation_timeout=timeout).values():
            try:
                fut.result()
            except KafkaException as exc:
                if "already exists" not in str(exc).lower() and "TOPIC_ALREADY" not in str(exc):
                    raise
    alter = [n for n in names if n not in create]
    if alter:
        res = [ConfigResource(ConfigResource.Type.TOPIC, n, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs[n].items()]) for n in alter]
        for fut in admin.incremental_alter_configs(res, request_timeout=timeout).values():
            fut.result()


class TopicWatch(threading.Thread):
    """Every ``interval_s``, and after each commit of the consumer given to ``guard``: are
    the worker's internal topics (``configs``) still the ones it works with? If not (the
    broker lost them): no more commits, the internal topics repaired, the start of every
    lost topic (internal, and ``inputs`` whose id changed too) committed, ``on_lost``
    (default: exit 70). See the module doc."""

    def __init__(self, bootstrap: str, configs: dict[str, dict[str, str]], partitions: int,
                 interval_s: float | None = None, on_lost: Callable[[str], None] = die,
                 inputs: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__(name="failslow-topicwatch", daemon=True)
        self.bootstrap = bootstrap
        self.configs = configs
        self.partitions = partitions
        self.interval_s = interval_s or float(os.environ.get(WATCH_ENV, "1.0"))
        self.on_lost = on_lost
        self.ids = TopicIdWatch(bootstrap, [*configs, *inputs], log, timeout_s=2.0,
                                extra={"logger": quiet.RDKAFKA_LOG})
        self.frozen = False         # a loss was noticed: no commit goes out any more
        self.checks = 0
        self._stopping = threading.Event()  # not _stop: Thread.join() calls its own _stop()
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._check_lock = threading.Lock()   # the thread and a commit's check: one at a time
        self._reported = False
        self._handled = threading.Event()     # set once the loss is handled on the loop
        self._structure_checked = False
        self._consumer: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commit: Callable[[Any], Any] | None = None
        self._inflight = 0
        with contextlib.suppress(Exception):
            self._lost_now()  # learn the ids now, before the worker consumes anything

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(client_conf(self.bootstrap, {"logger": quiet.RDKAFKA_LOG}))
        return self._admin

    def _lost_now(self) -> dict[str, str] | None:
        with self._lock:
            return self.ids.lost()

    def check(self) -> tuple[str, list[str]] | None:
        """One check: (what was wrong, the lost topics) or None (all fine, no broker, or
        a loss already being handled). Repairs the internal topics when needed."""
        with self._check_lock:
            return None if self.frozen else self._check()

    def _check(self) -> tuple[str, list[str]] | None:
        try:
            lost = self._lost_now()
        finally:
            self.checks += 1
        if lost is None:
            return None  # unreachable: nothing to decide now
        if not any(n in self.configs for n in lost):
            # an input topic recreated alone: faust's rebalance on the metadata change reads
            # it from its start (measured: the same incidents, no restart); its loss counts
            # with the internal topics' (a broker restart), when their start is committed
            lost = {}
        if lost or not self._structure_checked:
            try:
                wrong = internal_topics_wrong(self._admin_client(), self.configs,
                                              self.partitions, strict=bool(lost))
            except KafkaException:
                return None
            self._structure_checked = True
        else:
            wrong = {}
        if not lost and wrong and all(w.startswith("retention") for w in wrong.values()):
            # a topic without a retention (auto-created): set it, nothing else to do
            with contextlib.suppress(KafkaException):
                recreate(self._admin_client(), self.configs, self.partitions, wrong)
                log.warning("internal topics had no retention (%s): set the worker's",
                            ", ".join(sorted(wrong)))
            return None
        if not lost and not wrong:
            return None
        what = "; ".join(f"{n}: {w}" for n, w in sorted({**wrong, **lost}.items()))
        try:
            recreate(self._admin_client(), self.configs, self.partitions, wrong)
            done = "internal topics made the worker's again" if wrong else "nothing to recreate"
        except KafkaException as exc:
            done = f"recreating the internal topics failed ({exc}); the next worker tries again"
        return (f"the broker lost the worker's topics ({what}): {done}",
                sorted(set(lost) | set(wrong)))

    # -- commits ----------------------------------------------------------------------------

    def guard(self, consumer: Any) -> None:
        """Route the faust consumer's offset commits (``consumer._commit``, what every
        commit of faust goes through) through this watch, on the running loop: none once a
        loss was noticed, and the topics checked after each one that went out."""
        self._consumer = consumer
        self._loop = asyncio.get_running_loop()
        original = consumer._commit
        self._commit = original

        async def commit(offsets: Any) -> bool:
            if self.frozen:
                return False
            self._inflight += 1
            try:
                ok = bool(await original(offsets))
            finally:
                self._inflight -= 1
            if ok and not self.frozen:
                found = await asyncio.get_running_loop().run_in_executor(None, self.check)
                if found is not None:
                    await self._lose(*found)
            return ok

        consumer._commit = commit

    async def _lose(self, why: str, topics: list[str]) -> None:
        """On the loop: freeze commits, commit the lost topics' start, ``on_lost``."""
        if self.frozen:
            return
        self.frozen = True
        reset = await self._reset(topics)
        self._handled.set()
        self._report(f"{why}; {reset}")

    def _report(self, why: str) -> None:
        if not self._reported:
            self._reported = True
            self.on_lost(why)

    async def _reset(self, topics: list[str]) -> str:
        """Commit the start of each assigned partition of ``topics`` through the worker's
        own consumer (a commit of it in flight may carry an old offset: it goes first)."""
        consumer, commit = self._consumer, self._commit
        if consumer is None or commit is None:
            return "no consumer to reset"
        for _ in range(100):
            if not self._inflight:
                break
            await asyncio.sleep(0.05)
        lost = set(topics)
        tps = [tp for tp in consumer.assignment() if tp.topic in lost]
        if not tps:
            return "none of their partitions assigned here"
        starts = await asyncio.get_running_loop().run_in_executor(None, self._starts, tps)
        try:
            ok = bool(await asyncio.wait_for(commit(starts), 10.0))
        except Exception as exc:  # noqa: BLE001 - not a member of the new group: nothing went there
            return f"their start not committed ({exc!r})"
        return (f"their start committed for {len(tps)} assigned partition(s)" if ok
                else "their start not committed (not a member of the group there)")

    def _starts(self, tps: list[Any]) -> dict[Any, int]:
        """tp -> its partition's first offset now (0 when the broker does not say)."""
        starts = {tp: 0 for tp in tps}
        try:
            futs = self._admin_client().list_offsets(
                {TopicPartition(tp.topic, tp.partition): OffsetSpec.earliest() for tp in tps},
                request_timeout=5)
            by_key = {(tp.topic, tp.partition): tp for tp in tps}
            for ctp, fut in futs.items():
                with contextlib.suppress(Exception):
                    starts[by_key[(ctp.topic, ctp.partition)]] = max(0, fut.result(6).offset)
        except Exception:  # noqa: BLE001, S110 - 0 then
            pass
        return starts

    # -- the thread -------------------------------------------------------------------------

    def run(self) -> None:
        warned = False
        while not self._stopping.wait(self.interval_s):
            try:
                found = self.check()
            except Exception as exc:  # not a verdict on the topics: say so once, go on
                if not warned:
                    log.warning("the topics check failed (%r); it goes on", exc)
                    warned = True
                continue
            if found is None or self._stopping.is_set():
                continue
            loop = self._loop
            if loop is not None and loop.is_running():
                fut = asyncio.run_coroutine_threadsafe(self._lose(*found), loop)
                with contextlib.suppress(Exception):
                    fut.result(timeout=20.0)
                self._handled.wait(20.0)  # a commit's check may be handling it already
            self.frozen = True
            self._report(found[0])  # the loop did not (it is blocked, or there is none)

    def stop(self) -> None:
        self._stopping.set()
