"""The windowed test's robust form (models/evidence.py ``Windows.robust_stats``): a
winsorized mean over a MAD spread, for the long windows of a rank's evidence.

A straggler on a noisy host is above its usual on most steps but not all (its peers
lose the same core now and then): its window holds a steady excess and a few steps
back at zero. The sample deviation counts that mix as noise and never confirms; the
MAD spread does. One spike still never confirms anything: it is clipped at a few
spreads from the window's median.
"""

from __future__ import annotations

import numpy as np

from failslow.models.evidence import Windows


def _window(values: list[float], peers: int = 3) -> tuple[Windows, np.ndarray]:
    """Row 0 holds ``values``; rows 1.. hold small clean noise (the job's peers)."""
    rng = np.random.default_rng(0)
    w = Windows(width=32)
    rows = w.rows_for(list(range(1 + peers)))
    for v in values:
        w.push(rows, np.concatenate([[v], rng.normal(0.0, 0.05, peers)]))
    return w, rows


def test_steady_excess_with_clean_steps_confirms_only_robustly():
    # 24 steps: +0.15 (log) on two of every three, back at 0 on the third
    vals = [0.0 if k % 3 == 2 else 0.15 + 0.02 * ((k * 7) % 5 - 2) for k in range(24)]
    w, rows = _window(vals)
    sigma = np.full(rows.size, 0.02)
    ok_plain, _, z_plain, _ = w.test(rows, sigma, delta=0.05, z_crit=4.0, scales=(24,))
    ok_rob, mean, z, n = w.test(rows, sigma, delta=0.05, z_crit=4.0, scales=(24,), robust=True)
    # the sample deviation of the mix swamps the mean in the plain test
    assert not ok_plain[0] and z_plain[0] < 4.0
    assert ok_rob[0] and int(n[0]) == 24 and mean[0] > 0.08 and z[0] >= 4.0
    assert not ok_rob[1:].any()


def test_one_spike_never_confirms():
    vals = [0.0] * 23 + [3.0]
    w, rows = _window(vals)
    sigma = np.full(rows.size, 0.05)
    ok, mean, _, _ = w.test(rows, sigma, delta=0.05, z_crit=4.0, scales=(12, 24, 32),
                            robust=True)
    assert not ok.any()
    assert mean[0] < 0.05


def test_few_values_fall_back_to_the_plain_test():
    # a job's first steps: six values in a 12-step window, all high and scattered
    w = Windows(width=32)
    rows = w.rows_for([0, 1, 2, 3])
    for v in (0.6, 1.1, 0.4, 0.9, 1.5, 0.5):
        w.push(rows, np.array([v, 0.0, 0.01, -0.01]))
    sigma = np.full(4, 0.3)
    _, m_rob, z_rob, _ = w.test(rows, sigma, 0.05, 4.0, scales=(12,), robust=True)
    _, m_pl, z_pl, _ = w.test(rows, sigma, 0.05, 4.0, scales=(12,))
    assert m_rob[0] == m_pl[0] and z_rob[0] == z_pl[0]


def test_an_episode_that_ended_is_no_longer_present():
    # ``Windows.present`` keeps an open finding alive; an excess of +1.0 (log) for 12
    # steps that ended 10 steps ago still lifts the 32-step mean above delta / 2, but
    # the window's newest quarter is clean: not present. One that goes on is.
    ended = [0.0] * 10 + [1.0] * 12 + [0.0] * 10
    w, rows = _window(ended)
    sigma = np.full(rows.size, 0.05)
    assert not w.present(rows, sigma, delta=0.22)[0]
    going = [0.0] * 10 + [1.0] * 22
    w, rows = _window(going)
    assert w.present(rows, sigma, delta=0.22)[0]
    # and a real but noisy excess (a straggler back at its peers on one step in three)
    noisy = [0.0] * 8 + [0.0 if k % 3 == 2 else 0.4 for k in range(24)]
    w, rows = _window(noisy)
    assert w.present(rows, sigma, delta=0.05)[0]
    assert not w.present(rows, sigma, delta=0.05)[1:].any()
