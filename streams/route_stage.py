"""The route stage: every input topic -> the job topic's partition(s) of each message.

Step and collective/comm messages carry the job in their key and go on to the job's
home partition as raw bytes (no decode: the cost is per message, not per event), many
input messages packed into one internal message (``routing.pack``). Telemetry, keyed by
host, goes to the home partitions of the jobs on that host (``HostMap``: learned from the
step messages routed here, from GPU samples that name their job and rank, and from the job
stage's announcements, which ``HostMapReader`` reads); telemetry of a host not known yet goes to every partition, so
no partition sees a job's early telemetry late.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition as AioPartition

from failslow.schema import decode_lenient, kafka_security
from failslow.schema.batches import expand_checked, is_batch
from failslow.schema.limits import too_large
from failslow.streams.config import WorkerConfig
from failslow.streams.metrics import Metrics
from failslow.streams.outputs import Outputs
from failslow.streams.routing import (
    PART_MAX_BYTES,
    HostMap,
    home_partition,
    job_of_key,
    split_value,
)
from failslow.streams.sharding import event_shard, shard_of, shard_partition, shard_parts


class HostMapReader(threading.Thread):
    """Reads every partition of the host-map topic from the start, for as long as it runs.

    With aiokafka (faust's client), on its own event loop in this thread, not with a
    librdkafka consumer: librdkafka 2.16.0 (confluent-kafka 2.16.1) kills the process
    (SIGSEGV in its own thread, which blocks every signal, so faulthandler prints
    nothing) when a topic it is fetching is deleted and created again on Tansu: the
    KIP-951 leader update it makes of the Fetch (v16) answer has neither topic id nor
    name (core dump: id 0, name NULL) and ``rd_kafka_metadata_update_op`` looks the NULL
    name up (``strcmp``). Reproduced 4/4 without a broker restart (a reader, the topic
    deleted and created). The worker's topic watch recreates this topic after a broker
    restart lost it (Tansu auto-creates it first, with its own partition count), so the
    worker died of SIGSEGV instead of exiting 70 (the CI failure of
    tests/test_streams_broker_faults.py, ~1 run in 20). aiokafka fetches by name (Fetch
    <= v11): a recreated topic is read from its start again."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, hostmap: HostMap,
                 fetch_wait_ms: int) -> None:
        super().__init__(name="failslow-hostmap", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.hostmap = hostmap
        # the worker's --fetch-wait-ms: Tansu holds every fetch this long, so it is the
        # latency of an announcement, and each fetch costs Python time here (idle, 32
        # partitions: ~18 / 11 / 5 ms CPU a second at 50 / 100 / 500 ms; librdkafka's
        # reader took ~3.6 at 50)
        self.fetch_wait_ms = fetch_wait_ms
        self._stopping = threading.Event()  # not _stop: Thread.join() calls its own _stop()

    def run(self) -> None:
        asyncio.run(self._read())

    async def _read(self) -> None:
        while not self._stopping.is_set():
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                auto_offset_reset="earliest", fetch_max_wait_ms=self.fetch_wait_ms,
                **kafka_security.current().aiokafka())
            try:
                await consumer.start()
                tps = [AioPartition(self.topic, p) for p in range(self.partitions)]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                while not self._stopping.is_set():
                    got = await consumer.getmany(timeout_ms=100, max_records=500)
                    for msgs in got.values():
                        for m in msgs:
                            if m.value:
                                entry = orjson.loads(m.value)
                                self.hostmap.add(entry["host"], entry["partition"], time.time())
            except KafkaError:
                # no broker yet, or an error aiokafka does not retry: read it all again
                # (adding an entry twice is harmless)
                await asyncio.sleep(1.0)
            finally:
                await consumer.stop()

    def stop(self) -> None:
        self._stopping.set()


def job_from_value(value: bytes | None) -> str | None:
    """The first ``job_id`` in a message's value (a message whose key does not name it)."""
    events, _ = decode_lenient(value or b"")
    return next((e["job_id"] for e in events if isinstance(e.get("job_id"), str)), None)


