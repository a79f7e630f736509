"""The simulator's comm grain: the same ops as the collective grain, summed into windows."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from failslow import schema
from failslow.simulator import SCENARIOS, SimulatorError, simulate


@pytest.fixture(scope="module", params=[1.0, 0.3])
def both(request):
    sc = SCENARIOS["healthy_hybrid_64"]
    window_s = request.param
    comm = list(simulate(sc, seed=2, steps=6, window_s=window_s).events())
    raw = list(simulate(sc, seed=2, steps=6, grain="collective").events())
    return comm, raw, window_s


def test_same_physics_steps_and_telemetry(both):
    comm, raw, _ = both
    assert [e for e in comm if e["kind"] != "comm"] == [e for e in raw if e["kind"] != "collective"]
    sc = SCENARIOS["healthy_hybrid_64"]
    assert simulate(sc, seed=2, steps=6).truth == simulate(sc, seed=2, steps=6,
                                                           grain="collective").truth


def test_windows_sum_exactly_the_ops_that_ended_in_them(both):
    comm, raw, window_s = both
    ops = defaultdict(list)       # (rank, step) -> its collective events
    for e in raw:
        if e["kind"] == "collective":
            ops[(e["rank"], e["step"])].append(e)
    windows = defaultdict(list)
    for e in comm:
        if e["kind"] == "comm":
            schema.validate(e)
            windows[(e["rank"], e["step"])].append(e)
    steps = {(e["rank"], e["step"]): e for e in comm if e["kind"] == "step"}
    assert set(windows) == {k for k in steps if ops[k]}
    for key, recs in windows.items():
        step = steps[key]
        recs.sort(key=lambda r: r["ts"])
        # Closed every window_s after the step's start and at its end; a window in which
        # no op ended sends nothing.
        start = step["ts"] - step["duration_s"]
        assert len(recs) <= max(1, math.ceil(step["duration_s"] / window_s - 1e-6))
        for r in recs:
            assert r["ops"]
            k = round((r["window_start_ts"] - start) / window_s)
            assert r["window_start_ts"] == pytest.approx(start + k * window_s, abs=2e-6)
            assert r["step_end"] == (r["ts"] == step["ts"])
            assert r["ts"] == step["ts"] or r["ts"] == pytest.approx(
                start + (k + 1) * window_s, abs=2e-6)
        got = {}
        for r in recs:
            for o in r["ops"]:
                k = (o["group"], o["op"], o.get("peer"))
                assert k not in got or got[k][-1] < o["first_seq"]
                got.setdefault(k, []).extend(range(o["first_seq"], o["last_seq"] + 1))
        want = defaultdict(list)
        for o in ops.get(key, []):
            want[(o["group"], o["op"], o.get("peer"))].append(o)
            # every op counted in the window its end falls in
            (win,) = [r for r in recs if r["window_start_ts"] < o["ts"] <= r["ts"]
                      or r is recs[0] and o["ts"] <= r["window_start_ts"]]
            (entry,) = [x for x in win["ops"] if (x["group"], x["op"], x.get("peer"))
                        == (o["group"], o["op"], o.get("peer"))]
            assert entry["first_seq"] <= o["seq"] <= entry["last_seq"]
            assert entry["min_s"] <= o["duration_s"] <= entry["max_s"]
        assert set(got) == set(want)
        for k, evs in want.items():
            entries = [x for r in recs for x in r["ops"]
                       if (x["group"], x["op"], x.get("peer")) == k]
            assert sum(x["n"] for x in entries) == len(evs)
            assert sum(x["bytes"] for x in entries) == sum(o["bytes"] for o in evs)
            assert sum(x["blocked_s"] for x in entries) == pytest.approx(
                sum(o["duration_s"] for o in evs), abs=1e-5)
            assert min(x["first_start_ts"] for x in entries) == min(o["start_ts"] for o in evs)


def test_records_per_rank_step_do_not_grow_with_ops(both):
    comm, raw, window_s = both
    rank_steps = sum(e["kind"] == "step" for e in comm)
    per_op = sum(e["kind"] == "collective" for e in raw) / rank_steps
    per_window = sum(e["kind"] == "comm" for e in comm) / rank_steps
    assert per_op > 10
    assert per_window * 2 < per_op


def test_bad_grain_or_window():
    with pytest.raises(SimulatorError, match="grain"):
        simulate(SCENARIOS["healthy_16"], grain="ops")
    with pytest.raises(SimulatorError, match="window_s"):
        simulate(SCENARIOS["healthy_16"], window_s=0)
