"""A producer whose clock is far off harms only its own events (issue 33 item 1).

A live partition (its wall clock follows the events) carries a faulty job; mid-fault, two
step events of an unrelated job stamped a year ahead land on it, then a second job starts.
Before the fix the Detector's event time jumped a year: the open incident resolved "job
ended", a new incident id opened (a second page), the second job's events were all handed
over out of time order, and the snapshot carried it all over a restart.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from test_streams_partition import canon, messages

from failslow.simulator import SCENARIOS, simulate
from failslow.simulator.relocate import relocate
from failslow.streams.clocks import CLOCK_WARN_S
from failslow.streams.partition import JobPartition

YEAR = 365 * 86_400.0


class Wall:
    """The worker's wall clock in a live stream: just after the newest event it saw."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def cluster(telemetry: bool = True) -> list[dict]:
    """A faulty job (its incident opens 33 s in, escalates at 105 s) and a second faulty
    job starting 70 s later on other hosts, in ts order; ``telemetry`` False: their step
    and comm events only."""
    a = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0).events())
    b = [relocate(e, 70.0, "b") for e in simulate(SCENARIOS["gpu_power_20"], seed=1).events()]
    return sorted((e for e in a + b if telemetry or e["kind"] in ("step", "comm")),
                  key=lambda e: e["ts"])


def rogue(events: list[dict], at: float, ahead: float) -> list[dict]:
    """Two step events of an unrelated job whose host's clock is ``ahead`` s ahead."""
    step = next(e for e in events if e["kind"] == "step")
    return [dict(step, job_id="rogue", host="rogue-host", rank=0, world_size=1, step=s,
                 ts=at + ahead + s) for s in range(2)]


def feed(msgs: list[list[dict]], part: JobPartition, wall: Wall, start: int = 0,
         end: int | None = None) -> list[dict]:
    """Feed ``msgs[start:end]`` live: each arrives 50 ms after its newest event (the wall
    clock never follows an event from the future), with ticks every 0.25 s between them;
    without ``end``, the partition then idles."""
    out: list[dict] = []
    tick = None
    for off, m in enumerate(msgs[start:end], start):
        honest = [e["ts"] for e in m if e.get("job_id") != "rogue"]
        now = max(max(honest, default=wall.t) + 0.05, wall.t)
        tick = now if tick is None else tick
        while tick + 0.25 < now:
            tick += 0.25
            wall.t = tick
            out += part.tick(tick)
        wall.t = now
        out += part.ingest(m, off, now=now)
    if end is not None:
        return out
    wall.t += 30.0
    return out + part.tick(wall.t)


def with_rogue(events: list[dict], ahead: float) -> tuple[list[list[dict]], int]:
    """The messages with the rogue message inserted 60 s into the first job's fault."""
    msgs = messages(events)
    at = events[0]["ts"] + 60.0
    k = next(n for n, m in enumerate(msgs) if m[0]["ts"] >= at)
    return msgs[:k] + [rogue(events, msgs[k][0]["ts"], ahead)] + msgs[k:], k


@pytest.mark.parametrize("telemetry", [True, False])
def test_a_year_ahead_clock_of_another_job_changes_nothing_else(caplog, telemetry):
    # Before the fix: with telemetry, 6,655 of the other jobs' events handed over out of
    # time order; without, the open incident resolved "job ended" and re-opened as
    # job0:slow_rank:r5:68, and 12,585 events out of order.
    events = cluster(telemetry)
    wall = Wall()
    ref_part = JobPartition(0, clock=wall)
    ref = feed(messages(events), ref_part, wall)
    assert any(i["status"] == "open" and i["job_id"] == "job0" for i in ref)
    assert not any(i.get("resolved_reason") == "job ended" for i in ref)

    msgs, k = with_rogue(events, YEAR)
    wall = Wall()
    part = JobPartition(0, clock=wall)
    with caplog.at_level(logging.WARNING, logger="failslow.worker"):
        got = feed(msgs, part, wall)
    assert not any(i.get("resolved_reason") == "job ended" for i in got)
    assert {i["incident_id"] for i in got} == {i["incident_id"] for i in ref}
    assert canon(got) == canon(ref)
    # the second job's events kept their time order
    assert part.counts["late"] == ref_part.counts["late"]
    # flagged: counted, a dead letter with the reason per event, one warning naming them
    assert part.counts["clock_ahead"] == 2
    rejected = part.take_rejected()
    assert [ev["step"] for _, ev in rejected] == [0, 1]
    assert all("rogue-host" in why and "rogue" in why and "ahead" in why for why, _ in rejected)
    assert part.take_rejected() == []
    warned = [r.getMessage() for r in caplog.records if "ahead" in r.getMessage()]
    assert len(warned) == 1 and "rogue-host" in warned[0] and "job rogue" in warned[0]


