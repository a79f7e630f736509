"""The worker's event loop stays free while a partition's message is judged (issue 16).

A 4,096-rank shard's step takes seconds of a core. Judged on the event loop, it held up
the sends, the timers and the group's rebalance callbacks that long, so large jobs'
workers needed a 10-15 s session timeout to stay in the group (and a crashed worker's
partitions moved only after that long). ``JobStage`` runs a partition's CPU work in one
judge thread, in the order it is submitted; the loop, probed by ``LoopProbe``, keeps
running. Here a message's ingest takes ~1.5 s of CPU (a slow detector); no broker."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import orjson
import pytest

from failslow.streams import job_stage
from failslow.streams.config import WorkerConfig
from failslow.streams.job_stage import JobStage
from failslow.streams.loopprobe import LoopProbe
from failslow.streams.metrics import Metrics
from failslow.streams.partition import JobPartition
from failslow.streams.routing import HostMap, pack

SPIN_S = 1.5   # CPU seconds one message's ingest takes


class _Out:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    async def incidents(self, p: int, incidents: list[dict]) -> None:
        self.sent += [("incident", p, inc["incident_id"]) for inc in incidents]

    async def dead_letter(self, error: str, topic: str, key: bytes | None,
                          raw: bytes | None) -> None:
        self.sent.append(("dead", topic, error))

    async def announce_host(self, host: str, p: int) -> None:
        self.sent.append(("announce", host, p))


class _Store:
    def __init__(self) -> None:
        self.snaps: list[dict] = []

    def read_latest(self, p: int) -> None:
        return None

    def encode(self, snap: dict) -> bytes:
        self.snaps.append(snap)
        return b"blob"

    def try_write_blob(self, p: int, blob: bytes) -> int:
        return len(blob)


class _Stream:
    def __init__(self) -> None:
        self.acked: list[int] = []

    async def ack(self, event: object) -> None:
        self.acked.append(event.message.offset)  # type: ignore[attr-defined]


@pytest.fixture
def slow_ingest(monkeypatch):
    """Every ingest spins ``SPIN_S`` of CPU first, in pure Python (holding the GIL between
    the interpreter's switches), as a detector judging a large shard does."""
    monkeypatch.setattr(job_stage, "high_offset", lambda *a: 0)
    monkeypatch.setattr(job_stage, "scan", lambda *a, **k: [])
    original = JobPartition.ingest
    busy: list[float] = []

    def ingest(self, events, offset, now, placed=False):
        t0 = time.process_time()
        busy.append(time.monotonic())
        n = 0
        while time.process_time() - t0 < SPIN_S:
            n += 1
        return original(self, events, offset, now, placed)

    monkeypatch.setattr(JobPartition, "ingest", ingest)
    return busy


def _stage() -> tuple[JobStage, _Out, _Store]:
    out, store = _Out(), _Store()
    cfg = WorkerConfig(bootstrap="unused:1")
    stage = JobStage(cfg, 4, out, Metrics(), HostMap(), store)  # type: ignore[arg-type]
    stage.stream = _Stream()
    return stage, out, store


def _event(stage: JobStage, p: int, offset: int) -> SimpleNamespace:
    steps = [{"v": 1, "kind": "step", "job_id": "j", "rank": r, "world_size": 16,
              "host": f"h{r // 8}",
              "ts": 100.0 + offset, "step": offset, "duration_s": 1.0} for r in range(16)]
    value = pack([(stage.steps_topic, 0.0, True, b"j", orjson.dumps(steps))])
    return SimpleNamespace(message=SimpleNamespace(partition=p, offset=offset, value=value))


def test_the_loop_keeps_running_while_a_message_is_judged(slow_ingest):
    stage, out, _ = _stage()
    metrics = stage.metrics

    async def run() -> float:
        probe = LoopProbe(metrics)
        task = asyncio.create_task(probe.run())
        await asyncio.sleep(0.2)
        for offset in range(2):
            await stage.handle(_event(stage, 1, offset), 200.0)
        await asyncio.sleep(0.2)         # the probe records its last wake
        task.cancel()
        return probe.worst

    worst = asyncio.run(run())
    assert len(slow_ingest) == 2        # both messages judged, SPIN_S of CPU each
    # judged on the loop, the probe woke SPIN_S late; now the loop waits only its turns
    assert worst < SPIN_S / 2, worst
    assert metrics.loop_blocked.labels("worker")._sum.get() > 0
    assert ("announce", "h0", 1) in out.sent     # the step's hosts announced from the loop
    assert not [x for x in out.sent if x[0] == "dead"]


def test_a_snapshot_and_a_revoke_during_an_ingest_see_it_whole(slow_ingest):
    """A snapshot asked for while a message is judged is taken after it (never half an
    ingest); a revoke then drops the partition, and the message still completes."""
    stage, out, store = _stage()

    async def run() -> None:
        await stage.handle(_event(stage, 2, 0), 200.0)
        judging = asyncio.create_task(stage.handle(_event(stage, 2, 1), 200.0))
        while len(slow_ingest) < 2:      # the judge thread is in the second ingest
            await asyncio.sleep(0.01)
        await stage.snapshot_all(ack=True, force=True)
        assert judging.done()            # the snapshot waited for the ingest
        stage.revoked([2])
        await judging

    asyncio.run(run())
    assert [s["o_next"] for s in store.snaps] == [2]   # both messages in the snapshot
    assert 2 not in stage.parts and 2 not in stage.held
