"""The worker's job stage carries a host's columnar batches whole (issue 31, part 3): the
clock screen, the input caps, the ordering and the de-duplication read a batch's columns,
and the Detector gets the batch as `failslow detect` gives it. A batch with a row that
must be treated apart is cut: the bad rows go to dead letters with their reason, the
duplicate rows are dropped, the rest of the batch goes on. No broker: one JobPartition."""

from __future__ import annotations

import time
from collections import defaultdict

import orjson
from test_streams_partition import canon, run

from failslow.models.pipeline import Detector
from failslow.schema.batches import batch_trace, expand, to_batch
from failslow.schema.topics import key_for
from failslow.simulator import SCENARIOS, simulate
from failslow.streams.job_stage import decode_value
from failslow.streams.partition import JobPartition
from failslow.streams.rows import first_ts, rows_of

YEAR = 365 * 86400.0


class Recording(Detector):
    """A Detector that notes the kinds of what it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[str, int] = defaultdict(int)

    def process_batch(self, events):  # type: ignore[override]
        events = list(events)
        for ev in events:
            self.kinds[ev["kind"]] += 1
        return super().process_batch(events)


def messages(objs: list[dict], slice_s: float = 1.0) -> list[list[dict]]:
    """Objects grouped per (kind, key) per ``slice_s`` of ts (a batch at its first row's),
    like the Publisher's messages."""
    out, start = [], 0
    for n in range(1, len(objs) + 1):
        if n == len(objs) or first_ts(objs[n]) - first_ts(objs[start]) >= slice_s:
            groups: dict[tuple, list[dict]] = defaultdict(list)
            for e in objs[start:n]:
                groups[(e["kind"], key_for(e))].append(e)
            out += list(groups.values())
            start = n
    return out


def _trace(name: str) -> tuple[list[dict], list[dict]]:
    events = list(simulate(SCENARIOS[name], seed=0, grain="comm").events())
    return events, list(batch_trace(events))


def test_batches_reach_the_detector_whole_and_give_the_per_rank_incidents():
    events, batched = _trace("gpu_thermal_30")
    assert {"comm_batch", "gpu_batch"} <= {o["kind"] for o in batched}
    ref = run(messages(events))
    assert ref
    det = Recording()
    part = JobPartition(0, detector_factory=lambda: det)
    assert canon(run(messages(batched), part)) == canon(ref)
    assert det.kinds["comm_batch"] > 0 and det.kinds["gpu_batch"] > 0
    if any(o["kind"] == "step_batch" for o in batched):   # a host's step ends, whole too
        assert det.kinds["step_batch"] > 0
    # per rank only what the input caps held at the job's start (its probation, the
    # samples of its hosts until its steps named them) and then took row by row
    ranks = len({e["rank"] for e in events if e["kind"] == "comm"})
    assert det.kinds["comm"] <= ranks
    assert det.kinds["comm"] + det.kinds["gpu"] < len(events) / 20
    assert part.counts["events"] == len(events)
    assert part.counts["duplicates"] == 0


def test_the_job_stage_decode_keeps_a_valid_batch_whole():
    _, batched = _trace("gpu_thermal_30")
    comm = [o for o in batched if o["kind"] == "comm_batch"][:2]
    got, errors = decode_value(orjson.dumps(comm), frozenset(("comm", "collective")))
    assert errors == [] and got == comm and rows_of(got) == sum(len(b["rank"]) for b in comm)


def test_a_message_sent_twice_is_dropped_whole_and_a_batch_with_one_new_row_is_cut():
    events, batched = _trace("input_stall_50")
    msgs = messages(batched)
    doubled = [m for pair in zip(msgs, msgs, strict=True) for m in pair]
    part = JobPartition(0)
    assert canon(run(doubled, part)) == canon(run(messages(events)))
    assert part.counts["duplicates"] == len(events)
    # a host's GPU batch sent again with one row newer: only that row goes on
    gpu = next(o for o in batched if o["kind"] == "gpu_batch")
    rows = expand(gpu)
    det = Recording()
    part = JobPartition(0, detector_factory=lambda: det)
    part._feed([gpu])
    again = to_batch([*rows[:-1], dict(rows[-1], ts=rows[-1]["ts"] + 1.0)])
    taken: list[dict] = []
    det.process_batch = lambda evs: taken.extend(evs) or []  # type: ignore[method-assign]
    part._feed([again])
    assert part.counts["duplicates"] == len(rows) - 1
    assert [expand(b) for b in taken] == [[dict(rows[-1], ts=rows[-1]["ts"] + 1.0)]]


def test_restore_from_a_snapshot_and_replay_of_batches_is_exact():
    _, batched = _trace("gpu_thermal_30")
    # step batches included: one sits at its newest row, and a replay must not skip its
    # older rows below the snapshot's watermark (they were never handed on: a step lost)
    assert any(o["kind"] == "step_batch" for o in batched)
    msgs = messages(batched)
    ref = run(msgs)
    first = JobPartition(0)
    emitted = []
    cut = len(msgs) // 2
    for off, m in enumerate(msgs[:cut]):
        emitted += first.ingest(m, off, now=off * 0.01)
    snap = orjson.loads(orjson.dumps(first.snapshot()))   # comm rows at their marks digested
    assert snap["at_mark"]
    second = JobPartition(0)
    second.restore(snap)
    for inc in emitted:
        second.remember(inc)
    resumed = run(msgs, second, start=max(0, snap["o_min"] - 10))
    assert canon(emitted + resumed) == canon(ref)
    assert second.counts["replay_skipped"] > 0


def test_a_row_stamped_far_ahead_is_dead_lettered_and_the_rest_of_its_batch_judged():
    """The job stage: the row too far ahead goes to the dead-letter topic alone, with its
    reason and its batch's topic and key; its batch's other rows go on to the Detector."""
    from failslow.streams.config import WorkerConfig
    from failslow.streams.job_stage import JobStage
    from failslow.streams.metrics import Metrics
    from failslow.streams.routing import HostMap, pack

    now = time.time()
    rows = [{"v": 1, "kind": "gpu", "ts": now - 1.0, "host": "h7", "gpu": g,
             "uuid": f"GPU-{g}", "sm_clock_mhz": 1980.0} for g in range(8)]
    rows[3]["ts"] = now + YEAR
    batch = to_batch(rows)
    metrics = Metrics()
    cfg = WorkerConfig(bootstrap="unused:1")
    stage = JobStage(cfg, 4, None, metrics, HostMap(), None)  # type: ignore[arg-type]
    state = stage.new_partition(1)
    seen: list[dict] = []
    state.limits.admit = lambda evs, placed=False: seen.extend(evs) or evs  # type: ignore
    topic = cfg.topics.for_kind("gpu")
    msg = pack([(topic, now, True, b"h7", orjson.dumps([batch]))])
    stage.announced[1] = {}
    sends = stage.judge_message(state, 1, msg, 0, now, stage.announced[1])
    dead = [s for s in sends if s[0] == "dead"]
    assert len(dead) == 1
    _, why, src, key, raw = dead[0]
    assert src == topic and key == b"h7" and orjson.loads(raw) == rows[3]
    assert "h7" in why and "ahead of the worker's clock" in why
    assert [r["gpu"] for b in seen for r in expand(b)] == [0, 1, 2, 4, 5, 6, 7]
    assert seen[0]["kind"] == "gpu_batch"
    assert metrics.clock_ahead.labels("dead_lettered")._value.get() == 1


def test_a_real_worker_judges_batched_input_as_detect_judges_the_per_rank_events(broker,
                                                                                 topics):
    """On the real broker: two scenarios published as host agents publish them (a
    comm_batch / gpu_batch / nic_batch per host and window); the worker's incidents are
    `failslow detect`'s on the per-rank events."""
    from test_streams_worker import brief, reference
    from test_streams_worker import canon as canon_counts

    from failslow.collectors.publisher import Publisher
    from failslow.stack import free_port
    from failslow.worker_process import WorkerProcess, wait_for_incidents

    events, ref = [], []
    for name in ("gpu_thermal_30", "slow_link_pair_3x"):
        evs = []
        for ev in simulate(SCENARIOS[name], seed=0, grain="comm").events():
            ev = dict(ev)
            if ev.get("job_id") is not None:
                ev["job_id"] = f"{name}.{ev['job_id']}"
            ev["host"] = f"{name}-{ev['host']}"
            evs.append(ev)
        events += evs
        ref += reference(evs)
    assert ref
    events.sort(key=lambda e: e["ts"])
    objs = list(batch_trace(events))
    assert any(o["kind"] == "comm_batch" for o in objs)
    pub = Publisher(broker.bootstrap, topics)
    start = 0
    for n in range(1, len(objs) + 1):
        if n == len(objs) or first_ts(objs[n]) - first_ts(objs[start]) >= 1.0:
            pub.publish(objs[start:n])
            start = n
    assert pub.flush(15) == 0
    pub.close()
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g",
                           metrics_port=free_port())
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=120)
    finally:
        assert worker.stop() == 0
    assert brief(got) == brief(ref)
    assert canon_counts(got) == canon_counts(ref)
