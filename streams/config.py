"""The worker's settings and its topics: ``WorkerConfig``, the internal topics (created
with a retention by ``ensure_internal_topics``) and which kind each input topic carries."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from failslow.models.actions import MODES, MitigationConfig, MitigationConfigError
from failslow.models.shard import SHARD_RANKS
from failslow.schema import Topics
from failslow.schema.kafka_security import client_conf, refused
from failslow.schema.topics import KIND_TOPIC
from failslow.streams import quiet
from failslow.streams.partition import INPUT_KINDS
from failslow.streams.routing import HOSTMAP_TTL_S


def mitigate_from_env(env: Any) -> MitigationConfig | None:
    """``FAILSLOW_MITIGATE``: ``off`` | ``suggest`` | ``auto`` (every job), or the path of a
    TOML file whose ``[mitigate]`` table is the policy; unset: ``suggest`` (dry runs);
    None for ``off`` (no planner at all). MitigationConfigError (one line) on a file that
    cannot be read or a bad table."""
    value = (env.get("FAILSLOW_MITIGATE") or "suggest").strip()
    if value == "off":
        return None
    if value in MODES:
        return MitigationConfig(mode=value)
    try:
        with open(value, "rb") as f:
            table = tomllib.load(f).get("mitigate", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MitigationConfigError(f"FAILSLOW_MITIGATE={value}: {exc}") from None
    return MitigationConfig.from_mapping(table)


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
    # issue 33: events stamped further ahead of the worker's clock are dead-lettered (and at
    # most a quarter of job_idle: streams.clocks)
    max_clock_ahead: float = 60.0
    jitter: float = 0.3
    internal_retention_h: float = 6.0
    max_jobs: int = 1_000
    max_hosts: int = 16_384
    max_ranks_per_job: int = 32_768
    max_groups_per_job: int = 65_536
    max_hosts_per_job: int = 8_192
    # samples of hosts that no job of a partition names yet and that the route did not
    # place on it: a pool of this many hosts (FAILSLOW_MAX_UNKNOWN_HOSTS; tests cut it)
    max_unknown_hosts: int = field(default_factory=lambda: max(
        1, int(os.environ.get("FAILSLOW_MAX_UNKNOWN_HOSTS") or 1_024)))
    # issue 16: ranks per shard of a large job (models.shard; FAILSLOW_SHARD_RANKS): must
    # be the same as failslow detect's to take the same decisions
    shard_ranks: int = SHARD_RANKS
    detector_factory: Callable[[], Any] | None = None
    # issue 32: the mitigation policy (models.actions.MitigationConfig; FAILSLOW_MITIGATE):
    # the default detector also plans actions, sent to the actions topic; None: it does not
    mitigate: MitigationConfig | None = field(
        default_factory=lambda: mitigate_from_env(os.environ))
    detector_restore: Callable[[Any], Any] | None = None
    # issue 30: the detection thresholds (models.settings.DetectionConfig; --config FILE)
    detection: Any = None

    def internal(self, name: str) -> str:
        return f"{self.topics.prefix}internal.{name}"

    def source_kinds(self) -> dict[str, str]:
        """Input topic -> its first kind (the collectives topic: "collective"; it also
        carries comm)."""
        out: dict[str, str] = {}
        for kind, topic in KIND_TOPIC.items():
            if kind in INPUT_KINDS:
                out.setdefault(self.topics.prefix + topic, kind)
        return out


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
    from failslow.streams import StreamsError

    # librdkafka's own lines go through logging (quiet), never straight to stderr after
    # the one-line error below
    admin = AdminClient(client_conf(cfg.bootstrap, {"logger": quiet.RDKAFKA_LOG}))
    try:
        meta = admin.list_topics(timeout=10)
    except KafkaException as exc:  # no broker: one line, not a traceback
        if (wrong_login := refused(admin)) is not None:  # say so, not "unreachable"
            raise wrong_login from None
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
    actions = cfg.topics.for_kind("action")  # issue 32: stacks set up before it existed
    if actions not in meta.topics:
        new.append(NewTopic(actions, num_partitions=n, replication_factor=1))
    for fut in (admin.create_topics(new, operation_timeout=10).values() if new else []):
        try:
            fut.result()
        except Exception as exc:  # a concurrent worker created it first
            if "already exists" not in str(exc).lower() and "TOPIC_ALREADY" not in str(exc):
                raise
    return n
