"""Where the worker's stages send: the internal job topic, the incidents, the dead-letter
and the host-map topics (faust topics; ``send`` is a coroutine). The stages get one
``Outputs`` and never see faust."""

from __future__ import annotations

from typing import Any

import orjson

from failslow.schema import encode, encode_deadletter
from failslow.streams.metrics import Metrics
from failslow.streams.routing import home_partition, pack

# An internal message packs routed parts up to this size (or one part alone when larger)
PACK_BYTES = 512 * 1024


class Outputs:
    def __init__(self, metrics: Metrics, job: Any, incidents: Any, dead: Any, hostmap: Any,
                 partitions: int, actions: Any = None) -> None:
        self.metrics = metrics
        self.job_topic = job
        self.incidents_topic = incidents
        self.actions_topic = actions  # issue 32: None drops the planner's actions
        self.dead_topic = dead
        self.hostmap_topic = hostmap
        self.partitions = partitions

    async def dead_letter(self, error: str, topic: str, key: bytes | None,
                          raw: bytes | None) -> None:
        self.metrics.deadletters.labels(topic).inc()
        await self.dead_topic.send(key=key, value=encode_deadletter(error, topic, raw))

    async def forward(self, packs: dict[int, list[tuple]]) -> None:
        """Send the routed parts on, one packed message per partition of the job topic (or
        a few, at most ``PACK_BYTES`` each, or one part alone when it is larger): the job
        stage's cost per Kafka message is paid once."""
        for p, parts in packs.items():
            group: list[tuple] = []
            size = 0
            for part in parts:
                if group and size + len(part[4]) > PACK_BYTES:
                    await self.job_topic.send(value=pack(group), partition=p)
                    group, size = [], 0
                group.append(part)
                size += len(part[4])
            if group:
                await self.job_topic.send(value=pack(group), partition=p)

    async def incidents(self, p: int, incidents: list[dict]) -> None:
        for inc in incidents:
            if inc.get("kind") == "action":
                if self.actions_topic is not None:
                    await self.actions_topic.send(key=inc["job_id"].encode(),
                                                  value=encode(inc), partition=p)
                continue
            self.metrics.incidents.labels(inc["status"]).inc()
            await self.incidents_topic.send(key=inc["job_id"].encode(), value=encode(inc),
                                            partition=p)

    async def announce_host(self, host: str, p: int) -> None:
        """Tell every worker's route stage that ``host`` runs a job of partition ``p``."""
        await self.hostmap_topic.send(
            key=host.encode(), partition=home_partition(host, self.partitions),
            value=orjson.dumps({"host": host, "partition": p}))
