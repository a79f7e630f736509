"""comm summaries in the stream: routed to their job's home partition by a job_id key
(the collectives topic also carries job_id/group keys), handed to the Detector in
event-time order like every other kind, de-duplicated, restored exactly from a
snapshot, capped by the groups their ops name, and dead-lettered when an ops entry
is malformed."""

from __future__ import annotations

from collections import defaultdict

import orjson
import pytest
from test_streams_partition import canon, interleave, messages, run, trace

from failslow.collectors.comm_windows import comm_record, summarize
from failslow.models.pipeline import Detector
from failslow.schema import Topics, encode
from failslow.streams.app import decode_value
from failslow.streams.limits import InputLimits
from failslow.streams.partition import JobPartition, source_mark
from failslow.streams.routing import home_partition, job_of_key, lead_kind


def to_comm(events: list[dict]) -> list[dict]:
    """A collective-grain trace at comm grain: each rank's collectives of a step summed
    into one window that closes at the step's end (blocked time = op duration). A trace
    already at comm grain is returned as it is."""
    if any(e["kind"] == "comm" for e in events):
        return events
    ops: dict[tuple, list[dict]] = defaultdict(list)
    out, last_end = [], {}
    for ev in events:
        if ev["kind"] == "collective":
            ops[(ev["job_id"], ev["rank"], ev["step"])].append(ev)
    for ev in events:
        if ev["kind"] == "collective":
            continue
        out.append(ev)
        if ev["kind"] == "step":
            done = ops.pop((ev["job_id"], ev["rank"], ev["step"]), [])
            start = last_end.get((ev["job_id"], ev["rank"]), ev["ts"] - ev["duration_s"])
            last_end[(ev["job_id"], ev["rank"])] = ev["ts"]
            out.append(comm_record(ev["job_id"], ev["rank"], ev["host"], start, ev["ts"],
                                   summarize(done, [d["duration_s"] for d in done]),
                                   step=ev["step"], step_end=True,
                                   world_size=ev["world_size"], gpu=ev.get("gpu")))
    return out


class Recorder:
    """A Detector stand-in that keeps what it is handed."""

    telemetry_delay_s = 0.0

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def process_batch(self, events):
        self.seen += events
        return []

    def state_dict(self):
        return {}


def comm_trace() -> list[dict]:
    """The simulator's comm grain (windows inside steps too), or a converted trace."""
    return to_comm(trace())


def test_the_key_of_comm_is_the_job_and_the_lead_tells_the_kinds_apart():
    comm = comm_trace()
    c = next(e for e in comm if e["kind"] == "comm")
    value = encode([c, c])
    assert lead_kind(value) == "comm" and lead_kind(encode(c)) == "comm"
    # a job id with "/" is not cut as if it were a collective key
    assert job_of_key("team-a/job7", value) == "team-a/job7"
    coll = encode({"v": 1, "kind": "collective", "job_id": "team-a/job7", "group": "dp0"})
    assert job_of_key("team-a/job7/dp0", coll) == "team-a/job7"
    # an unknown lead (keys in another order) or no key: the worker reads the value
    assert job_of_key("team-a/job7", orjson.dumps({"ts": 1.0, "v": 1, "kind": "comm"})) is None
    assert job_of_key("", value) is None
    assert home_partition(job_of_key("j", value) or "", 8) == home_partition("j", 8)


def test_comm_messages_give_the_offline_incidents_in_any_interleaving():
    events = comm_trace()
    assert sum(e["kind"] == "comm" for e in events) > 100
    ref = Detector().process_batch(events)
    msgs = messages(events)
    for seed in (1, 2):
        assert canon(run(interleave(msgs, seed))) == canon(ref)


def test_every_comm_window_reaches_the_detector_once_in_each_rank_s_order():
    events = comm_trace()
    msgs = messages(events)
    doubled = [m for pair in zip(msgs, msgs, strict=True) for m in pair]
    part = JobPartition(0, detector_factory=Recorder)
    run(interleave(doubled, 3), part)
    seen = [e for e in part.detector.seen if e["kind"] == "comm"]
    want = [e for e in events if e["kind"] == "comm"]
    assert sorted(map(orjson.dumps, seen)) == sorted(map(orjson.dumps, want))
    by_rank: dict[tuple, list[float]] = defaultdict(list)
    for e in seen:
        by_rank[source_mark(e)[0]].append(e["ts"])
    assert all(ts == sorted(ts) for ts in by_rank.values())
    assert part.counts["duplicates"] == len(events)


def test_restore_from_snapshot_and_replay_is_exact_with_comm():
    msgs = messages(comm_trace())
    ref = run(msgs)
    first = JobPartition(0)
    emitted = []
    cut = len(msgs) // 2
    for off, m in enumerate(msgs[:cut]):
        emitted += first.ingest(m, off, now=off * 0.01)
    snap = orjson.loads(orjson.dumps(first.snapshot()))
    assert any(src[0] == "comm" for src, _ in snap["marks"])
    second = JobPartition(0)
    second.restore(snap)
    for inc in emitted:
        second.remember(inc)
    # a retry of a comm message from before the snapshot is dropped at once
    retry = [m for m in msgs[:cut] if m[0]["kind"] == "comm" and m[-1]["ts"] < first.wm][-1]
    second.ingest(retry, snap["o_next"], now=cut * 0.01)
    assert second.counts["duplicates"] == len(retry)
    resumed = run(msgs, second, start=max(0, snap["o_min"] - 10))
    assert canon(emitted + resumed) == canon(ref)


