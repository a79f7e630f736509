"""The far verdict's bar over long windows (``EvidenceConfig.long_n``, ``long_z``).

A rank far outside its peers (its mean excess at least 0.9 x ``far_rel``, 25 %) over a
window of 24 steps or more confirms at z 3 instead of z_min (4): the far verdict's
evidence is its size (twice the largest steady difference between healthy parts), and
the winsorized mean of 24 values or more is close to normal, so its z only has to show
that the mean is not noise at the usual one-sided 3 sigma. Shorter windows keep z_min
for the heavy tails of a few steps' mean; a burst that ended, or a steady offset under
the far bar, never confirms through the long bar. The same bar holds for a large change
(25 % or more) against the rank's own past: a pipeline stage has no peers.
"""

from __future__ import annotations

import math

import numpy as np

from failslow.models.config import EvidenceConfig, JobConfig
from failslow.models.evidence import RankEvidence, Windows

FAR = math.log1p(0.25)
LONG_N, LONG_Z = EvidenceConfig().long_n, EvidenceConfig().long_z


def _job(after: list[float], seed: int, before: int = 40) -> tuple[Windows, np.ndarray]:
    """Four ranks with log-normal noise of 0.3 a step; row 0 gets ``after`` added on its
    last len(after) steps (not learned as noise, as RankEvidence does while it drifts)."""
    rng = np.random.default_rng(seed)
    w = Windows(width=32)
    rows = w.rows_for([0, 1, 2, 3])
    for k in range(before + len(after)):
        v = rng.normal(0.0, 0.3, 4)
        if k >= before:
            v[0] += after[k - before]
        w.push(rows, v)
        w.learn(rows, np.array([k < before, True, True, True]))
    return w, rows


def test_long_window_bar_is_three_from_24_steps():
    assert LONG_N == 24 and LONG_Z == 3.0


def test_sustained_far_excess_confirms_over_a_long_window():
    # +0.45 in log (+57 %) on every step for 24 steps: on these seeds the 24-step z lands
    # between 3 and 4, confirmed with the long bar only
    for seed in (3, 4):
        w, rows = _job([0.45] * 24, seed)
        sigma = np.full(4, 0.3)
        ok, mean, z, n = w.test(rows, sigma, FAR, 4.0, robust=True, z_long=LONG_Z)
        ok4, _, _, _ = w.test(rows, sigma, FAR, 4.0, robust=True)
        assert ok[0] and int(n[0]) >= LONG_N and 3.0 <= z[0] < 4.0, (seed, z, n)
        assert not ok4[0]
        assert not ok[1:].any()


def test_short_windows_keep_the_full_bar():
    # ten steps of +0.6 just now: only the 6- and 12-step windows see it all; they need 4
    for seed in range(4):
        w, rows = _job([0.6] * 10, seed)
        sigma = np.full(4, 0.3)
        ok, _, z, n = w.test(rows, sigma, FAR, 4.0, scales=(6, 12), robust=True,
                             z_long=LONG_Z)
        ok4, _, z4, _ = w.test(rows, sigma, FAR, 4.0, scales=(6, 12), robust=True)
        assert ok.tolist() == ok4.tolist() and np.allclose(z, z4)


def test_a_burst_that_ended_does_not_confirm_through_the_long_bar():
    # twelve steps of +0.6, then twelve clean ones: the long windows' mean is diluted
    for seed in range(6):
        w, rows = _job([0.6] * 12 + [0.0] * 12, seed)
        ok, _, _, _ = w.test(rows, np.full(4, 0.3), FAR, 4.0, scales=(24, 32), robust=True,
                             z_long=LONG_Z)
        assert not ok.any(), seed


def test_steady_offset_under_the_far_bar_never_confirms():
    # +12 % on every step for 32 steps, with little noise: z is large, the mean too small
    w, rows = _job([math.log1p(0.12)] * 32, 0)
    ok, mean, z, _ = w.test(rows, np.full(4, 0.05), FAR, 4.0, robust=True, z_long=LONG_Z)
    assert not ok[0] and mean[0] < 0.9 * FAR


def _first_confirmed(seed: int, shift: float = 0.5, sd: float = 0.45, before: int = 40,
                     after: int = 32) -> int | None:
    """Steps after the onset until rank 0 (alone in its pipeline stage: no peers, only its
    own past judges it) is confirmed; its own-past series rises by ``shift`` in log."""
    rng = np.random.default_rng(seed)
    ev = RankEvidence(JobConfig())
    n = 4
    for k in range(before + after):
        y = rng.normal(0.0, sd, n)
        if k >= before:
            y[0] += shift
        v = ev.judge(list(range(n)), np.zeros(n), np.zeros(n), np.expm1(y), y / sd,
                     np.full(n, sd), np.zeros(n, dtype=bool), np.ones(n, dtype=bool), False,
                     np.full(n, 0.1), 0.2, 0.01, np.ones(n, dtype=bool))
        assert not v.confirmed[1:].any(), (seed, k)
        if v.confirmed[0] and k >= before:
            return k - before
    return None


def test_large_change_against_own_past_confirms_over_a_long_window(monkeypatch):
    # +65 % (0.5 in log) on a stage whose own work moves 45 % a step: the own-past test at
    # 5 % needs z 4; a change of 25 % or more over 24+ values confirms at z 3, earlier
    with_long = {seed: _first_confirmed(seed) for seed in (3, 8)}
    monkeypatch.setattr(EvidenceConfig, "long_scales", property(lambda self: ()))
    without = {seed: _first_confirmed(seed) for seed in (3, 8)}
    for seed in (3, 8):
        assert with_long[seed] is not None and without[seed] is not None
        assert with_long[seed] + 2 <= without[seed], (with_long, without)
        assert with_long[seed] >= LONG_N - 1


def test_healthy_stages_never_confirm():
    for seed in range(6):
        _first_confirmed(seed, shift=0.0)
