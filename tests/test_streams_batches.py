"""The stream worker takes the columnar batch kinds as it takes the per-rank ones: the job
stage's decode keeps them whole (issue 31), and the route places a host from its GPUs' batch."""

from __future__ import annotations

import time

from failslow.schema import Topics, encode
from failslow.schema.batches import expand, to_batch
from failslow.streams.config import WorkerConfig
from failslow.streams.job_stage import decode_value
from failslow.streams.metrics import Metrics
from failslow.streams.route_stage import RouteStage
from failslow.streams.routing import HostMap
from failslow.streams.sharding import SHARD_RANKS, shard_partition

T0 = 1_767_225_600.0


def _gpus(first_rank: int) -> list[dict]:
    return [{"v": 1, "kind": "gpu", "ts": T0, "host": "h9", "gpu": i, "uuid": f"GPU-{i}",
             "sm_clock_mhz": 1980.0, "job_id": "big", "rank": first_rank + i}
            for i in range(8)]


def test_the_job_stage_keeps_a_valid_batch_whole_and_rejects_a_bad_one_whole():
    rows = _gpus(0)
    kinds = Topics().kinds_of("failslow.gpu")
    assert decode_value(encode(to_batch(rows)), kinds) == ([to_batch(rows)], [])
    assert expand(decode_value(encode(to_batch(rows)), kinds)[0][0]) == rows
    bad = to_batch(rows)
    bad["uuid"] = bad["uuid"][:3]
    assert decode_value(encode([bad, rows[0]]), kinds) == (
        [rows[0]], ["[0] gpu_batch.uuid: 3 values for 8 rows"])


def test_the_route_places_a_host_from_its_gpu_batch():
    cfg = WorkerConfig(bootstrap="unused:1", topics=Topics("t."))
    stage = RouteStage(cfg, 8, None, Metrics(), HostMap())
    now = time.time()
    stage.learn_gpu_host(encode(to_batch(_gpus(SHARD_RANKS + 8))), "h9", now)
    assert set(stage.hostmap.partitions("h9", now)) == {shard_partition("big", 1, 8)}
