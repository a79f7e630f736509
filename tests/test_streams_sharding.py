"""One job across many partitions (issue 16): the shard plan is the job's
(``models.shard``), the route stage sends each event to its shard's partition
(``streams.sharding``), and the shards judged on separate partitions emit exactly the
incidents of ``failslow detect``'s ``ShardedDetector`` on the whole trace."""

from __future__ import annotations

import asyncio
from collections import Counter

import orjson
import pytest
from test_streams_stages import _Msg, _routed, _router

from failslow.models.pipeline import Detector
from failslow.models.shard import SEP, ShardedDetector, shards_of
from failslow.simulator import SCENARIOS, simulate
from failslow.streams.partition import JobPartition
from failslow.streams.routing import HostMap, home_partition
from failslow.streams.sharding import event_shard, prune_foreign_hosts, shard_partition, shard_parts


def _events(name: str) -> list[dict]:
    return list(simulate(SCENARIOS[name], seed=0).events())


@pytest.fixture(scope="module")
def stage_slow() -> list[dict]:
    return _events("pipeline_stage_slow")     # 64 ranks tp8 pp4: rank 20 25 % slower


def test_a_job_no_larger_than_a_shard_is_judged_exactly_as_before():
    events = _events("gpu_thermal_30")
    assert ShardedDetector(shard_ranks=16).process_batch(events) == \
        Detector().process_batch(events)


def test_shards_of_a_job_are_blocks_of_ranks_and_the_shard_sees_its_own_world():
    det = ShardedDetector(shard_ranks=32)
    step = {"kind": "step", "job_id": "j", "rank": 40, "world_size": 72, "ts": 1.0}
    assert det.shard_event(step) == {**step, "job_id": f"j{SEP}1", "world_size": 32}
    assert det.shard_event({**step, "rank": 70})["world_size"] == 8      # the last block
    assert det.shard_event({**step, "rank": 3})["job_id"] == "j"         # shard 0: the job
    assert shards_of(72, 32) == 3 and shards_of(32, 32) == 1
    small = {**step, "rank": 3, "world_size": 32}
    assert det.shard_event(small) is small


def test_a_sharded_job_finds_its_culprit_under_the_jobs_own_ids(stage_slow):
    det = ShardedDetector(shard_ranks=32)
    out = det.process_batch(stage_slow) + det.flush() + det.end_jobs()
    assert out
    assert all(SEP not in inc["job_id"] and SEP not in inc["incident_id"] for inc in out)
    assert {inc["job_id"] for inc in out} == {"job0"}
    opened = {(inc["fault"], inc.get("rank")) for inc in out if inc["status"] == "open"}
    assert ("slow_rank", 20) in opened
    # one job-wide change point per job, never one per shard
    assert len({inc["incident_id"] for inc in out if inc["fault"] == "job_slowdown"}) <= 1
    # the cost is the whole job's: 64 GPUs, not the shard's 32
    priced = [inc for inc in out if "gpu_hours_lost" in inc]
    assert priced
    for inc in priced:
        lost = inc["evidence"]["lost_s"]
        assert inc["gpu_hours_lost"] == pytest.approx(64 * lost / 3600.0, abs=1e-6)
    # and the paging policy weighed that same cost, not the shard's share of it: the
    # reason an operator reads states the GPU-hours the event reports
    graded = [inc for inc in priced if "GPU-h lost" in inc["evidence"].get("policy", "")]
    assert graded
    for inc in graded:   # 3 significant digits there; lost_s is rounded to 1 ms here
        weighed = float(inc["evidence"]["policy"].split(" GPU-h lost")[0].split()[-1])
        assert weighed == pytest.approx(inc["gpu_hours_lost"], rel=0.01)


