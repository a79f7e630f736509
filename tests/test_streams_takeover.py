"""A worker that gets many partitions at once reads them all back at once (issue 16).

At 131,072 ranks a replacement worker took over its 16 partitions one after another, as
each one's first message came (snapshot read back and restored, emitted incidents
scanned: 1.5-9 s each, 59 s in all). ``JobStage.prefetch`` starts every assigned
partition's read-back when the assignment comes; a partition's first message waits only
for its own."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from failslow.models.acting import ActingDetector
from failslow.models.shard import ShardedDetector
from failslow.streams import job_stage
from failslow.streams.config import WorkerConfig
from failslow.streams.job_stage import JobStage
from failslow.streams.metrics import Metrics
from failslow.streams.partition import JobPartition


class _Store:
    """Every read-back blocks until ``n`` of them are under way at once."""

    def __init__(self, n: int, snap: dict | None = None) -> None:
        self.barrier = threading.Barrier(n, timeout=10)
        self.snap = snap
        self.read: list[int] = []

    def read_latest(self, p: int) -> dict | None:
        self.barrier.wait()        # BrokenBarrierError unless n read-backs overlap
        self.read.append(p)
        return self.snap


@pytest.fixture
def no_broker(monkeypatch):
    emitted = {"job0:slow_rank:r5:25"}
    monkeypatch.setattr(job_stage, "high_offset", lambda *a: 1)

    class _Inc:
        def value(self) -> bytes:
            return (b'{"incident_id":"job0:slow_rank:r5:25","status":"open","ts":1.0,'
                    b'"job_id":"job0"}')

    monkeypatch.setattr(job_stage, "scan", lambda *a, **k: [_Inc()])
    return emitted


def _stage(store: _Store) -> JobStage:
    return JobStage(WorkerConfig(bootstrap="unused:1"), 4, None, Metrics(), None, store)  # type: ignore[arg-type]


def test_assigned_partitions_are_read_back_at_once(no_broker):
    store = _Store(4)
    stage = _stage(store)

    async def run() -> list[JobPartition]:
        stage.prefetch([0, 1, 2, 3])
        return [await stage.take_over(p) for p in (3, 1, 0, 2)]

    states = asyncio.run(run())
    assert sorted(store.read) == [0, 1, 2, 3]
    assert sorted(stage.parts) == [0, 1, 2, 3] and not stage.reading
    assert [s.partition for s in states] == [3, 1, 0, 2]
    assert all(set(s.emitted) == no_broker for s in states)


def test_a_partition_with_a_snapshot_is_restored_from_its_read_back(no_broker):
    src = JobPartition(1)
    src.ingest([{"v": 1, "kind": "step", "job_id": "j", "rank": 0, "host": "h", "ts": t,
                 "step": s, "duration_s": 1.0} for s, t in ((0, 1.0), (1, 2.0))], 7, now=0.0)
    snap = orjson.loads(orjson.dumps(src.snapshot(), option=orjson.OPT_SERIALIZE_NUMPY))
    stage = _stage(_Store(1, snap))

    async def run() -> JobPartition:
        stage.prefetch([1])
        return await stage.take_over(1)

    state = asyncio.run(run())
    assert state._skip_below == snap["o_next"] == 8      # replays below it as restored
    # the worker's detector plans actions (issue 32, suggest by default) around the
    # sharded detector the snapshot restores
    assert isinstance(state.detector, ActingDetector)
    assert isinstance(state.detector.inner, ShardedDetector)


def test_a_partition_revoked_before_its_first_message_is_read_again(no_broker):
    store = _Store(1)
    stage = _stage(store)

    async def run() -> None:
        stage.prefetch([2])
        stage.revoked([2])
        assert not stage.reading
        await stage.take_over(2)         # a new read-back, not the dropped one

    asyncio.run(run())
    stage.pool.shutdown(wait=True)
    assert len(store.read) == 2 and 2 in stage.parts


def test_without_a_prefetch_a_partition_is_read_back_when_its_first_message_comes(no_broker):
    store = _Store(1)
    stage = _stage(store)
    asyncio.run(stage.take_over(0))
    assert store.read == [0] and 0 in stage.parts
