"""The windowed test's ``hits_only`` form (models/evidence.py ``Windows.test``): the far
verdict against peers reads a rank's mean, z and window only where it confirms, so its
robust windows (sorts, medians, MADs) are computed only for the ranks that can confirm
in them: those holding a value of at least ``mean_floor * delta`` (a winsorized or plain
mean is at most its window's largest value).

Checked against the full test over many random windows (noise, spikes, steady excesses
just above and below the bar, ties, missing values, +-inf), with and without the step's
memos and learned noise: the same ranks confirm, with the same mean, z and window bit
for bit, and the bound holds for every robust window of every rank it skips. Then over
whole simulated jobs: every far test of every judged step, run both ways.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from failslow.models.config import EvidenceConfig
from failslow.models.evidence import Windows
from failslow.models.pipeline import Detector
from failslow.schema.batches import batch_trace
from failslow.simulator import SCENARIOS, simulate

FAR = float(np.log1p(0.25))


def _series(rng: np.random.Generator, k: int, width: int) -> np.ndarray:
    """(k, width) values of one of several kinds, per row."""
    out = np.empty((k, width))
    for i in range(k):
        kind = rng.integers(8)
        s = rng.choice([0.01, 0.05, 0.1, 0.2])
        x = rng.normal(0.0, s, width)
        if kind == 1:       # a steady excess near the bar, from some step on
            x[rng.integers(width):] += rng.uniform(0.15, 0.35)
        elif kind == 2:     # one or a few spikes
            x[rng.integers(width, size=rng.integers(1, 4))] = rng.uniform(0.2, 3.0)
        elif kind == 3:     # ties: values on a coarse grid
            x = np.round(x * 10) / 10 + rng.choice([0.0, 0.2])
        elif kind == 4:     # a straggler slow on most steps, not all
            x += np.where(rng.random(width) < 0.7, rng.uniform(0.2, 0.3), 0.0)
        elif kind == 5:     # exactly at the mean floor for a while
            x[:] = 0.9 * FAR if rng.random() < 0.5 else np.nextafter(0.9 * FAR, 0.0)
        elif kind == 6:     # infinities
            x[rng.integers(width)] = rng.choice([np.inf, -np.inf])
        gaps = rng.random(width) < rng.choice([0.0, 0.1, 0.5, 0.9, 1.0])
        x[gaps] = np.nan
        out[i] = x
    return out


def _windows(rng: np.random.Generator, k: int) -> tuple[Windows, np.ndarray, np.ndarray]:
    w = Windows(32, EvidenceConfig())
    rows = w.rows_for(list(range(k)))
    # some steps of learned noise first (moments, pooled spread), on some rows
    for _ in range(int(rng.integers(0, 20))):
        w.push(rows, rng.normal(0.0, 0.05, k))
        w.learn(rows, rng.random(k) < 0.8)
    for col in _series(rng, k, 32).T:
        w.push(rows, col)
    sigma = rng.choice([0.005, 0.02, 0.05, 0.2], size=k)
    return w, rows, sigma


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("seed", range(40))
def test_hits_only_confirms_the_same_ranks_with_the_same_values(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 3, 4, 17, 300]))
    w, rows, sigma = _windows(rng, k)
    delta = float(rng.choice([FAR, 0.05, 0.5]))
    scales = None if rng.random() < 0.7 else (32, 6, 24)       # any order
    z_long = None if rng.random() < 0.3 else 3.0
    memos = rng.random() < 0.5
    if memos:
        w.begin(rows)
    full = w.test(rows, sigma, delta, 4.0, scales, robust=True, z_long=z_long)
    if memos:
        w.begin(rows)       # fresh memos, as a step's second test would not share
    fast = w.test(rows, sigma, delta, 4.0, scales, robust=True, z_long=z_long, hits_only=True)
    ok = full[0]
    assert _same(ok, fast[0])
    for a, b in zip(full[1:], fast[1:], strict=True):
        assert _same(a[ok], b[ok])
    # The bound itself: a row it skips has every window's mean (plain or robust) under
    # the floor, and reads as never confirmed.
    floor = w.p.mean_floor * delta
    skipped = np.flatnonzero(~w._may_reach(rows, floor))
    for n in (6, 12, 24, 32):
        _, mean, _ = w.stats(rows, n)
        assert not (mean[skipped] >= floor).any()
        if n >= w.p.robust_min_n:
            _, mean, _ = w.robust_stats(rows, n, w.noise(rows, sigma), w._mad_pool(rows))
            assert not (mean[skipped] >= floor).any()
    assert not fast[0][skipped].any() and (fast[2][skipped] == -np.inf).all()


def test_hits_only_skips_quiet_rows_and_keeps_a_straggler() -> None:
    rng = np.random.default_rng(7)
    w = Windows(32, EvidenceConfig())
    rows = w.rows_for(list(range(64)))
    for _ in range(32):
        v = rng.normal(0.0, 0.03, 64)
        v[5] += 0.4
        w.push(rows, v)
    sigma = np.full(64, 0.03)
    reach = w._may_reach(rows, w.p.mean_floor * FAR)
    assert reach.tolist() == [i == 5 for i in range(64)]
    full = w.test(rows, sigma, FAR, 4.0, robust=True, z_long=3.0)
    fast = w.test(rows, sigma, FAR, 4.0, robust=True, z_long=3.0, hits_only=True)
    assert full[0].tolist() == fast[0].tolist() == reach.tolist()
    assert _same(full[1][5:6], fast[1][5:6]) and int(fast[3][5]) == int(full[3][5])


def test_hits_only_with_a_shared_memo_is_the_full_test() -> None:
    rng = np.random.default_rng(3)
    w, rows, sigma = _windows(rng, 50)
    full = w.test(rows, sigma, FAR, 4.0, robust=True, memo={})
    fast = w.test(rows, sigma, FAR, 4.0, robust=True, hits_only=True, memo={})
    assert all(_same(a, b) for a, b in zip(full, fast, strict=True))


@pytest.mark.parametrize("name", ["two_culprits_32", "cpu_contention_30", "heavy_stage_64",
                                  "transients_hybrid_32"])
def test_hits_only_in_whole_jobs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hits_only test of every judged step of a simulated job, run the full way too:
    the same confirmations, means, z and windows where confirmed."""
    orig = Windows.test
    seen = {"calls": 0, "ok": 0}

    def both(self: Windows, rows: np.ndarray, sigma: np.ndarray, *a: Any, **kw: Any) -> Any:
        fast = orig(self, rows, sigma, *a, **kw)
        if kw.pop("hits_only", False):
            # memos of the step stay as they were: the full test reads them the same way
            full = orig(self, rows, sigma, *a, **kw)
            ok = full[0]
            assert _same(ok, fast[0])
            for x, y in zip(full[1:], fast[1:], strict=True):
                assert _same(x[ok], y[ok])
            seen["calls"] += 1
            seen["ok"] += int(ok.sum())
        return fast

    monkeypatch.setattr(Windows, "test", both)
    ev = [dict(e) for e in simulate(SCENARIOS[name], seed=0, grain="comm").events()]
    d = Detector()
    d.process_batch(list(batch_trace(ev)))
    d.flush()
    assert seen["calls"] > 50
