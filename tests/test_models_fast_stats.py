"""The fast order statistics of issue 14 give the numbers of the plain ones they replace."""

from __future__ import annotations

import warnings

import numpy as np

from failslow.models import peers
from failslow.models.evidence import _rowmedian
from failslow.models.peers import KeyedValues, lower_half_ref, surely_within


def _plain_lower_half_ref(values: np.ndarray) -> tuple[float, float]:
    low = np.sort(values)[: max(1, (values.size + 1) // 2)]
    k = low.size
    q25 = float(low[k // 2]) if k % 2 else 0.5 * (float(low[k // 2 - 1]) + float(low[k // 2]))
    d = np.sort(np.abs(low - q25))
    m = d.size // 2
    mad = float(d[m]) if d.size % 2 else 0.5 * (float(d[m - 1]) + float(d[m]))
    sigma = mad / peers.LOWER_HALF_MAD
    return q25 + 0.6745 * sigma, sigma


def test_lower_half_ref_by_partition_equals_the_sorted_one() -> None:
    rng = np.random.default_rng(3)
    for i in range(400):
        n = int(rng.integers(peers.PARTITION_MIN - 3, 3 * peers.PARTITION_MIN))
        v = rng.lognormal(size=n)
        if i % 3 == 0:
            v = np.round(v, 1)              # ties at the boundaries
        before = v.copy()
        assert lower_half_ref(v) == _plain_lower_half_ref(v)
        assert np.array_equal(v, before)    # the caller's array is left alone


def test_surely_within_never_hides_a_slow_value() -> None:
    rng = np.random.default_rng(4)
    for _ in range(2000):
        v = rng.lognormal(size=int(rng.integers(4, 600)), sigma=0.3)
        x = float(rng.choice(v)) * float(rng.uniform(0.5, 2.0))
        if surely_within(x, v, 0.25):
            ref, _ = lower_half_ref(v)
            assert x / ref - 1.0 < 0.25
    assert not surely_within(1.0, np.array([0.0, 1.0, 2.0, 3.0]), 0.25)   # no positive floor


def test_keyed_values_holds_the_latest_value_of_each_key() -> None:
    rng = np.random.default_rng(5)
    kv, ref = KeyedValues(), {}
    for _ in range(5000):
        key = int(rng.integers(0, 60))
        if rng.random() < 0.2:
            kv.discard(key)
            ref.pop(key, None)
        else:
            x = float(rng.normal())
            kv.set(key, x)
            ref[key] = x
        assert len(kv) == len(ref)
        assert sorted(kv.array().tolist()) == sorted(ref.values())
    assert {k: float(kv.vals[i]) for k, i in kv.slot.items()} == ref


def test_rowmedian_with_missing_values_equals_nanmedian() -> None:
    rng = np.random.default_rng(6)
    for _ in range(500):
        w = np.round(rng.normal(size=(int(rng.integers(1, 40)), int(rng.integers(1, 33)))), 1)
        w[rng.random(w.shape) < rng.random()] = np.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmedian(w, axis=1)
        # equal values (a zero's sign may differ: it never matters to the callers)
        assert np.array_equal(_rowmedian(w), want, equal_nan=True)


def test_rowmedian_without_missing_values_is_numpys_median_bit_for_bit() -> None:
    # The rows are sorted whole, not partitioned: the same order statistics, the same
    # (low + high) / 2 for an even width, so every bit of every median is numpy's.
    rng = np.random.default_rng(7)
    for width in (1, 2, 3, 4, 7, 8, 16, 24, 31, 32, 64):
        for rows in (1, 3, 1024):
            w = rng.standard_normal((rows, width)) * rng.choice([1e-9, 1.0, 1e9], size=(rows, width))
            w[rng.random(w.shape) < 0.2] = 1.5          # ties
            assert _rowmedian(w).tobytes() == np.median(w, axis=1).tobytes()