def test_a_far_ahead_clock_does_not_survive_a_restart():
    events = cluster()
    wall = Wall()
    ref = feed(messages(events), JobPartition(0, clock=wall), wall)
    msgs, k = with_rogue(events, YEAR)
    wall = Wall()
    first = JobPartition(0, clock=wall)
    cut = k + 40
    emitted = feed(msgs, first, wall, end=cut)
    snap = orjson.loads(orjson.dumps(first.snapshot()))
    assert snap["wm"] is None or snap["wm"] < wall.t + CLOCK_WARN_S
    second = JobPartition(0, clock=wall)
    second.restore(snap)
    for inc in emitted:
        second.remember(inc)
    resumed = feed(msgs, second, wall, start=snap["o_min"])
    assert canon(emitted + resumed) == canon(ref)
    assert not any(i.get("resolved_reason") == "job ended" for i in resumed)


def test_a_clock_minutes_ahead_is_dead_lettered_and_seconds_ahead_only_warned(caplog):
    events = cluster()
    for ahead, dead in ((120.0, 2), (3 * CLOCK_WARN_S, 0)):
        msgs, _ = with_rogue(events, ahead)
        wall = Wall()
        part = JobPartition(0, clock=wall)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="failslow.worker"):
            feed(msgs, part, wall)
        assert part.counts["clock_ahead"] == dead
        assert part.counts["clock_skewed"] == 2 - dead
        assert len(part.take_rejected()) == dead
        assert any("rogue-host" in r.getMessage() for r in caplog.records)


def test_the_job_stage_dead_letters_them_and_counts_them():
    """The worker's job stage sends each such event to the dead-letter topic (the event
    alone, with its reason) and counts it in failslow_stream_clock_ahead_events_total."""
    import time

    from failslow.streams.config import WorkerConfig
    from failslow.streams.job_stage import JobStage
    from failslow.streams.metrics import Metrics
    from failslow.streams.routing import HostMap, pack

    metrics = Metrics()
    cfg = WorkerConfig(bootstrap="unused:1")
    stage = JobStage(cfg, 4, None, metrics, HostMap(), None)  # type: ignore[arg-type]
    state = stage.new_partition(1)
    now = time.time()
    step = {"v": 1, "kind": "step", "job_id": "rogue", "rank": 0, "world_size": 1,
            "host": "rogue-host", "duration_s": 1.0, "gpu": 0}
    evs = [dict(step, step=0, ts=now - 1.0), dict(step, step=1, ts=now + YEAR),
           dict(step, step=2, ts=now + 2 * CLOCK_WARN_S)]
    topic = cfg.topics.for_kind("step")
    msg = pack([(topic, now, True, b"rogue", orjson.dumps(evs))])
    stage.announced[1] = {}
    sends = stage.judge_message(state, 1, msg, 0, now, stage.announced[1])
    dead = [s for s in sends if s[0] == "dead"]
    assert len(dead) == 1
    _, why, src, key, raw = dead[0]
    assert src == topic and key == b"rogue" and orjson.loads(raw)["step"] == 1
    assert "rogue-host" in why and "ahead of the worker's clock" in why
    ahead = metrics.clock_ahead
    assert ahead.labels("dead_lettered")._value.get() == 1
    assert ahead.labels("judged")._value.get() == 1
    # --max-clock-ahead is at most a quarter of --job-idle
    assert JobStage(WorkerConfig(bootstrap="unused:1", job_idle=20.0), 4, None, metrics,
                    HostMap(), None).new_partition(0).clocks.max_ahead_s == 5.0  # type: ignore[arg-type]


@pytest.mark.integration
def test_a_real_worker_dead_letters_a_year_ahead_job_and_judges_the_rest(broker, topics):
    """On the real broker: the year-ahead events, published mid-trace, are on the
    dead-letter topic with their reason and counted; the job they landed beside gets the
    offline Detector's incidents."""
    import time

    from test_streams_worker import brief, dead_letters, metric, publish

    from failslow.models.pipeline import Detector
    from failslow.stack import free_port
    from failslow.worker_process import WorkerProcess, wait_for_incidents

    events = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0).events())
    ref = Detector().process_batch(events)
    mid = len(events) // 2
    bad = rogue(events, time.time(), YEAR)
    publish(broker, topics, events[:mid] + bad + events[mid:])
    port = free_port()
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g", metrics_port=port)
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
        assert brief(got) == brief(ref)
        dead = dead_letters(broker.bootstrap, topics)
        ahead = [d for d in dead if "ahead of the worker's clock" in d["error"]]
        assert sorted(orjson.loads(d["raw"])["step"] for d in ahead) == [0, 1]
        assert all("rogue-host" in d["error"] for d in ahead)
        assert metric(port, 'failslow_stream_clock_ahead_events_total{action="dead_lettered"}') == 2
    finally:
        assert worker.stop() == 0
