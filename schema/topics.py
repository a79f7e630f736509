"""Topic names and message keys of CONTRACT.md ("Topics")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KIND_TOPIC = {
    "gpu": "gpu",
    "nic": "nic",
    "host": "host",
    "step": "steps",
    "collective": "collectives",
    "comm": "collectives",
    "incident": "incidents",
    "action": "actions",
    # columnar batches (schema.batches) travel with the per-rank kinds they hold
    "comm_batch": "collectives",
    "gpu_batch": "gpu",
    "nic_batch": "nic",
    "step_batch": "steps",
}
# Topics the stream processors publish, never read as detector input.
OUTPUTS = ("incidents", "actions")
DEADLETTER = "deadletter"
# topic (without prefix) -> the kinds of its events once decoded (a batch is decoded into
# the per-rank events it holds)
TOPIC_KINDS: dict[str, frozenset[str]] = {
    t: frozenset(k for k, t2 in KIND_TOPIC.items() if t2 == t and not k.endswith("_batch"))
    for t in KIND_TOPIC.values()}


@dataclass(frozen=True)
class Topics:
    """Full topic names under one prefix (default ``failslow.``)."""

    prefix: str = "failslow."

    def for_kind(self, kind: str) -> str:
        return self.prefix + KIND_TOPIC[kind]

    @property
    def deadletter(self) -> str:
        return self.prefix + DEADLETTER

    def kinds_of(self, topic: str) -> frozenset[str] | None:
        """The kinds a full topic name carries; None for a topic that is not an event topic."""
        if not topic.startswith(self.prefix):
            return None
        return TOPIC_KINDS.get(topic[len(self.prefix):])

    def all(self) -> list[str]:
        return [self.prefix + t for t in (*TOPIC_KINDS, DEADLETTER)]

    def inputs(self) -> list[str]:
        """The event topics the stream processors read, each once."""
        return [self.prefix + t for t in TOPIC_KINDS if t not in OUTPUTS]


def key_for(event: Any) -> str:
    """The message key of an event: host for telemetry, job_id for steps, comm summaries
    incidents and actions, ``job_id/group`` for raw collectives."""
    kind = event["kind"]
    if kind in ("gpu", "nic", "host", "gpu_batch", "nic_batch"):
        return str(event["host"])
    if kind == "collective":
        return f"{event['job_id']}/{event['group']}"
    return str(event["job_id"])