def _worker_like(events: list[dict], shard_ranks: int, partitions: int) -> list[dict]:
    """The events as the route stage cuts them (``shard_parts``, JSON in between), each
    partition ordering and judging what it got (``JobPartition``, ``ShardedDetector``)."""
    per: dict[int, list[dict]] = {}
    for i in range(0, len(events), 300):
        value = orjson.dumps(events[i:i + 300])
        parts = shard_parts(value, shard_ranks) or {0: value}
        for k, part in parts.items():
            per.setdefault(shard_partition("job0", k, partitions), []).extend(orjson.loads(part))
    out = []
    for p, evs in sorted(per.items()):
        state = JobPartition(p, detector_factory=lambda: ShardedDetector(shard_ranks=shard_ranks),
                             detector_restore=ShardedDetector.from_state)
        for j in range(0, len(evs), 500):
            out += state.ingest(evs[j:j + 500], j, now=0.0)
        out += state.tick(1e12)
    return out


def test_shards_on_separate_partitions_emit_what_detect_emits(stage_slow):
    # the telemetry has no rank: it stays with shard 0 here, so only the job's own events
    # are cut; the route stage sends telemetry to its host's shard (next test)
    job = [e for e in stage_slow if e["kind"] in ("step", "comm", "collective")]
    det = ShardedDetector(shard_ranks=32)
    expected = det.process_batch(job)
    got = _worker_like(job, 32, partitions=4)
    assert Counter(map(orjson.dumps, got)) == Counter(map(orjson.dumps, expected))
    assert expected


def test_the_route_cuts_a_large_jobs_messages_and_sends_telemetry_to_the_shard():
    router, cfg, topics, metrics = _router(partitions=4)
    router.shard_ranks = 8
    steps, gpu = cfg.topics.for_kind("step"), cfg.topics.for_kind("gpu")
    evs = [{"v": 1, "kind": "step", "job_id": "job5", "host": f"h{r // 4}", "rank": r,
            "world_size": 16} for r in range(16)]
    value = orjson.dumps(evs)
    sample = orjson.dumps([{"v": 1, "kind": "gpu", "host": "h3"}])
    asyncio.run(router.route_batch([_Msg(steps, b"job5", value), _Msg(gpu, b"h3", sample)],
                                   now=100.0))
    routed = _routed(topics["job"])
    home = home_partition("job5", 4)
    by_part = {p: orjson.loads(part[4]) for p, part in routed if part[0] == steps}
    assert by_part == {home: evs[:8], (home + 1) % 4: evs[8:]}
    assert all(part[2] for _, part in routed)             # each part reports its own errors
    # h3 holds ranks 12-15: shard 1
    assert [p for p, part in routed if part[4] == sample] == [(home + 1) % 4]
    assert topics["dead"].sent == []
    # and the other workers hear it at once on the host map (they route telemetry too)
    announced = {orjson.loads(m["value"])["host"]: orjson.loads(m["value"])["partition"]
                 for m in topics["hostmap"].sent}
    assert announced == {f"h{i}": home if i < 2 else (home + 1) % 4 for i in range(4)}
    asyncio.run(router.route_batch([_Msg(steps, b"job5", value)], now=101.0))
    assert len(topics["hostmap"].sent) == 4          # not again before ttl / 3


def test_a_small_jobs_message_goes_home_whole_and_undecoded():
    value = orjson.dumps([{"v": 1, "kind": "comm", "rank": r} for r in range(8)])
    assert shard_parts(value, 8) is None
    assert shard_parts(b"not json", 1) is None
    assert event_shard({"rank": "x"}, 4) == 0 and event_shard([], 4) == 0


def test_a_sharded_detectors_snapshot_restores_mid_stream(stage_slow):
    job = [e for e in stage_slow if e["kind"] in ("step", "comm", "collective")]
    cut = len(job) // 2
    whole = ShardedDetector(shard_ranks=32)
    expected = whole.process_batch(job)
    first = ShardedDetector(shard_ranks=32)
    got = first.process_batch(job[:cut])
    state = orjson.loads(orjson.dumps(first.state_dict()))
    again = ShardedDetector.from_state(state)
    assert isinstance(again, ShardedDetector) and again.shard_ranks == 32
    got += again.process_batch(job[cut:])
    assert got == expected


