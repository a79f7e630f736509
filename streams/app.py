"""The faust app of ``failslow worker``: two thin agents and two timers.

    input topics --route--> <prefix>internal.job (partition = job's home partition) --jobs-->
        incidents (same partition number), dead letters, host map announcements

- ``route`` consumes every input topic, a batch at a time. Step and collective
  messages carry the job in their key and go on to the job's home partition as
  raw bytes (no decode: the cost is per message, not per event), many input
  messages packed into one internal message (``routing.pack``). Telemetry, keyed by host,
  goes to the home partitions of the jobs on that host (``HostMap``, learned
  from the job stage's announcements); telemetry of a host not yet announced
  goes to every partition, so no partition sees a job's early telemetry late
  (the announcement trails the first steps by a round trip through the broker).
- ``jobs`` consumes the internal job topic: decode + validate (bad records to the
  dead-letter topic), then ``JobPartition`` orders, de-duplicates and runs the
  Detector of models/. Its messages are acked by hand, only up to the oldest
  offset the newest durable snapshot still needs, so a restart (even after
  kill -9) resumes from committed offsets at or before the snapshot and
  rebuilds the exact state.
- A crash in an agent or a timer exits the process (code 70) instead of leaving
  a worker that consumes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faust
import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from faust.transport.drivers import aiokafka as faust_aiokafka

from models.pipeline import Detector
from schema import Topics, decode_lenient, encode, encode_deadletter, kafka_security
from schema.fast import all_valid
from schema.kafka_security import client_conf
from schema.topics import KIND_TOPIC
from streams import quiet
from streams.limits import InputLimits
from streams.metrics import Metrics
from streams.partition import INPUT_KINDS, JobPartition
from streams.routing import (
    HOSTMAP_TTL_S,
    PART_MAX_BYTES,
    HostMap,
    home_partition,
    job_of_key,
    pack,
    split_value,
    unpack,
)
from streams.snapshots import SnapshotStore, scan

log = logging.getLogger("failslow.worker")
CRASH_EXIT = 70
# The most of the worker's time state snapshots may take: a partition whose snapshot took
# d seconds (pickling a 4,096-rank Detector: ~0.4 s) is snapshotted again after
# max(snapshot_interval, d / SNAPSHOT_SHARE), i.e. less often when the state is large.
SNAPSHOT_SHARE = 0.05
_FETCH_WAIT_MS = [100]


def _patch_fetch_wait() -> None:
    """faust builds its aiokafka consumer with a fixed 1,500 ms fetch wait, and Tansu holds
    every fetch for the full wait: lower it (MEASURED.md: 100 ms -> ~30-50 ms delivery)."""
    cls = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_failslow_patched", False):
        return
    original = cls._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        consumer._fetch_max_wait_ms = _FETCH_WAIT_MS[0]
        return consumer

    cls._create_worker_consumer = create  # type: ignore[method-assign]
    cls._failslow_patched = True  # type: ignore[attr-defined]


@dataclass
class WorkerConfig:
    bootstrap: str
    topics: Topics = field(default_factory=Topics)
    group: str = "failslow-worker"
    lateness: float = 10.0
    idle_s: float = 2.0
    snapshot_interval: float = 5.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    session_timeout: float = 2.0
    fetch_wait_ms: int = 100
    telemetry_delay: float = 1.0
    job_idle: float = 300.0
    jitter: float = 0.3
    internal_retention_h: float = 6.0
    max_jobs: int = 1_000
    max_hosts: int = 16_384
    max_ranks_per_job: int = 32_768
    max_groups_per_job: int = 65_536
    max_hosts_per_job: int = 8_192
    detector_factory: Callable[[], Any] | None = None
    detector_restore: Callable[[Any], Any] | None = None

    def internal(self, name: str) -> str:
        return f"{self.topics.prefix}internal.{name}"


def internal_topic_configs(cfg: WorkerConfig) -> dict[str, dict[str, str]]:
    """Retention of the internal topics (Kafka's default keeps everything 7 days). The job
    topic carries every input event once more and a snapshot is written every few
    seconds (MBs for a large job): each is needed only until the next snapshot, plus a
    restart's downtime (``internal_retention_h``). A host-map entry is stale after
    ``HOSTMAP_TTL_S``, and every worker reads the host map from its start. Compaction
    would break snapshots (one key, many chunks): old segments are deleted instead,
    rolled often enough for that to act."""
    keep = int(cfg.internal_retention_h * 3_600_000)

    def delete_after(ms: int) -> dict[str, str]:
        return {"cleanup.policy": "delete", "retention.ms": str(ms),
                "segment.ms": str(max(min(ms // 6, 3_600_000), 60_000))}

    return {cfg.internal("job"): delete_after(keep),
            cfg.internal("snapshots"): delete_after(keep),
            cfg.internal("hostmap"): delete_after(max(int(4_000 * HOSTMAP_TTL_S), 3_600_000))}


def ensure_internal_topics(cfg: WorkerConfig) -> int:
    """Create the internal topics with as many partitions as the incidents topic, with
    their retention (``internal_topic_configs``; a topic that exists is left as it is);
    return N."""
    from streams import StreamsError

    # librdkafka's own lines go through logging (quiet), never straight to stderr after
    # the one-line error below
    admin = AdminClient(client_conf(cfg.bootstrap, {"logger": quiet.RDKAFKA_LOG}))
    try:
        meta = admin.list_topics(timeout=10)
    except KafkaException as exc:  # no broker: one line, not a traceback
        raise StreamsError(f"broker {cfg.bootstrap} unreachable ({exc.args[0].str()}): is it "
                           "running? (`failslow status` checks)") from None
    incidents = meta.topics.get(cfg.topics.for_kind("incident"))
    if incidents is None or not incidents.partitions:
        raise StreamsError(f"topic {cfg.topics.for_kind('incident')} does not exist on "
                           f"{cfg.bootstrap} (run `failslow up` or create the topics)")
    n = len(incidents.partitions)
    configs = internal_topic_configs(cfg)
    new = [NewTopic(t, num_partitions=n, replication_factor=1, config=c)
           for t, c in configs.items() if t not in meta.topics]
    for fut in (admin.create_topics(new, operation_timeout=10).values() if new else []):
        try:
            fut.result()
        except Exception as exc:  # a concurrent worker created it first
            if "already exists" not in str(exc).lower() and "TOPIC_ALREADY" not in str(exc):
                raise
    return n


class HostMapReader(threading.Thread):
    """Reads every partition of the host-map topic from the start, for as long as it runs."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, hostmap: HostMap) -> None:
        super().__init__(name="failslow-hostmap", daemon=True)
        self._consumer = Consumer(client_conf(bootstrap, {
            "group.id": f"failslow-hostmap-{os.getpid()}-{id(self)}",
            "enable.auto.commit": False, "fetch.wait.max.ms": 50,
            "logger": quiet.RDKAFKA_LOG}))
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.hostmap = hostmap
        self._stop = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                for m in self._consumer.consume(num_messages=500, timeout=0.1):
                    value = m.value()
                    if m.error() is None and value:
                        entry = orjson.loads(value)
                        self.hostmap.add(entry["host"], entry["partition"], time.time())
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stop.set()


def decode_value(value: bytes | None, kinds: frozenset[str] | None = None
                 ) -> tuple[list[dict], list[str]]:
    """``schema.decode_lenient``, with one compiled pass (detect's ``all_valid``) for the
    common case of a message whose every event is valid and of its topic's kind."""
    try:
        obj = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return decode_lenient(value or b"", kinds)
    items = obj if type(obj) is list else [obj]
    if items and all_valid(items) and (kinds is None or all(e["kind"] in kinds for e in items)):
        return items, []
    return decode_lenient(value or b"", kinds)


def _fatal(what: str) -> None:
    log.exception("%s crashed; exiting so a supervisor restarts the worker", what)
    logging.shutdown()
    os._exit(CRASH_EXIT)


def build_app(cfg: WorkerConfig) -> faust.App:
    """The faust app; input and internal topics must exist (``ensure_internal_topics``)."""
    _FETCH_WAIT_MS[0] = cfg.fetch_wait_ms
    _patch_fetch_wait()
    nparts = ensure_internal_topics(cfg)
    app = faust.App(
        cfg.group, broker=f"kafka://{cfg.bootstrap}", value_serializer="raw",
        key_serializer="raw", web_enabled=False, processing_guarantee="at_least_once",
        broker_session_timeout=cfg.session_timeout, broker_heartbeat_interval=0.3,
        broker_rebalance_timeout=10.0, broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest", topic_disable_leader=True, stream_wait_empty=False,
        topic_allow_declare=False, datadir=tempfile.mkdtemp(prefix="failslow-worker-"),
        broker_credentials=kafka_security.current().faust_credentials(),
    )
    t = cfg.topics
    # topic -> its first kind (the collectives topic: "collective", it also carries comm)
    src_kind: dict[str, str] = {}
    for kind, topic in KIND_TOPIC.items():
        if kind in INPUT_KINDS:
            src_kind.setdefault(cfg.topics.prefix + topic, kind)
    inputs = app.topic(*t.inputs(), value_serializer="raw", key_serializer="raw")
    job_topic = app.topic(cfg.internal("job"), value_serializer="raw", key_serializer="raw")
    hostmap_topic = app.topic(cfg.internal("hostmap"), value_serializer="raw")
    incidents_topic = app.topic(t.for_kind("incident"), value_serializer="raw")
    dead_topic = app.topic(t.deadletter, value_serializer="raw")
    metrics = Metrics()
    hostmap = HostMap()
    store = SnapshotStore(cfg.bootstrap, cfg.internal("snapshots"))
    parts: dict[int, JobPartition] = {}
    held: dict[int, list[Any]] = {}  # unacked events of the job stream, per partition
    announced: dict[int, dict[str, float]] = {}
    job_stream: list[Any] = []
    reader = HostMapReader(cfg.bootstrap, cfg.internal("hostmap"), nparts, hostmap)
    app.failslow_metrics = metrics  # type: ignore[attr-defined]  # for tests and the CLI

    async def dead_letter(error: str, topic: str, key: bytes | None, raw: bytes | None) -> None:
        metrics.deadletters.labels(topic).inc()
        await dead_topic.send(key=key, value=encode_deadletter(error, topic, raw))

    PACK_BYTES = 512 * 1024

    async def forward(packs: dict[int, list[tuple]]) -> None:
        """Send the routed parts on, one packed message per home partition (or a few, at
        most ``PACK_BYTES`` each, or one part alone when it is larger): the job stage's cost
        per Kafka message is paid once."""
        for p, parts in packs.items():
            group: list[tuple] = []
            size = 0
            for part in parts:
                if group and size + len(part[4]) > PACK_BYTES:
                    await job_topic.send(value=pack(group), partition=p)
                    group, size = [], 0
                group.append(part)
                size += len(part[4])
            if group:
                await job_topic.send(value=pack(group), partition=p)

    def job_from_value(value: bytes | None) -> str | None:
        events, _ = decode_lenient(value or b"")
        return next((e["job_id"] for e in events if isinstance(e.get("job_id"), str)), None)

    steps_topic = t.for_kind("step")

    def learn_hosts(value: bytes | None, home: int, now: float) -> None:
        """The hosts of the step events this worker routes run a job homed at ``home``: map
        them at once, without waiting for the job stage's announcement to come back
        through the broker. While a backlog is read, the announcement trails the
        telemetry by many seconds, and until then every partition decodes and holds a
        copy of every sample. (Invalid records are the job stage's to report; a step
        message without a key is left to the announcement.)"""
        try:
            items = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            return
        for ev in items if type(items) is list else (items,):
            host = ev.get("host") if type(ev) is dict else None
            if type(host) is str:
                hostmap.add(host, home, now)

    async def route_one(msg: Any, now: float, packs: dict[int, list[tuple]]) -> None:
        """Add ``msg`` to the packs of its home partition(s); only one copy of a message
        that goes to several partitions reports its bad records to the dead-letter topic."""
        kind = src_kind[msg.topic]
        key = (msg.key or b"").decode("utf-8", errors="replace")
        ts0 = float(msg.timestamp or 0.0)
        values = split_value(msg.value or b"")
        if values is None:
            await dead_letter(f"message of {len(msg.value)} bytes is larger than "
                              f"{PART_MAX_BYTES} and is not an array that can be split",
                              msg.topic, msg.key, msg.value)
            return
        if kind in ("step", "collective"):
            # the collectives topic carries comm (keyed job_id) and collective (job_id/group)
            job = (job_of_key(key, msg.value or b"") if kind == "collective" else key) or None
            job = job or job_from_value(msg.value)
            if job is None:
                await dead_letter("no job_id in the key or the value", msg.topic, msg.key,
                                  msg.value)
                return
            packs.setdefault(home_partition(job, nparts), []).extend(
                (msg.topic, ts0, True, msg.key, v) for v in values)
            return
        if not key:
            events, errors = decode_lenient(msg.value or b"")
            key = events[0]["host"] if events else ""
            if not key:
                await dead_letter("; ".join(errors) or "no host", msg.topic, msg.key, msg.value)
                return
        homes = hostmap.partitions(key, now)
        if not homes:
            metrics.unmapped.inc()
        for n, p in enumerate(homes or range(nparts)):
            packs.setdefault(p, []).extend((msg.topic, ts0, n == 0, msg.key, v) for v in values)

    @app.agent(inputs)
    async def route(stream: Any) -> None:
        try:
            async for batch in stream.take_events(2000, within=0.01):
                now = time.time()
                packs: dict[int, list[tuple]] = {}
                for event in batch:  # first the steps: they tell where the telemetry goes
                    msg = event.message
                    if steps_topic == msg.topic and msg.key:
                        learn_hosts(msg.value, home_partition(msg.key.decode("utf-8", "replace"),
                                                              nparts), now)
                for event in batch:
                    msg = event.message
                    metrics.seen(msg.topic, msg.timestamp, now)
                    await route_one(msg, now, packs)
                await forward(packs)
        except Exception:
            _fatal("route agent")

    async def emit(p: int, incidents: list[dict]) -> None:
        for inc in incidents:
            metrics.incidents.labels(inc["status"]).inc()
            await incidents_topic.send(key=inc["job_id"].encode(), value=encode(inc), partition=p)

    async def take_over(p: int) -> JobPartition:
        """State of partition ``p`` when this worker gets it: newest snapshot + emitted incidents."""
        hooks: dict[str, Any] = {
            "detector_factory": lambda: Detector(telemetry_delay_s=cfg.telemetry_delay,
                                                 job_idle_s=cfg.job_idle)}
        if cfg.detector_factory:
            hooks["detector_factory"] = cfg.detector_factory
        if cfg.detector_restore:
            hooks["detector_restore"] = cfg.detector_restore
        limits = InputLimits(cfg.max_jobs, cfg.max_hosts, cfg.max_ranks_per_job,
                             cfg.max_groups_per_job, cfg.max_hosts_per_job, partition=p)
        state = JobPartition(p, lateness=cfg.lateness, idle_s=cfg.idle_s, jitter_s=cfg.jitter,
                             limits=limits, **hooks)
        t0 = time.time()
        snap = await asyncio.to_thread(store.read_latest, p)
        if snap is not None:
            state.restore(snap)
            if hasattr(state.detector, "telemetry_delay_s"):  # the flag wins over the snapshot
                state.detector.telemetry_delay_s = cfg.telemetry_delay
                state.detector.job_idle_s = cfg.job_idle
        for m in await asyncio.to_thread(scan, cfg.bootstrap, t.for_kind("incident"), p):
            try:
                state.remember(orjson.loads(m.value()))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
        log.info("partition %d taken over: snapshot %s, %d incidents already emitted", p,
                 "restored" if snap else "none", len(state.emitted))
        for other in parts.values():
            other.pause(time.time() - t0)
        parts[p] = state
        held[p] = []
        announced[p] = {}
        return state

    async def announce(p: int, events: list[dict], now: float) -> None:
        seen = announced[p]
        for ev in events:
            if ev["kind"] == "step":
                host = ev["host"]
                if now - seen.get(host, -math.inf) > hostmap.ttl_s / 3:
                    seen[host] = now
                    await hostmap_topic.send(
                        key=host.encode(), partition=home_partition(host, nparts),
                        value=orjson.dumps({"host": host, "partition": p}))

    capped_seen: dict[tuple[int, str], int] = {}
    counted = (("duplicates", metrics.duplicates), ("late", metrics.late),
               ("late_samples", metrics.late_samples),
               ("detector_errors", metrics.detector_errors), ("jobs_ended", metrics.jobs_ended),
               ("judged_rank_steps", metrics.judged))

    def count(state: JobPartition, before: dict[str, int]) -> None:
        for name, metric in counted:
            if state.counts[name] != before[name]:
                metric.inc(state.counts[name] - before[name])
        if state.counts["capped"] != before["capped"]:
            for cap, n in state.limits.counts.items():
                reported = capped_seen.get((state.partition, cap), 0)
                if n != reported:
                    metrics.capped.labels(cap).inc(n - reported)
                    capped_seen[(state.partition, cap)] = n

    def foreign(state: JobPartition, key: bytes, p: int, now: float) -> bool:
        """A copy of a host's telemetry sent to every partition (its host was not mapped
        yet when it was routed) whose host, by now, is known to run a job homed
        elsewhere and no job here: not decoded, not kept. The copy that reports bad
        records is always processed. A job here that starts on that host later gets its
        samples from its first announcement on."""
        host = key.decode("utf-8", "replace")
        homes = hostmap.partitions(host, now)
        return bool(homes) and p not in homes and not state.runs_on(host)

    async def handle(event: Any, now: float) -> None:
        msg = event.message
        p = msg.partition
        state = parts.get(p) or await take_over(p)
        held[p].append(event)
        for src, ts0, report, key, value in unpack(msg.value):
            if not report and key and src != steps_topic and foreign(state, key, p, now):
                continue
            want = src_kind.get(src)
            events, errors = decode_value(value, t.kinds_of(src))
            if errors and report:
                await dead_letter("; ".join(errors), src, key, value)
            if report:  # count a message sent to several partitions once
                metrics.events.labels(src).inc(len(events))
            before = dict(state.counts)
            incidents = state.ingest(events, msg.offset, now)
            count(state, before)
            if incidents:
                await emit(p, incidents)
            if want == "step":
                await announce(p, events, now)
            if ts0:
                metrics.latency.observe(max(0.0, time.time() - ts0))

    @app.agent(job_topic)
    async def jobs(stream: Any) -> None:
        try:
            manual = stream.noack()
            job_stream.append(manual)
            async for event in manual.events():
                await handle(event, time.time())
        except Exception:
            _fatal("jobs agent")

    @app.timer(0.25)
    async def tick() -> None:
        try:
            now = time.time()
            for p, state in list(parts.items()):
                if rebalancing[0] is None:
                    before = dict(state.counts)
                    await emit(p, state.tick(now))
                    count(state, before)
            metrics.open_incidents.set(sum(len(s.open_ids) for s in parts.values()))
            metrics.buffered.set(sum(s.buffered for s in parts.values()))
            line = metrics.summary()
            if line:
                log.info("%s", line)
        except Exception:
            _fatal("tick timer")

    due: dict[int, float] = {}  # partition -> monotonic time its next snapshot may start

    async def snapshot_all(ack: bool, force: bool = False) -> None:
        for p, state in list(parts.items()):
            t0 = time.monotonic()
            if not force and t0 < due.get(p, 0.0):
                continue
            snap = state.snapshot()
            state.prune()
            blob = store.encode(snap)
            # The share counts all the CPU a snapshot takes (pickle, JSON, compression);
            # only the delivery to the broker runs beside the agents.
            due[p] = t0 + (time.monotonic() - t0) / SNAPSHOT_SHARE
            size = await asyncio.to_thread(store.write_blob, p, blob)
            metrics.snapshot_bytes.labels(str(p)).set(size)
            if ack and job_stream and parts.get(p) is state:
                keep = []
                for ev in held.get(p, []):
                    if ev.message.offset < snap["o_min"]:
                        await job_stream[0].ack(ev)
                    else:
                        keep.append(ev)
                held[p] = keep

    @app.timer(cfg.snapshot_interval)
    async def snapshots() -> None:
        try:
            await snapshot_all(ack=True)
        except Exception:
            _fatal("snapshot timer")

    rebalancing: list[float | None] = [None]  # when the current rebalance began

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # async receivers are fine
    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        began, rebalancing[0] = rebalancing[0], None
        if began is not None:
            for state in parts.values():
                state.pause(time.time() - began)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        rebalancing[0] = rebalancing[0] or time.time()
        for tp in revoked:
            if tp.topic == job_topic.get_topic_name() and tp.partition in parts:
                del parts[tp.partition]
                held.pop(tp.partition, None)
                due.pop(tp.partition, None)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(sender: Any, **kwargs: Any) -> None:
        await snapshot_all(ack=False, force=True)
        reader.stop()

    @app.task
    async def start_reader() -> None:
        reader.start()
        if cfg.metrics_port is not None:
            metrics.serve(cfg.metrics_port, cfg.metrics_addr)
            log.info("metrics on http://%s:%d/metrics", cfg.metrics_addr, cfg.metrics_port)

    return app
