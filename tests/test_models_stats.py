"""Incremental statistics against numpy at every prefix, and the scale-free scores."""

from __future__ import annotations

import math

import numpy as np
import pytest

from failslow.models.changepoint import BOCPD
from failslow.models.peers import lower_half_ref, peer_scores
from failslow.models.ranks import RankState
from failslow.models.stats import EWMeanVar, RollingMedian


@pytest.mark.parametrize("alpha", [0.05, 0.3, 1.0])
def test_ew_mean_var_matches_weighted_numpy_at_every_prefix(alpha):
    xs = np.random.default_rng(1).lognormal(0, 0.5, 200)
    s = EWMeanVar(alpha)
    for n in range(1, len(xs) + 1):
        s.update(float(xs[n - 1]))
        # Weights of an EW average whose first sample seeds the mean.
        w = np.array([(1 - alpha) ** (n - 1)] + [alpha * (1 - alpha) ** (n - 1 - i)
                                                 for i in range(1, n)])
        mean = float(np.sum(w * xs[:n]))
        var = float(np.sum(w * (xs[:n] - mean) ** 2))
        assert s.mean == pytest.approx(mean, rel=1e-9, abs=1e-12)
        assert s.var == pytest.approx(var, rel=1e-7, abs=1e-12)


def test_rolling_median_and_sigma_match_numpy_at_every_prefix():
    xs = np.random.default_rng(2).normal(1.0, 0.1, 150)
    xs[40] = 50.0        # an outlier must not matter to the median
    m = RollingMedian(window=16)
    for n in range(1, len(xs) + 1):
        m.update(float(xs[n - 1]))
        win = xs[max(0, n - 16):n]
        med = float(np.median(win))
        assert m.median == pytest.approx(med)
        if n >= 2:
            q1, q3 = np.quantile(win, [0.25, 0.75])
            assert m.sigma == pytest.approx(float(q3 - q1) / 1.349, rel=1e-3)


def test_rank_baselines_match_numpy_and_skip_flagged_steps():
    """The per-rank river baselines equal numpy over the unflagged steps only."""
    rng = np.random.default_rng(7)
    st = RankState()
    kept: list[tuple[float, float, float, float]] = []
    for n in range(120):
        flagged = 40 <= n < 60                       # a fault: 3x slower, never learned
        scale = 3.0 if flagged else 1.0
        own = scale * float(rng.gamma(50, 0.02))
        data = float(rng.exponential(0.01))
        step = own + 0.2
        pos = own / 1.0
        st.observe(pos, own, data, step, flagged)
        if not flagged:
            kept.append((pos, own, data, step))
        arr = np.array(kept)
        win = arr[-32:, 0]
        assert st.work.median == pytest.approx(float(np.median(win)))
        assert st.work.n == len(kept)
        a = 0.05
        k = len(kept)
        w = np.array([(1 - a) ** (k - 1)] + [a * (1 - a) ** (k - 1 - i) for i in range(1, k)])
        for name, col in (("own", 1), ("data", 2), ("step", 3)):
            mean = float(np.sum(w * arr[:, col]))
            var = float(np.sum(w * (arr[:, col] - mean) ** 2))
            assert getattr(st, name).mean == pytest.approx(mean, rel=1e-9)
            assert getattr(st, name).var == pytest.approx(var, rel=1e-6, abs=1e-15)
        assert st.comm.mean == pytest.approx(0.2, rel=1e-9)
    assert max(st.usual()["own"], st.work.median) < 1.5    # the 3x steps never got in


def test_lower_half_reference_estimates_the_healthy_median():
    rng = np.random.default_rng(3)
    healthy = rng.normal(1.0, 0.01, 400)
    ref, sigma = lower_half_ref(np.concatenate([healthy, [1.3] * 20]))
    assert ref == pytest.approx(float(np.median(healthy)), abs=0.002)
    assert sigma == pytest.approx(0.01, rel=0.2)
    # Even with half of them slow, the reference stays within a sigma of healthy.
    ref, sigma = lower_half_ref(np.concatenate([healthy, rng.normal(1.3, 0.01, 400)]))
    assert abs(ref - float(np.median(healthy))) < 1.5 * 0.01 and sigma < 0.02


def test_peer_scores_are_scale_free_and_per_group():
    v = np.array([1.0, 1.01, 0.99, 1.0, 1.3, 10.0, 10.1, 9.9, 10.0, 10.0])
    groups = np.array([0] * 5 + [1] * 5)
    rel, z, perf, _ = peer_scores(v, groups)
    rel2, z2, _, _ = peer_scores(v * 1000, groups)
    assert rel[4] == pytest.approx(0.3, abs=0.01) and z[4] > 10
    assert abs(rel[5:]).max() < 0.02             # stage 2 is slower by design, not a fault
    assert np.allclose(rel, rel2) and np.allclose(z, z2)
    assert perf[4] == pytest.approx(0.99 / 1.3)


def _series(rng, n, level=1.0, noise=0.02):
    return list(np.log(level * rng.lognormal(0, noise, n)))


def test_bocpd_confirms_a_sustained_shift_within_a_few_steps():
    rng = np.random.default_rng(4)
    d = BOCPD()
    for x in _series(rng, 50):
        d.update(x)
        assert not d.drift_detected
    found = None
    for i, x in enumerate(_series(rng, 10, level=1.2)):
        d.update(x)
        if d.drift_detected:
            found = i
            break
    assert found is not None and found <= 4
    assert d.shift == pytest.approx(math.log(1.2), abs=0.05)


def test_bocpd_ignores_a_single_spike():
    rng = np.random.default_rng(5)
    d = BOCPD()
    xs = _series(rng, 40) + [math.log(2.0)] + _series(rng, 20)
    for x in xs:
        d.update(x)
        assert not d.drift_detected