class RouteStage:
    """Routes batches of input messages (``route_batch``) for the ``route`` agent."""

    def __init__(self, cfg: WorkerConfig, partitions: int, out: Outputs, metrics: Metrics,
                 hostmap: HostMap) -> None:
        self.partitions = partitions
        self.out = out
        self.metrics = metrics
        self.hostmap = hostmap
        self.src_kind = cfg.source_kinds()
        self.steps_topic = cfg.topics.for_kind("step")
        self.gpu_topic = cfg.topics.for_kind("gpu")
        self.shard_ranks = cfg.shard_ranks
        self.announced: dict[tuple[str, int], float] = {}  # (host, partition) -> when
        self.fresh: list[tuple[str, int]] = []   # learned, to announce on the host map

    async def route_batch(self, messages: list[Any], now: float) -> None:
        """Route one batch of Kafka messages and send the packs on."""
        packs: dict[int, list[tuple]] = {}
        for msg in messages:  # first the steps: they tell where the telemetry goes
            if self.steps_topic == msg.topic and msg.key:
                self.learn_hosts(msg.value, msg.key.decode("utf-8", "replace"), now)
            elif self.gpu_topic == msg.topic and msg.key:
                self.learn_gpu_host(msg.value, msg.key.decode("utf-8", "replace"), now)
        if self.fresh:
            # issue 16: the other workers route these hosts' telemetry too; tell them now,
            # not once the job stage (behind in a backlog) reaches the steps
            fresh, self.fresh = self.fresh, []
            if len(self.announced) > 1 << 16:   # hosts of ended jobs: forget them
                self.announced = {k: t for k, t in self.announced.items()
                                  if now - t <= self.hostmap.ttl_s}
            for host, p in fresh:
                await self.out.announce_host(host, p)
        seen: dict[str, list] = {}   # topic -> [messages, last Kafka timestamp]
        # issue 31: a host's partitions looked up once a batch (its gpu, nic and host
        # messages), each message routed without a coroutine of its own: only a dead
        # letter awaits. The map is read after the steps of the batch placed their hosts.
        homes: dict[str, list[int]] = {}
        route = self._route
        for msg in messages:
            got = seen.get(msg.topic)
            if got is None:
                got = seen[msg.topic] = [0, None]
            got[0] += 1
            if msg.timestamp:
                got[1] = msg.timestamp
            dead = route(msg, now, packs, homes)
            if dead is not None:
                await self.out.dead_letter(*dead)
        for topic, (count, kafka_ts) in seen.items():
            self.metrics.seen_many(topic, count, kafka_ts, now)
        await self.out.forward(packs)

    def learn_hosts(self, value: bytes | None, job: str, now: float) -> None:
        """The hosts of the step events this worker routes run a job (its shard of the
        host's ranks, issue 16) on a known partition: map them at once, without waiting
        for the job stage's announcement to come back through the broker. While a backlog
        is read, the announcement trails the telemetry by many seconds, and until then
        every partition decodes and holds a copy of every sample. (Invalid records are the
        job stage's to report; a step message without a key is left to the announcement.)"""
        try:
            items = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            return
        n, parts = self.shard_ranks, self.partitions
        home = home_partition(job, parts)
        for ev in items if type(items) is list else (items,):
            host = ev.get("host") if type(ev) is dict else None
            if type(host) is not str:
                continue
            ranks = ev.get("rank")
            if type(ranks) is list:
                # a host's step_batch: the shards of its rank column. Read as one event
                # whose rank is no int, every host of a sharded job was placed on the
                # job's home partition too (shard 0): that partition decoded, ordered and
                # judged every host's telemetry (16,384 ranks in 4 shards: 2,048 hosts, its
                # own 512; 280,000 GPU rows of 4 steps, its own 94,000)
                shards = {shard_of(r, n) for r in ranks if type(r) is int} or {0}
                for k in sorted(shards):
                    self.place(host, (home + k) % parts if k else home, now)
                continue
            k = event_shard(ev, n)
            self.place(host, (home + k) % parts if k else home, now)

    def learn_gpu_host(self, value: bytes | None, host: str, now: float) -> None:
        """A host not placed yet whose GPU samples name their job and rank (CONTRACT's
        optional ``job_id`` and ``rank``) is placed on those ranks' shard partitions at
        once (issue 16). At a large job's start its hosts' telemetry comes before their
        first step ends (and, reading a backlog, long before the steps are routed): sent to
        every partition, a 131,072-rank job's first seconds of samples were copied to each
        of its 32 partitions, decoded there and dropped (``failslow_stream_capped_events``
        counted millions), while the partitions fell minutes behind. Samples that name no
        job still go to every partition until a step places their host."""
        if self.hostmap.partitions(host, now):
            return
        try:
            items = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            return
        n, parts = self.shard_ranks, self.partitions
        items = items if type(items) is list else [items]
        if any(map(is_batch, items)):   # a host's gpu_batch: its rows name the ranks
            items = [r for ev in items for r in (expand_checked(ev)[0] if is_batch(ev)
                                                  else (ev,))]
        for ev in items:
            if type(ev) is not dict:
                continue
            job, rank = ev.get("job_id"), ev.get("rank")
            if type(job) is str and job and type(rank) is int and rank >= 0:
                self.place(host, shard_partition(job, event_shard(ev, n), parts), now)

    def place(self, host: str, p: int, now: float) -> None:
        """``host`` runs ranks homed on partition ``p``: map it, and announce it (each
        host and partition every ttl / 3 at most) for the other workers' routes."""
        self.hostmap.add(host, p, now)
        if now - self.announced.get((host, p), -math.inf) > self.hostmap.ttl_s / 3:
            self.announced[(host, p)] = now
            self.fresh.append((host, p))

    async def route_one(self, msg: Any, now: float, packs: dict[int, list[tuple]]) -> None:
        """Add ``msg`` to the packs of its home partition(s); only one copy of a message
        that goes to several partitions reports its bad records to the dead-letter topic."""
        dead = self._route(msg, now, packs, {})
        if dead is not None:
            await self.out.dead_letter(*dead)

    def _route(self, msg: Any, now: float, packs: dict[int, list[tuple]],
               homes_of: dict[str, list[int]]) -> tuple | None:
        """``route_one``'s work; returns the dead letter's arguments when ``msg`` is one.
        ``homes_of``: the host map's answers already read in this batch."""
        kind = self.src_kind[msg.topic]
        key = (msg.key or b"").decode("utf-8", errors="replace")
        ts0 = float(msg.timestamp or 0.0)
        value = msg.value or b""
        values = [value] if len(value) <= PART_MAX_BYTES else split_value(value)
        if values is None:
            return (too_large(len(msg.value), PART_MAX_BYTES), msg.topic, msg.key, msg.value)
        if kind in ("step", "collective"):
            # the collectives topic carries comm (keyed job_id) and collective (job_id/group)
            job = (job_of_key(key, msg.value or b"") if kind == "collective" else key) or None
            job = job or job_from_value(msg.value)
            if job is None:
                return ("no job_id in the key or the value", msg.topic, msg.key, msg.value)
            home = home_partition(job, self.partitions)
            for v in values:
                # issue 16: a large job's events go to the partitions of their shards
                by_shard = shard_parts(v, self.shard_ranks)
                if by_shard is None:
                    packs.setdefault(home, []).append((msg.topic, ts0, True, msg.key, v))
                    continue
                for k, part in by_shard.items():
                    packs.setdefault(shard_partition(job, k, self.partitions), []).append(
                        (msg.topic, ts0, True, msg.key, part))
            return None
        if not key:
            events, errors = decode_lenient(msg.value or b"")
            key = events[0]["host"] if events else ""
            if not key:
                return ("; ".join(errors) or "no host", msg.topic, msg.key, msg.value)
        homes = homes_of.get(key)
        if homes is None:
            homes = homes_of[key] = self.hostmap.partitions(key, now)
        if not homes:
            self.metrics.unmapped.inc()
        placed = bool(homes)   # the partition admits a placed host's samples at once
        for n, p in enumerate(homes or range(self.partitions)):
            if len(values) == 1:
                packs.setdefault(p, []).append((msg.topic, ts0, n == 0, msg.key, values[0],
                                                placed))
            else:
                packs.setdefault(p, []).extend((msg.topic, ts0, n == 0, msg.key, v, placed)
                                               for v in values)
        return None