def _placed_split(events: list[dict], n: int, parts: int):
    """The events of a job in shards of ``n`` ranks as the route sends them: job events to
    their shard's partition; telemetry, first (hosts not placed yet: the first half) to
    every shard's partition, then to its host's. Also the host map."""
    part_of = {ev["host"]: shard_partition("job0", event_shard(ev, n), parts)
               for ev in events if ev["kind"] == "step"}
    hostmap = HostMap()
    for host, p in part_of.items():
        hostmap.add(host, p, 0.0)
    cut = len(events) // 2
    per: dict[int, list[list[dict]]] = {p: [[], []] for p in sorted(set(part_of.values()))}
    for i, ev in enumerate(events):
        half = int(i >= cut)
        if ev["kind"] in ("step", "comm", "collective"):
            per[shard_partition("job0", event_shard(ev, n), parts)][half].append(ev)
        else:
            for p in (per if not half else [part_of[ev["host"]]]):
                per[p][half].append(ev)
    return part_of, hostmap, per


def _live(state: JobPartition, events: list[dict], offset: int) -> list[dict]:
    out = []
    for j in range(0, len(events), 500):   # live: wall time goes with event time
        out += state.ingest(events[j:j + 500], offset + j,
                            now=events[min(j + 499, len(events) - 1)]["ts"])
    return out


def test_a_shards_snapshot_holds_only_its_own_hosts(stage_slow):
    # issue 16: at a job's start the route sends the telemetry of hosts it has not placed
    # yet to every partition. A shard's partition holds those samples in its input limits
    # (bounded, never in a snapshot) until one of its jobs names the host, so its
    # detector, and so its snapshot, only ever has its own hosts' device state, and the
    # shards' incidents are detect's, byte for byte.
    n, parts = 32, 4
    expected = ShardedDetector(shard_ranks=n).process_batch(stage_slow)
    part_of, hostmap, per = _placed_split(stage_slow, n, parts)
    assert len(per) == 2 and len(part_of) == 8
    got = []
    for p, (first, second) in per.items():
        own = {h for h, q in part_of.items() if q == p}
        assert {ev["host"] for ev in first if ev["kind"] == "gpu"} == set(part_of)
        state = JobPartition(p, detector_factory=lambda: ShardedDetector(shard_ranks=n),
                             detector_restore=ShardedDetector.from_state)
        got += _live(state, first, 0)
        snap = orjson.loads(orjson.dumps(state.snapshot()))
        assert ShardedDetector.from_state(snap["detector"]).device_hosts() == own
        assert prune_foreign_hosts(state, p, hostmap, now=0.0) == 0
        got += _live(state, second, len(first))
        got += state.tick(1e12)
        assert state.detector.device_hosts() == own
    assert Counter(map(orjson.dumps, got)) == Counter(map(orjson.dumps, expected))
    assert expected


def test_other_shards_hosts_that_reached_the_detector_leave_before_the_snapshot(stage_slow):
    # the same partitions fed past their input limits (as bench/streams_scale.py once
    # did, or a host whose job here ended and that now runs a job homed elsewhere): the
    # other shards' hosts reach the detector; the host map drops them before a snapshot
    n, parts = 32, 4
    part_of, hostmap, per = _placed_split(stage_slow, n, parts)
    for p, (first, _) in per.items():
        own = {h for h, q in part_of.items() if q == p}
        state = JobPartition(p, detector_factory=lambda: ShardedDetector(shard_ranks=n),
                             detector_restore=ShardedDetector.from_state)
        state._feed(sorted(first, key=lambda e: e["ts"]))
        assert state.detector.device_hosts() == set(part_of)
        assert prune_foreign_hosts(state, p, hostmap, now=0.0) == 8 - len(own)
        snap = orjson.loads(orjson.dumps(state.snapshot()))
        assert ShardedDetector.from_state(snap["detector"]).device_hosts() == own


