"""The shard plan of one job spread over partitions (streams/sharding.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from streams.routing import home_partition
from streams.sharding import ShardPlan


def test_a_pipeline_stage_never_spans_two_shards_and_shards_are_even():
    plan = ShardPlan(partitions=8, shards=4)
    world, pp, tp = 512, 8, 8
    stage_of = {r: (r // tp) % pp for r in range(world)}
    shard_of = {r: plan.shard(r, world, stage_of[r], pp) for r in range(world)}
    by_stage = {s: {shard_of[r] for r in range(world) if stage_of[r] == s} for s in range(pp)}
    assert all(len(shards) == 1 for shards in by_stage.values())
    assert sorted(Counter(shard_of.values()).values()) == [128] * 4


def test_without_enough_stages_ranks_go_in_blocks():
    plan = ShardPlan(partitions=4, shards=4)
    shards = [plan.shard(r, 10, pp_rank=0, pp=1) for r in range(10)]
    assert shards == sorted(shards) and set(shards) == {0, 1, 2, 3}


def test_shards_start_at_home_and_land_on_distinct_partitions():
    plan = ShardPlan(partitions=8, shards=2)
    for job in ("job0", "job1", "team/a"):
        parts = [plan.partition(job, k) for k in range(2)]
        assert parts[0] == home_partition(job, 8)
        assert len(set(parts)) == 2
    assert ShardPlan(4).partition("job5", 0) == home_partition("job5", 4)


def test_telemetry_goes_to_the_shards_holding_the_host_ranks():
    plan = ShardPlan(partitions=4, shards=2)
    placed = {plan.place("j", "h0", r, 16, r // 8, 2) for r in range(8)}  # stage 0 on h0
    plan.place("j", "h1", 12, 16, 1, 2)
    assert plan.host_partitions("j", "h0") == placed and len(placed) == 1
    assert plan.host_partitions("j", "h1") == {plan.partition("j", 1)}
    assert plan.host_partitions("j", "h9") == set()


def test_more_shards_than_partitions_is_refused():
    with pytest.raises(ValueError):
        ShardPlan(partitions=2, shards=3)
