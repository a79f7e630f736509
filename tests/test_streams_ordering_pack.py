"""A large ordering buffer keeps its chunks as JSON bytes (issue 16: a 131,072-rank job
read as a backlog held 3 M decoded events per worker). Packed or not, the Detector gets
the same events in the same order, so the incidents are the same."""

from __future__ import annotations

from test_streams_backlog_order import LATENESS, backlog, starved
from test_streams_partition import canon, messages, trace

import failslow.streams.ordering as ordering
from failslow.models.pipeline import TELEMETRY_KINDS, Detector
from failslow.streams.partition import JobPartition


def test_packed_chunks_give_the_detectors_incidents(monkeypatch):
    ref = Detector().process_batch(trace())
    assert ref
    packed = []
    pack = ordering.pack

    def spy(events):
        out = pack(events)
        packed.append(type(out) is bytes)
        return out

    monkeypatch.setattr(ordering, "PACK_ABOVE", 0)
    monkeypatch.setattr(ordering, "pack", spy)
    out, part = backlog(gap_s=2 * LATENESS, placed=True)
    assert packed and all(packed)
    assert part.counts["late"] == 0 and part.buffered == 0
    assert canon(out) == canon(ref)
    # released in slices as the watermark moves (chunks cut at the watermark, unpacked)
    out, part = starved(busy=True)
    assert part.counts["late"] == 0
    assert canon(out) == canon(ref)


def test_only_a_large_buffer_packs(monkeypatch):
    tel = [m for m in messages(trace()) if m[0]["kind"] in TELEMETRY_KINDS]
    wall = max(e["ts"] for m in tel for e in m) + 86400.0
    part = JobPartition(0, lateness=LATENESS)
    n = sum(map(len, tel))
    monkeypatch.setattr(ordering, "PACK_ABOVE", n // 2)
    for off, m in enumerate(tel):   # a backlog's samples wait for the steps
        part.ingest(m, off, now=wall, placed=True)
    kinds = [type(c.events) for c in sorted(part.order._buf, key=lambda c: c.seq)]
    assert part.buffered == n
    assert kinds[0] is list and kinds[-1] is bytes and kinds.count(bytes) < len(kinds)


def test_events_that_do_not_serialize_stay_decoded():
    big = [{"kind": "step", "ts": 1.0, "n": 1 << 70}]
    assert ordering.pack(big) is big
    small = [{"kind": "step", "ts": 1.0, "n": 3}]
    assert type(ordering.pack(small)) is bytes


def test_pooled_samples_are_held_as_json_and_come_back_equal():
    from failslow.streams.limits import InputLimits
    lim = InputLimits(probation_s=0.0)
    sample = {"kind": "gpu", "ts": 10.25, "host": "h1", "gpu": 0, "sm_clock_mhz": 1410.0,
              "xid": [79], "power_w": 301.123456789, "job_id": "j", "rank": 3}
    assert lim.admit([sample]) == [] and lim.pooled == 1
    assert all(type(ev) is bytes for held in lim._unknown.values() for _, ev in held)
    step = {"kind": "step", "ts": 11.0, "job_id": "j", "rank": 3, "host": "h1", "step": 0}
    out = lim.admit([step, {**step, "ts": 12.0, "step": 1}])
    assert out[0] == sample and lim.pooled == 0


def test_packed_bytes_take_their_length_not_orjsons_buffer():
    import tracemalloc

    from failslow.streams.limits import pack as _packed
    sample = {"kind": "gpu", "ts": 10.25, "host": "h1", "gpu": 0, "power_w": 301.5}
    tracemalloc.start()
    try:
        held = [_packed(sample) for _ in range(200)] + [ordering.pack([sample])
                                                          for _ in range(200)]
        per = tracemalloc.get_traced_memory()[0] / len(held)
    finally:
        tracemalloc.stop()
    assert all(type(b) is bytes for b in held)
    assert per < 4 * len(held[0])   # orjson's own buffer: 16 KiB each


def test_a_live_buffer_packs_only_past_the_live_limit(monkeypatch):
    """Live, the buffer is handed on within a second or two: packing it only cost time
    (issue 31). It packs past LIVE_PACK_ABOVE, and the incidents do not change."""
    events = trace()
    ref = Detector().process_batch(events)
    packed: list[bool] = []
    pack = ordering.pack

    def spy(evs):
        packed.append(True)
        return pack(evs)

    monkeypatch.setattr(ordering, "pack", spy)
    monkeypatch.setattr(ordering, "PACK_ABOVE", 0)

    def live(limit: int) -> list[dict]:
        monkeypatch.setattr(ordering, "LIVE_PACK_ABOVE", limit)
        packed.clear()
        part = JobPartition(0, lateness=LATENESS)
        out: list[dict] = []
        msgs = messages(events)
        for off, m in enumerate(msgs):   # each message arrives as its newest event is made
            out += part.ingest(m, off, now=max(e["ts"] for e in m) + 0.05)
        now = max(e["ts"] for e in events)
        for k in range(1, 400):
            out += part.tick(now + k * 0.5)
        assert part.buffered == 0
        return out

    assert canon(live(1 << 30)) == canon(ref)
    assert not packed
    assert canon(live(0)) == canon(ref)
    assert packed