def test_the_groups_cap_counts_the_groups_a_comm_record_names():
    c = next(e for e in comm_trace() if e["kind"] == "comm" and e["ops"])
    c = dict(c, ops=[c["ops"][0], dict(c["ops"][0], group="tp-other")])
    limits = InputLimits(max_groups_per_job=1, probation_s=0.0)
    later = dict(c, ts=c["ts"] + 2.0, window_start_ts=c["ts"])
    out = limits.admit([c, later])
    assert out == [] and limits.counts["groups_per_job"] == 2


def test_a_malformed_ops_entry_is_a_dead_letter_and_the_others_go_on():
    comm = [e for e in comm_trace() if e["kind"] == "comm" and e["ops"]][:3]
    bad = dict(comm[1], ops=[dict(comm[1]["ops"][0], n=0)])
    topics = Topics()
    good, errors = decode_value(encode([comm[0], bad, comm[2]]),
                                topics.kinds_of(topics.for_kind("comm")))
    assert good == [comm[0], comm[2]]
    assert errors == ["[1] comm.ops[0].n: 0 is below 1"]
    good, errors = decode_value(b'{"v":1,"kind":"comm","ops":[{"n":1}]}',
                                topics.kinds_of(topics.for_kind("comm")))
    assert good == [] and errors == ["comm.ts: required field is missing"]


@pytest.mark.integration
def test_a_worker_on_comm_grain_matches_offline_detection(broker, topics):
    from confluent_kafka import Producer
    from test_streams_worker import acting, brief, canon, dead_letters, publish, scenario_events

    from failslow.worker_process import WorkerProcess, wait_for_incidents

    events, ref = [], []
    for name in ("gpu_thermal_30", "input_stall_50"):
        # "team/<scenario>": a job id with "/" must not be cut like a collective key
        evs = to_comm(scenario_events(name, f"team/{name}"))
        events += evs
        ref += acting(Detector(), evs)     # the worker plans actions (issue 32)
    assert ref and sum(e["kind"] == "comm" for e in events) > 100
    events.sort(key=lambda e: e["ts"])
    publish(broker, topics, events)
    bad = next(e for e in events if e["kind"] == "comm" and e["ops"])
    bad = dict(bad, ops=[dict(bad["ops"][0], min_s=1.0, max_s=0.5)])
    raw = Producer({"bootstrap.servers": broker.bootstrap})
    raw.produce(topics.for_kind("comm"), encode([bad]), key=bad["job_id"].encode())
    assert raw.flush(10) == 0
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g")
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
    finally:
        assert worker.stop() == 0
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)
    dead = dead_letters(broker.bootstrap, topics)
    assert [(d["topic"], d["error"]) for d in dead] == [
        (topics.for_kind("comm"), "[0] comm.ops[0]: min_s 1.0 is above max_s 0.5")]


def test_at_equal_ts_a_rank_s_closing_window_is_released_before_its_step():
    # The window that closes step 7 has the step event's ts; they come from two topics,
    # in either order, and the Detector gets the window first either way.
    step = {"v": 1, "kind": "step", "ts": 100.0, "job_id": "j", "rank": 0, "world_size": 1,
            "host": "h0", "step": 7, "duration_s": 1.0}
    window = comm_record("j", 0, "h0", 99.0, 100.0, [], step=7, step_end=True)
    for first, second in ((step, window), (window, step)):
        part = JobPartition(0, detector_factory=Recorder,
                            limits=InputLimits(probation_s=0.0))
        part.ingest([first], 0, now=0.0)
        part.ingest([second], 1, now=0.01)
        part.tick(1e9)
        assert [e["kind"] for e in part.detector.seen] == ["comm", "step"]


def test_one_window_sent_as_several_records_is_kept_and_a_retry_of_each_dropped():
    # A window past OPS_MAX entries, or ops of two steps closed together, comes as
    # several records with the same (ts, window_start_ts): each is new, once.
    entry = {"group": "dp0", "group_size": 2, "op": "allreduce", "n": 1, "blocked_s": 0.1,
             "min_s": 0.1, "max_s": 0.1, "bytes": 8}
    parts = [comm_record("j", 0, "h0", 99.0, 100.0, [dict(entry, group=f"g{i}")], step=7,
                         step_end=i == 1) for i in range(2)]
    other_step = comm_record("j", 0, "h0", 99.0, 100.0, [entry], step=8)
    part = JobPartition(0, detector_factory=Recorder, limits=InputLimits(probation_s=0.0))
    part.ingest(parts, 0, now=0.0)
    part.ingest([other_step, parts[0]], 1, now=0.01)   # a retry of the first part
    part.ingest([dict(parts[1]), dict(other_step)], 2, now=0.02)  # retries, equal content
    part.tick(1e9)
    assert part.detector.seen == [*parts, other_step]
    assert part.counts["duplicates"] == 3
