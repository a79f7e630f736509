"""Issue 17: one watcher for "the broker lost my topics" (``kafka_security.TopicIdWatch``),
used by the sink, the notifier and the worker (``streams.sends.TopicWatch``), on a real
Tansu restarted without its data (kill -9, same port).

The worker's race: aiokafka rejoins the restarted broker's group about a second after
the restart, and Tansu then takes any offset the rejoined member commits. An input record
fetched before the restart and acknowledged after the rejoin would commit its old, high
offset to the new, empty topic, and the next worker (the watch makes this one exit) would
skip the new topic's records below it. The worker's commits go through the watch: the
first one that lands on a broker that lost the topics is followed at once by the start
of every lost partition, through the same consumer, and no other commit goes out."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from failslow.schema.kafka_security import TopicIdWatch
from failslow.stack import free_port, start_broker
from failslow.streams.sends import TopicWatch

pytestmark = pytest.mark.integration


def _create(bootstrap: str, names: list[str], partitions: int = 2,
            config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(n, num_partitions=partitions, replication_factor=1, config=config or {})
           for n in names]
    for fut in admin.create_topics(new, operation_timeout=10).values():
        fut.result()


def _restart(b, port: int, tmp_path):
    b.proc.kill()
    b.proc.wait()
    return start_broker(port, log_path=tmp_path / "tansu.log")


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, fmt: str, *args: object) -> None:
        self.lines.append(fmt % args)

    def debug(self, fmt: str, *args: object) -> None:
        pass


def test_topic_ids_tell_a_recreated_and_a_missing_topic_and_nothing_while_down(tmp_path):
    port = free_port()
    b = start_broker(port, log_path=tmp_path / "tansu.log")
    try:
        _create(b.bootstrap, ["w.a", "w.b"])
        watch = TopicIdWatch(b.bootstrap, ["w.a", "w.b", "w.later"], Log())
        assert watch.lost() == {}                       # ids learnt; w.later not there yet
        assert set(watch.learnt()) == {"w.a", "w.b"}
        b = _restart(b, port, tmp_path)
        _create(b.bootstrap, ["w.a", "w.later"])        # w.a recreated, w.b gone
        lost = watch.lost()
        assert lost is not None
        assert set(lost) == {"w.a", "w.b"}
        assert lost == {"w.a": "recreated", "w.b": "missing"}
        assert "w.later" in watch.learnt()              # first seen now: learnt, not lost
        watch.forget("w.a")
        assert set(watch.lost() or {}) == {"w.b"}       # w.a's new id learnt
        b.stop(1)
        assert watch.lost() is None                     # no broker: nothing decided
    finally:
        b.stop(1)


class AioConsumer:
    """What the watch sees of faust's consumer: ``assignment()`` and ``_commit(offsets)``
    (True when committed, False when the group rebalanced, as faust's aiokafka driver)."""

    def __init__(self, aio) -> None:
        self.aio = aio
        self.landed: list[dict] = []

    def assignment(self) -> set:
        return set(self.aio.assignment())

    async def _commit(self, offsets: dict) -> bool:
        from aiokafka.errors import CommitFailedError

        try:
            await self.aio.commit(dict(offsets))
        except CommitFailedError:
            return False
        self.landed.append({(tp.topic, tp.partition): o for tp, o in offsets.items()})
        return True


def _committed(bootstrap: str, group: str, topic: str, partitions: int = 2) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in got]
    finally:
        c.close()


def test_an_old_offset_committed_after_the_rejoin_is_overwritten_by_the_start(tmp_path):
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as ATP

    port = free_port()
    b = start_broker(port, log_path=tmp_path / "tansu.log")
    internal = {"w.internal.job": {"cleanup.policy": "delete", "retention.ms": "3600000"}}
    lost: list[str] = []
    group = "w.g"

    async def scenario() -> tuple[bool, bool, AioConsumer]:
        nonlocal b
        aio = AIOKafkaConsumer("w.steps", bootstrap_servers=b.bootstrap, group_id=group,
                               session_timeout_ms=6000, heartbeat_interval_ms=300,
                               enable_auto_commit=False, retry_backoff_ms=100)
        await aio.start()
        try:
            for _ in range(100):
                if aio.assignment():
                    break
                await asyncio.sleep(0.2)
            consumer = AioConsumer(aio)
            watch.guard(consumer)
            steps0 = ATP("w.steps", 0)
            assert await consumer._commit({steps0: 500})     # the topics are the worker's
            b = _restart(b, port, tmp_path)
            _create(b.bootstrap, ["w.steps"])                  # what an operator (`up`) does
            # the old offset of a record acknowledged after the restart: refused until the
            # consumer rejoined the new broker's group, then Tansu takes it
            landed_old = False
            deadline = time.monotonic() + 60
            while not lost and time.monotonic() < deadline:
                landed_old = await consumer._commit({steps0: 900}) or landed_old
                await asyncio.sleep(0.3)
            after = await consumer._commit({steps0: 950})     # nothing goes out any more
            return landed_old, after, consumer
        finally:
            await aio.stop()

    try:
        _create(b.bootstrap, ["w.steps"])
        _create(b.bootstrap, list(internal), config=internal["w.internal.job"])
        watch = TopicWatch(b.bootstrap, internal, 2, on_lost=lost.append, inputs=["w.steps"])
        landed_old, after, consumer = asyncio.run(scenario())
        committed = _committed(b.bootstrap, group, "w.steps")
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        meta = admin.list_topics(timeout=5)
        job = meta.topics.get("w.internal.job")
        res = ConfigResource(ConfigResource.Type.TOPIC, "w.internal.job")
        retention = admin.describe_configs([res])[res].result().get("retention.ms")
    finally:
        b.stop(1)
    assert landed_old, "the rejoined consumer's old offset should reach the new broker"
    assert consumer.landed[-2] == {("w.steps", 0): 900}
    assert consumer.landed[-1] == {("w.steps", 0): 0, ("w.steps", 1): 0}
    assert committed == [0, 0], f"the next worker would start at {committed}"
    assert after is False and watch.frozen
    assert len(lost) == 1
    assert "the broker lost the worker's topics" in lost[0]
    assert "w.steps: recreated" in lost[0] and "w.internal.job" in lost[0]
    assert "start committed for 2 assigned partition(s)" in lost[0]
    assert job is not None and len(job.partitions) == 2                # made the worker's again
    assert retention is not None and retention.value == "3600000"
