"""Peer comparison (differential observability): how much a rank stands out
from the ranks that do the same work, at one step.

Slowdowns only ever make a rank slower, so the reference comes from the
*faster half* of the peers: its spread, and the healthy median estimated from
it. That stays clean while up to half the peers are slow, e.g. a whole host
of a two-host job. Scores are relative, so they hold for any step time and model:

- ``rel``: fractional excess over the reference (0.3 = 30% slower);
- ``z``: that excess in units of the reference half's spread (floored at
  ``floor`` of the reference, so a perfectly quiet group does not turn every
  microsecond into an outlier);
- ``perf``: nvidia-resiliency-ext's relative score, best peer / rank
  (1 = as fast as the best, 0.7 = a 30% loss).

>>> import numpy as np
>>> rel, z, perf, _ = peer_scores(np.array([1.0, 1.0, 1.01, 0.99, 1.3]), np.zeros(5, dtype=int))
>>> round(float(rel[4]), 2), bool(z[4] > 10), round(float(perf[4]), 2)
(0.3, True, 0.76)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.models.config import RankConfig
from failslow.models.stats import median

# For a normal sample, the median absolute deviation of its lower half around
# that half's median is 0.3991 sigma (computed from the normal quantile function).
LOWER_HALF_MAD = 0.3991


def lower_half_ref(values: np.ndarray) -> tuple[float, float]:
    """(reference, sigma) from the faster half of ``values``: sigma from its
    median absolute deviation, and the reference is the healthy median
    estimated from that half (its median, the lower quartile, plus 0.6745
    sigma), so healthy ranks score about zero, not half a sigma high."""
    if values.size >= PARTITION_MIN:
        return _lower_half_ref(values)
    low = np.sort(values)[: max(1, (values.size + 1) // 2)]
    k = low.size
    q25 = float(low[k // 2]) if k % 2 else 0.5 * (float(low[k // 2 - 1]) + float(low[k // 2]))
    sigma = median(np.abs(low - q25)) / LOWER_HALF_MAD
    return q25 + 0.6745 * sigma, sigma


def surely_within(x: float, values: np.ndarray, rel: float) -> bool:
    """True when ``x`` is certainly less than ``1 + rel`` times ``lower_half_ref(values)``'s
    reference, which is never below the smallest value: callers skip computing it then."""
    m = float(values.min())
    return m > 0 and x < (1.0 + rel) * m * (1.0 - 1e-9)


PARTITION_MIN = 256     # from this many values, order statistics by partition, not a sort


def _mid(a: np.ndarray) -> float:
    """The median of ``a`` (the mean of the two middle values for an even count) by a
    partial sort; ``a`` is reordered."""
    k = a.size
    m = k // 2
    if k % 2:
        a.partition(m)
        return float(a[m])
    a.partition((m - 1, m))
    return 0.5 * (float(a[m - 1]) + float(a[m]))


def _lower_half_ref(values: np.ndarray) -> tuple[float, float]:
    """``lower_half_ref`` of many values with partial sorts (O(n), not O(n log n)): the
    same order statistics, so the same numbers."""
    kk = (values.size + 1) // 2
    low = np.partition(values, kk - 1)[:kk]        # the faster half, in no order
    q25 = _mid(low.copy())
    sigma = _mid(np.abs(low - q25)) / LOWER_HALF_MAD
    return q25 + 0.6745 * sigma, sigma


def sorted_lower_half_ref(s: np.ndarray) -> tuple[float, float]:
    """``lower_half_ref`` of values already sorted ascending (finite, at least one): the
    same numbers, read off by position in O(log n) (issue 31: a size class of 229,376
    pipeline directions partitioned for each reference). The lower quartile is the lower
    half's middle; the deviations from it are two sorted runs (the values under it, the
    nearest first, and the rest: ``|x - q25|`` is ``q25 - x`` exactly under it), whose
    middle is found by bisection, the same float subtractions as ``np.abs(low - q25)``."""
    k = max(1, (s.size + 1) // 2)
    m = k // 2
    q25 = float(s[m]) if k % 2 else 0.5 * (float(s[m - 1]) + float(s[m]))
    p = int(s[:k].searchsorted(q25, "left"))     # s[:p] < q25 <= s[p:k]
    ny = k - p

    def kth(r: int) -> float:
        """The ``r``-th smallest (0-based) of the k deviations."""
        lo, hi = max(0, r + 1 - ny), min(r + 1, p)
        while lo < hi:
            i = (lo + hi) // 2
            if q25 - float(s[p - 1 - i]) < float(s[p + r - i]) - q25:
                lo = i + 1
            else:
                hi = i
        a = q25 - float(s[p - lo]) if lo > 0 else -np.inf
        b = float(s[p + r - lo]) - q25 if r >= lo else -np.inf
        return a if a > b else b

    mad = kth(m) if k % 2 else 0.5 * (kth(m - 1) + kth(m))
    sigma = mad / LOWER_HALF_MAD
    return q25 + 0.6745 * sigma, sigma


def sorted_update(s: np.ndarray, added: list[float], removed: list[float]) -> np.ndarray:
    """``s`` (sorted, finite) with the values ``added`` put in and then one of each of
    the values ``removed`` taken out (each there by then): a new sorted array, the sort of
    the values it now holds in a few passes over them, not a sort of them all."""
    if added:
        a = np.sort(np.array(added, dtype=float))
        at = s.searchsorted(a, "right") + np.arange(a.size)     # their places in the merge
        out = np.empty(s.size + a.size)
        out[at] = a
        keep = np.ones(out.size, dtype=bool)
        keep[at] = False
        out[keep] = s
        s = out
    if removed:
        r = np.sort(np.array(removed, dtype=float))
        # a value removed twice: its first places in turn
        at = s.searchsorted(r, "left") + (np.arange(r.size) - r.searchsorted(r, "left"))
        keep = np.ones(s.size, dtype=bool)
        keep[at] = False
        s = s[keep]
    return s


class KeyedValues:
    """The latest value of each key as one float array, in no particular order: for
    statistics that sort anyway (``lower_half_ref``) over many keys updated one at a time
    (a list rebuilt from a dict for each update costs O(keys) in Python)."""

    __slots__ = ("slot", "keys", "vals")

    def __init__(self) -> None:
        self.slot: dict[Any, int] = {}     # key -> its index in vals
        self.keys: list[Any] = []
        self.vals = np.empty(16)

    def __len__(self) -> int:
        return len(self.keys)

    def set(self, key: Any, value: float) -> None:
        i = self.slot.get(key)
        if i is None:
            i = len(self.keys)
            if i == self.vals.size:
                self.vals = np.concatenate([self.vals, np.empty(i)])
            self.slot[key] = i
            self.keys.append(key)
        self.vals[i] = value

    def discard(self, key: Any) -> None:
        i = self.slot.pop(key, None)
        if i is None:
            return
        last = self.keys.pop()
        if i < len(self.keys):          # the last one takes the freed place
            self.keys[i] = last
            self.slot[last] = i
            self.vals[i] = self.vals[len(self.keys)]

    def array(self) -> np.ndarray:
        """The values (a view: copy before keeping it)."""
        return self.vals[:len(self.keys)]


def has_peers(groups: np.ndarray) -> np.ndarray:
    """Whether each element has another member in its group (same label)."""
    if groups.size and (groups == groups[0]).all():
        return np.full(groups.size, groups.size > 1)
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    return counts[inverse] > 1


def peer_scores(values: np.ndarray, groups: np.ndarray,
                floor: float = RankConfig.noise_floor, min_group: int = 2
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Per-element (rel, z, perf) of ``values`` against the members of its group
    (same label in ``groups``), and the median relative noise sigma of the groups
    (callers smooth it over steps and pass it back as ``floor``: eight peers give
    a noisy spread). Members of groups smaller than ``min_group`` score zero:
    a rank alone in its pipeline stage has no peer doing the same work, and
    other stages are heavier or lighter by design (only its own past can judge
    it). Non-positive references give zero scores."""
    n = values.size
    rel = np.zeros(n)
    z = np.zeros(n)
    perf = np.ones(n)
    if n and (groups == groups[0]).all():
        inverse = np.zeros(n, dtype=np.int64)          # one group: no grouping to do
        labels = [0 if n >= min_group else -1]
    else:
        _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
        inverse = np.where(counts[inverse] < min_group, -1, inverse)
        labels = list(np.unique(inverse))
    sigmas = []
    for g in labels:
        idx = np.flatnonzero(inverse == g) if len(labels) > 1 else np.arange(n)
        if g < 0:
            continue
        ref_vals = values[idx]
        if ref_vals.size < 2:
            continue
        if ref_vals.size == 2:
            # Two peers: each against the other (the faster of two is no healthy
            # median: against it, the slower of two identical ranks always looks slow).
            a, b = float(ref_vals[0]), float(ref_vals[1])
            if min(a, b) <= 0.0:
                continue
            r = np.array([a / b - 1.0, b / a - 1.0])
            rel[idx] = r
            z[idx] = r / floor
            perf[idx] = min(a, b) / np.maximum(values[idx], 1e-12)
            continue
        ref, sigma = lower_half_ref(ref_vals)
        if ref <= 0.0:
            continue
        r = values[idx] / ref - 1.0
        rel[idx] = r
        sigmas.append(sigma / ref)
        z[idx] = r / max(sigma / ref, floor)
        perf[idx] = float(ref_vals.min()) / np.maximum(values[idx], 1e-12)
    return rel, z, perf, median(sigmas) if sigmas else 0.0
