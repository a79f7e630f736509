"""A step's collectives as arrays (issue 31): ``models.comm`` hands the judged step its
collectives as arrays (``StepColls``), and ``models.links`` (clocks, transfers, group
costs, localization) and ``lags`` read those instead of one Python list per collective.
The decisions are those of the lists, value for value."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from failslow.models import alignment, links
from failslow.models.alignment import StepColls, lags, listed
from failslow.models.comm import CommWindows
from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate


def _window(rank: int, ops: list[dict], step: int = 0, ts: float = 10.0) -> dict:
    return {"v": 1, "kind": "comm", "ts": ts, "job_id": "j", "rank": rank, "host": f"h{rank}",
            "window_start_ts": ts - 1.0, "ops": ops, "step": step, "step_end": True}


def _op(group: str, size: int, blocked: float, op: str = "allreduce", n: int = 2,
        peer: int | None = None) -> dict:
    e = {"group": group, "group_size": size, "op": op, "n": n, "blocked_s": blocked,
         "min_s": blocked / n, "max_s": blocked / n, "bytes": n * 1000}
    if peer is not None:
        e["peer"] = peer
    return e


def _step() -> CommWindows:
    cw = CommWindows()
    # dp0: ranks 0-3, rank 2 last; ranks 0 and 3 start together (a tie); a pair 0-4
    for r, blocked in ((0, 0.30), (1, 0.25), (2, 0.10), (3, 0.30)):
        cw.add(_window(r, [_op("dp0", 4, blocked)]), 0)
    cw.add(_window(0, [_op("pp0-4", 2, 0.2, "send", peer=4)]), 0)
    cw.add(_window(4, [_op("pp0-4", 2, 0.05, "recv", peer=0)]), 0)
    # a tie for the last start: the first of the two is charged, its lead 0
    cw.add(_window(5, [_op("tp1", 2, 0.2)]), 0)
    cw.add(_window(6, [_op("tp1", 2, 0.2)]), 0)
    return cw


def test_the_lists_are_built_only_when_read_and_are_those_of_take_step():
    got = _step().take_colls(0)
    assert isinstance(got, StepColls) and got.arrays is not None
    assert len(got) == 0                        # nothing built yet
    want = _step().take_step(0)
    assert listed(got) == want and len(want) == 3
    assert got.make is None and listed(got) is got      # built once


def test_lags_from_the_arrays_are_those_of_the_lists_ties_included():
    colls = _step().take_colls(0)
    fast = lags(colls)
    slow = lags(list(listed(colls)))
    assert fast == slow
    assert set(fast) == {2, 4, 5}               # dp0: 2; the pair: 4 (posted last)
    assert fast[5] == 0.0                       # the tie: the first of the two, no lead
    assert lags(_step().take_colls(0), {2}) == {2: slow[2]}


@pytest.mark.parametrize("name", ["slow_link_pair_3x", "slow_link_host_50"])
def test_links_judge_the_arrays_as_the_lists(name, monkeypatch):
    """Every judged step of a slow link (comm windows): the link monitor fed the arrays
    and a copy of it fed the same collectives as lists find the same slow links, learn
    the same host clocks and keep the same group baselines."""
    evaluate = links.LinkMonitor.evaluate
    seen = {"arrays": 0, "found": 0}

    def twin(self, s, colls, rank_host, ts, job_s, layout=None):
        if getattr(colls, "arrays", None) is None:
            return evaluate(self, s, colls, rank_host, ts, job_s, layout)
        other = copy.deepcopy(self)
        # the arrays with the job's layout (its hosts as numbers), the lists without
        assert layout is not None and layout.holds(rank_host)
        a = evaluate(self, s, colls, rank_host, ts, job_s, layout)
        b = evaluate(other, s, list(listed(colls)), rank_host, ts, job_s)
        assert repr(a) == repr(b)
        assert list(self.clock.items()) == list(other.clock.items())
        assert self.slow_members == other.slow_members
        t, u = self.table, other.table
        assert t.rows == u.rows and t.runs == u.runs
        for field in ("cusum", "streak", "onset_ts", "extra_s", "rel", "z"):
            assert np.array_equal(getattr(t, field), getattr(u, field))
        assert np.array_equal(t.cost.win, u.cost.win)
        seen["arrays"] += 1
        seen["found"] += bool(a)
        return a

    monkeypatch.setattr(links.LinkMonitor, "evaluate", twin)
    det = Detector()
    det.process_batch(list(simulate(SCENARIOS[name], seed=0, grain="comm").events()))
    det.flush()
    assert seen["arrays"] > 10 and seen["found"] > 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # the NaN's own sums
def test_a_step_with_a_value_that_is_not_finite_takes_the_lists():
    cw = _step()
    cw.add(_window(7, [_op("dp9", 2, float("nan"))]), 0)
    cw.add(_window(8, [_op("dp9", 2, 0.1)]), 0)
    colls = cw.take_colls(0)
    assert colls.arrays is not None and not colls.arrays.finite
    assert len(colls) == 4                      # built at once, as before
    assert alignment.arrays_of(colls) is None
    assert lags(colls) == lags(list(colls))
