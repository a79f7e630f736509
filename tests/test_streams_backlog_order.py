"""A backlog whose device samples reach a partition long before the job's steps (issue 16).

Reading a backlog, the consumer can reach the telemetry topics many seconds before the
steps and comm windows of the same job (a 16,384-rank job in 32 shards: more than 10 s).
The samples of hosts the route placed on the partition wait for those steps: released
after ``lateness`` wall seconds instead, they moved the watermark past every step still
on its way, the steps arrived late, out of order, and the incidents were no longer the
ones ``failslow detect`` gives. Live samples are still released after ``lateness`` (the
steps they explain are newer), and a backlog's after at most 6 x ``lateness``."""

from __future__ import annotations

from test_streams_partition import canon, messages, trace

from failslow.models.pipeline import TELEMETRY_KINDS, Detector
from failslow.streams.ordering import HOLD_LATENESS
from failslow.streams.partition import JobPartition

LATENESS = 10.0


def backlog(gap_s: float, placed: bool) -> tuple[list[dict], JobPartition]:
    """All telemetry messages first, then the job's messages ``gap_s`` wall seconds later,
    the timer ticking every 0.25 s meanwhile; the wall clock a day after the events."""
    events = trace()
    msgs = messages(events)
    tel = [m for m in msgs if m[0]["kind"] in TELEMETRY_KINDS]
    job = [m for m in msgs if m[0]["kind"] not in TELEMETRY_KINDS]
    wall = max(e["ts"] for e in events) + 86400.0
    part, out, off = JobPartition(0, lateness=LATENESS), [], 0
    for m in tel:
        out += part.ingest(m, off, now=wall, placed=placed)
        off += 1
        wall += 0.001
    end = wall + gap_s
    while wall < end:
        wall += 0.25
        out += part.tick(wall)
    for m in job:
        out += part.ingest(m, off, now=wall)
        out += part.tick(wall)
        off += 1
        wall += 0.001
    return out + part.tick(wall + 1e6), part


def test_placed_samples_wait_for_steps_that_come_after_lateness():
    ref = Detector().process_batch(trace())
    assert ref
    out, part = backlog(gap_s=2 * LATENESS, placed=True)
    assert part.counts["late"] == 0
    assert canon(out) == canon(ref)


def test_live_samples_are_released_after_lateness():
    # live (the samples are seconds old): the steps they explain are newer than them, so
    # they wait only ``lateness`` for the job's steps, as before
    events = trace()
    tel = [m for m in messages(events) if m[0]["kind"] in TELEMETRY_KINDS]
    part = JobPartition(0, lateness=LATENESS)
    for off, m in enumerate(tel[:50]):
        part.ingest(m, off, now=max(e["ts"] for e in m) + 1.0, placed=True)
    wall = max(e["ts"] for m in tel[:50] for e in m) + 1.0
    assert part.tick(wall) == []
    held = part.buffered
    part.tick(wall + LATENESS + 1.0)
    assert 0 <= part.buffered < held / 2


def test_placed_samples_wait_a_bounded_time():
    events = trace()
    tel = [m for m in messages(events) if m[0]["kind"] in TELEMETRY_KINDS]
    wall = max(e["ts"] for e in events) + 86400.0
    part = JobPartition(0, lateness=LATENESS)
    for off, m in enumerate(tel):
        part.ingest(m, off, now=wall, placed=True)
    assert part.tick(wall + 2 * LATENESS) == [] and part.buffered > 0
    part.tick(wall + HOLD_LATENESS * LATENESS + 1.0)
    assert part.buffered == 0


def starved(busy: bool) -> tuple[list[dict], JobPartition]:
    """A backlog whose partition gets nothing for 5 wall seconds halfway
    (more than ``idle_s``, 2 s), while the worker is busy with other partitions or not."""
    events = trace()
    # the steps topic read 1 s of event time behind the others, as a consumer does
    msgs = sorted(messages(events), key=lambda m: m[-1]["ts"] + (m[0]["kind"] == "step"))
    wall = max(e["ts"] for e in events) + 86400.0
    part, out = JobPartition(0, lateness=LATENESS), []
    for off, m in enumerate(msgs):
        if off == len(msgs) // 2:
            end = wall + 5.0
            while wall < end:
                wall += 0.25
                out += part.tick(wall, busy)
        out += part.ingest(m, off, now=wall, placed=True)
        out += part.tick(wall, True)
        wall += 0.001
    return out + part.tick(wall + 1e6), part


def test_a_starved_partition_of_a_busy_worker_keeps_its_order():
    ref = Detector().process_batch(trace())
    out, part = starved(busy=True)
    assert part.counts["late"] == 0
    assert canon(out) == canon(ref)


def test_an_idle_worker_releases_a_silent_partition():
    _, part = starved(busy=False)
    assert part.counts["late"] > 0      # everything held went out; what came later is late


def bursts(events: list[dict], every_s: float, drop_rank: int | None = None,
           busy: bool = True) -> tuple[list[dict], JobPartition]:
    """A backlog read at the pace of event time (1 s of it per wall second) whose steps
    topic is read in bursts every ``every_s`` wall seconds (the worker busy with the other
    topics meanwhile), the timer ticking every 0.25 s; ``drop_rank``: that rank's steps
    stop halfway (it left the job)."""
    msgs = messages(events)
    ts0 = events[0]["ts"]
    half = (events[0]["ts"] + events[-1]["ts"]) / 2
    wall0 = events[-1]["ts"] + 86400.0
    arrivals = []
    for n, m in enumerate(msgs):
        if drop_rank is not None and m[0]["kind"] == "step":
            m = [e for e in m if e["rank"] != drop_rank or e["ts"] < half]
            if not m:
                continue
        t = max(e["ts"] for e in m) - ts0
        if m[0]["kind"] == "step" and t >= every_s:   # the first ones in time
            t = every_s * (t // every_s + 1)
        arrivals.append((wall0 + t, n, m))
    arrivals.sort(key=lambda a: a[:2])
    part, out, wall = JobPartition(0, lateness=LATENESS), [], wall0
    for off, (t, _, m) in enumerate(arrivals):
        while wall + 0.25 < t:
            wall += 0.25
            out += part.tick(wall, busy)
        wall = max(wall, t)
        out += part.ingest(m, off, now=wall)
    return out + part.tick(wall + 1e6), part


def test_a_steps_topic_read_in_bursts_keeps_its_sources():
    # 20 s between two reads of the steps topic, more than ``lateness``: its sources are
    # behind and silent, but their topic is silent too, so they still hold the watermark
    events = trace()
    ref = Detector().process_batch(events)
    out, part = bursts(events, every_s=2 * LATENESS)
    assert part.counts["late"] == 0
    assert canon(out) == canon(ref)


def test_a_rank_that_left_no_longer_holds_the_watermark():
    # its topic keeps delivering the other ranks' steps: the rank is dropped, and the
    # steps after it left are judged before the backlog ends
    events = trace()
    out, part = bursts(events, every_s=0.5, drop_rank=5)
    assert part.buffered < 0.2 * len(events)
    assert out