def test_a_host_a_shard_runs_on_is_never_forgotten():
    det = ShardedDetector(shard_ranks=4)
    det.process_batch([{"v": 1, "kind": "gpu", "ts": 1.0, "host": h, "gpu": 0}
                       for h in ("a", "b")])
    det.jobs["j"] = type("J", (), {"rank_host": {0: "a"}})()
    assert det.forget_hosts(["a", "b", "c"]) == 1
    assert det.device_hosts() == {"a"}


def test_a_gpu_sample_naming_its_job_and_rank_places_its_host_at_once():
    # issue 16: a large job's hosts send telemetry before their first step is routed; the
    # GPU samples name job and rank, so the host goes to its shard's partition only
    router, cfg, topics, metrics = _router(partitions=4)
    router.shard_ranks = 8
    gpu, host_t = cfg.topics.for_kind("gpu"), cfg.topics.for_kind("host")
    named = orjson.dumps([{"v": 1, "kind": "gpu", "host": "h3", "gpu": g, "job_id": "job5",
                           "rank": 12 + g} for g in range(4)])
    hostload = orjson.dumps([{"v": 1, "kind": "host", "host": "h3"}])
    anon = orjson.dumps([{"v": 1, "kind": "gpu", "host": "h9", "gpu": 0}])
    asyncio.run(router.route_batch([_Msg(host_t, b"h3", hostload), _Msg(gpu, b"h3", named),
                                    _Msg(gpu, b"h9", anon)], now=100.0))
    routed = _routed(topics["job"])
    shard1 = (home_partition("job5", 4) + 1) % 4
    assert sorted(p for p, part in routed if part[4] == named) == [shard1]
    assert sorted(p for p, part in routed if part[4] == hostload) == [shard1]
    assert sorted(p for p, part in routed if part[4] == anon) == [0, 1, 2, 3]   # not placed
    assert [orjson.loads(m["value"]) for m in topics["hostmap"].sent] == [
        {"host": "h3", "partition": shard1}]
    assert metrics.unmapped._value.get() == 1


def test_a_hosts_step_batch_places_the_host_on_its_ranks_shard_only():
    # issue 31: a step_batch's rank is a column; read as an event with no int rank, every
    # host of a sharded job was placed on the job's home partition too, which then took
    # (decoded, ordered, judged) the telemetry of every host of the job
    router, cfg, topics, metrics = _router(partitions=4)
    router.shard_ranks = 8
    steps, host_t = cfg.topics.for_kind("step"), cfg.topics.for_kind("host")
    batches = [{"v": 1, "kind": "step_batch", "ts": [10.0 + r / 100 for r in rs],
                "job_id": "job5", "host": f"h{rs[0] // 4}", "rank": rs, "world_size": 16,
                "step": 0, "duration_s": [1.0] * 4} for rs in ([r, r + 1, r + 2, r + 3]
                                                               for r in range(0, 16, 4))]
    # h9 runs ranks of two shards (7 and 8): placed on both
    batches.append({"v": 1, "kind": "step_batch", "ts": [10.5, 10.6], "job_id": "job5",
                    "host": "h9", "rank": [7, 8], "world_size": 16, "step": 0,
                    "duration_s": [1.0, 1.0]})
    samples = {h: orjson.dumps([{"v": 1, "kind": "host", "host": h}])
               for h in ("h0", "h3", "h9")}
    asyncio.run(router.route_batch(
        [_Msg(steps, b"job5", orjson.dumps(batches)),
         *(_Msg(host_t, h.encode(), v) for h, v in samples.items())], now=100.0))
    home = home_partition("job5", 4)
    shard1 = (home + 1) % 4
    routed = _routed(topics["job"])
    where = {h: sorted(p for p, part in routed if part[4] == v) for h, v in samples.items()}
    assert where == {"h0": [home], "h3": [shard1], "h9": sorted({home, shard1})}
    announced = sorted((orjson.loads(m["value"])["host"], orjson.loads(m["value"])["partition"])
                       for m in topics["hostmap"].sent)
    assert announced == sorted([("h0", home), ("h1", home), ("h2", shard1), ("h3", shard1),
                                ("h9", home), ("h9", shard1)])
