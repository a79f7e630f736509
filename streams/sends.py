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
- ``TopicWatch`` (a daemon thread) checks every second that the internal topics are
  still the worker's: present, with the partitions and the retention the worker gave
  them. An in-memory broker restarted without its data has none of them, or has them
  auto-created by the first client that asked for their metadata (Tansu does that, with
  its default partitions and no retention). Then the topics are recreated as the worker
  creates them and the worker exits (code 70) so that its supervisor starts it afresh:
  its partitions' state and offsets referred to topics that no longer exist. (Soon: the
  consumer must not rejoin the new broker's group and commit its old, high positions
  there, which would skip the new topics' first records.) While the broker is
  unreachable the check is skipped (the clients wait for it and the stop deadline
  bounds a SIGTERM).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from schema.kafka_security import client_conf
from streams import StreamsError, quiet

log = logging.getLogger("failslow.worker")
LOST_EXIT = 70  # streams.app.CRASH_EXIT: a supervisor restarts the worker


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
                          partitions: int, timeout: float = 5.0) -> dict[str, str]:
    """Internal topic -> what is wrong with it (missing; other partition count; not the
    retention the worker set, i.e. created by someone else); {} when all are right.
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
            if want is not None and (have is None or (have.is_default and have.value != want)):
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
    """Every ``interval_s``: are the internal topics still the worker's? If not (the broker
    lost them), recreate them and call ``on_lost`` (default: exit 70, see module doc)."""

    def __init__(self, bootstrap: str, configs: dict[str, dict[str, str]], partitions: int,
                 interval_s: float = 1.0, on_lost: Callable[[str], None] = die) -> None:
        super().__init__(name="failslow-topicwatch", daemon=True)
        self.bootstrap = bootstrap
        self.configs = configs
        self.partitions = partitions
        self.interval_s = interval_s
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._admin: AdminClient | None = None
        self.checks = 0

    def check(self) -> str | None:
        """One check; returns what was wrong and repaired (None: all fine or no broker)."""
        if self._admin is None:
            self._admin = AdminClient(client_conf(self.bootstrap, {"logger": quiet.RDKAFKA_LOG}))
        admin = self._admin
        try:
            wrong = internal_topics_wrong(admin, self.configs, self.partitions)
        except KafkaException:
            return None  # unreachable: nothing to decide now
        finally:
            self.checks += 1
        if not wrong:
            return None
        what = "; ".join(f"{n}: {w}" for n, w in sorted(wrong.items()))
        try:
            recreate(admin, self.configs, self.partitions, wrong)
            done = "recreated"
        except KafkaException as exc:
            done = f"recreating them failed ({exc}); the next worker tries again"
        return f"the broker lost the worker's internal topics ({what}): {done}"

    def run(self) -> None:
        warned = False
        while not self._stop.wait(self.interval_s):
            try:
                why = self.check()
            except Exception as exc:  # not a verdict on the topics: say so once, go on
                if not warned:
                    log.warning("the internal-topics check failed (%r); it goes on", exc)
                    warned = True
                continue
            if why is not None and not self._stop.is_set():
                self.on_lost(why)

    def stop(self) -> None:
        self._stop.set()
