"""The far verdict's bar over long windows (models/evidence.py ``LONG_N``, ``LONG_Z``).

A rank far outside its peers (its mean excess at least 0.9 x ``far_rel``, 25 %) over a
window of 24 steps or more confirms at z 3 instead of z_min (4): the far verdict's
evidence is its size (twice the largest steady difference between healthy parts), and
the winsorized mean of 24 values or more is close to normal, so its z only has to show
that the mean is not noise at the usual one-sided 3 sigma. Shorter windows keep z_min
for the heavy tails of a few steps' mean; a burst that ended, or a steady offset under
the far bar, never confirms through the long bar.
"""

from __future__ import annotations

import math

import numpy as np

from models.evidence import LONG_N, LONG_Z, Windows

FAR = math.log1p(0.25)


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
