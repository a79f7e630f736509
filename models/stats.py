"""Incremental statistics used by the baselines (river-style: ``update`` then read).

Everything here is O(1) per sample and holds a few floats, so one instance per
rank and metric stays cheap on jobs with thousands of ranks.

>>> s = EWMeanVar(alpha=0.5)
>>> for x in (1.0, 3.0):
...     s.update(x)
>>> s.mean, s.var
(2.0, 1.0)
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

import numpy as np


class EWMeanVar:
    """Exponentially weighted mean and variance (Finch 2009, incremental form).

    ``alpha`` is the weight of the newest sample (0 < alpha <= 1); the memory is
    about ``1 / alpha`` samples. The first sample sets the mean. Values are in
    the unit of the input (seconds for step times).
    """

    __slots__ = ("alpha", "n", "mean", "var")

    def __init__(self, alpha: float = 0.1) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.n = 0
        self.mean = 0.0
        self.var = 0.0

    def update(self, x: float) -> None:
        if self.n == 0:
            self.mean = x
        else:
            d = x - self.mean
            inc = self.alpha * d
            self.mean += inc
            self.var = (1.0 - self.alpha) * (self.var + d * inc)
        self.n += 1

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def clone(self) -> EWMeanVar:
        return EWMeanVar(self.alpha)

    def __getstate__(self) -> dict:
        return {"alpha": self.alpha, "n": self.n, "mean": self.mean, "var": self.var}

    def __setstate__(self, d: dict) -> None:
        self.alpha, self.n, self.mean, self.var = d["alpha"], d["n"], d["mean"], d["var"]


def robust_scale(values: np.ndarray, center: float) -> float:
    """1.4826 x the median absolute deviation from ``center``: a standard
    deviation estimate that one or a few outliers cannot inflate."""
    return 1.4826 * float(np.median(np.abs(values - center)))


class RollingMedian:
    """Median and MAD-based sigma of the last ``window`` samples (seconds in,
    seconds out). A baseline that a few outliers (warm-up steps, a GC pause)
    cannot move: half the window must change before the median does.

    >>> m = RollingMedian(window=5)
    >>> for x in (9.0, 1.0, 1.1, 0.9, 1.0):
    ...     m.update(x)
    >>> m.median, m.n
    (1.0, 5)
    """

    __slots__ = ("window", "n", "_fifo", "_sorted")

    def __init__(self, window: int = 32) -> None:
        self.window = window
        self.n = 0
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []

    def update(self, x: float) -> None:
        self._fifo.append(x)
        insort(self._sorted, x)
        if len(self._fifo) > self.window:
            old = self._fifo.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self.n += 1

    @property
    def median(self) -> float:
        s = self._sorted
        k = len(s)
        if not k:
            return 0.0
        return s[k // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2])

    @property
    def sigma(self) -> float:
        """1.4826 x the median absolute deviation of the window (a robust std)."""
        s = self._sorted
        k = len(s)
        if k < 2:
            return 0.0
        med = self.median
        dev = sorted(abs(x - med) for x in s)     # a small window: plain Python is faster
        mad = dev[k // 2] if k % 2 else 0.5 * (dev[k // 2 - 1] + dev[k // 2])
        return 1.4826 * mad

    def clone(self) -> RollingMedian:
        return RollingMedian(self.window)

    def __getstate__(self) -> dict:
        return {"window": self.window, "n": self.n, "fifo": list(self._fifo)}

    def __setstate__(self, d: dict) -> None:
        self.window, self.n = d["window"], d["n"]
        self._fifo = deque(d["fifo"])
        self._sorted = sorted(self._fifo)
