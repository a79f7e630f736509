"""Incremental statistics used by the baselines: river's (``river.stats``,
Rust-backed) behind the small read-only interface the models use.

Everything here is O(1) or O(log window) per sample and holds a few floats
or one window, so one instance per rank and metric stays cheap on jobs with
thousands of ranks; the models update them once per step, never per event.

>>> s = EWMeanVar(alpha=0.5)
>>> for x in (1.0, 3.0):
...     s.update(x)
>>> s.mean, s.var
(2.0, 1.0)
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from river import stats

# For a normal sample the interquartile range is 1.349 standard deviations.
IQR_PER_SIGMA = 1.3490


class EWMeanVar:
    """Exponentially weighted mean and variance (Finch 2009, incremental form),
    river's ``EWMean`` and ``EWVar``.

    ``alpha`` is the weight of the newest sample (0 < alpha <= 1, river's
    ``fading_factor``); the memory is about ``1 / alpha`` samples. The first
    sample sets the mean. Values are in the unit of the input (seconds for
    step times).
    """

    __slots__ = ("alpha", "n", "_mean", "_var")

    def __init__(self, alpha: float) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.n = 0
        self._mean = stats.EWMean(alpha)
        self._var = stats.EWVar(alpha)

    def update(self, x: float) -> None:
        self._mean.update(x)
        self._var.update(x)
        self.n += 1

    @property
    def mean(self) -> float:
        return self._mean.get() if self.n else 0.0

    @property
    def var(self) -> float:
        return self._var.get() if self.n else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(max(self.var, 0.0))

    def clone(self) -> EWMeanVar:
        return EWMeanVar(self.alpha)

    def __getstate__(self) -> dict:
        return {"alpha": self.alpha, "n": self.n, "mean": self._mean, "var": self._var}

    def __setstate__(self, d: dict) -> None:
        self.alpha, self.n, self._mean, self._var = d["alpha"], d["n"], d["mean"], d["var"]


class RollingMedian:
    """Median and IQR-based sigma of the last ``window`` samples (seconds in,
    seconds out), river's ``RollingQuantile`` and ``RollingIQR`` (linear
    interpolation, as numpy's default). A baseline that a few outliers
    (warm-up steps, a GC pause) cannot move: half the window must change
    before the median does, a quarter before the sigma does.

    >>> m = RollingMedian(window=5)
    >>> for x in (9.0, 1.0, 1.1, 0.9, 1.0):
    ...     m.update(x)
    >>> m.median, m.n
    (1.0, 5)
    """

    __slots__ = ("window", "n", "_median", "_iqr")

    def __init__(self, window: int) -> None:
        self.window = window
        self.n = 0
        self._median = stats.RollingQuantile(0.5, window)
        self._iqr = stats.RollingIQR(window, 0.25, 0.75)

    def update(self, x: float) -> None:
        self._median.update(x)
        self._iqr.update(x)
        self.n += 1

    @property
    def median(self) -> float:
        return self._median.get() or 0.0

    @property
    def sigma(self) -> float:
        """Interquartile range of the window / 1.349 (a robust std); 0 below two samples."""
        return (self._iqr.get() or 0.0) / IQR_PER_SIGMA if self.n >= 2 else 0.0

    def clone(self) -> RollingMedian:
        return RollingMedian(self.window)

    def __getstate__(self) -> dict:
        return {"window": self.window, "n": self.n, "median": self._median, "iqr": self._iqr}

    def __setstate__(self, d: dict) -> None:
        self.window, self.n, self._median, self._iqr = d["window"], d["n"], d["median"], d["iqr"]


def median(values) -> float:
    """Median of a 1-D array or list (numpy's: the mean of the two middle values
    for an even count), without ``np.median``'s fixed overhead, which dominates
    on the few dozen values the models take a median of at every step."""
    a = np.sort(np.asarray(values, dtype=float))
    k = a.size
    m = k // 2
    return float(a[m]) if k % 2 else 0.5 * (float(a[m - 1]) + float(a[m]))


class RollingMedians:
    """``RollingMedian`` for many series at once: per row, the median and IQR sigma of
    its last ``window`` values, in arrays (``med``, ``sig``, ``n``: values learned all
    told), equal bit for bit to river's (numpy's linear quantiles). ``update`` takes one
    value for each of some rows; only their statistics are computed again.

    >>> m = RollingMedians(window=5)
    >>> m.grow(2)
    >>> for x in (9.0, 1.0, 1.1, 0.9, 1.0):
    ...     m.update(np.array([0, 1]), np.array([x, 2 * x]))
    >>> m.med.tolist(), m.n.tolist()
    ([1.0, 2.0], [5, 5])
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.win = np.zeros((0, window))       # a ring per row
        self.n = np.zeros(0, dtype=np.int64)
        self.med = np.zeros(0)
        self.sig = np.zeros(0)

    def grow(self, rows: int) -> None:
        """Room for ``rows`` rows (new ones empty)."""
        have = self.n.size
        if rows <= have:
            return
        for name in ("win", "n", "med", "sig"):
            a = getattr(self, name)
            b = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
            b[:have] = a
            setattr(self, name, b)

    def trimmed(self, rows: int) -> RollingMedians:
        """A copy of the first ``rows`` rows only."""
        out = RollingMedians(self.window)
        for name in ("win", "n", "med", "sig"):
            setattr(out, name, getattr(self, name)[:rows].copy())
        return out

    def seed(self, row: int, n: int, median: float, sigma: float) -> None:
        """Fill ``row`` as a series of ``n`` values with this median and sigma would leave
        it (normal quantiles): a baseline carried over from river's, whose window is out
        of reach. ``refresh`` the rows after."""
        k = min(n, self.window)
        if k:
            z = [NormalDist().inv_cdf((j + 0.5) / k) for j in range(k)]
            self.win[row, :k] = [median + sigma * x for x in z]
            self.n[row] = n

    def update(self, rows: np.ndarray, x: np.ndarray) -> None:
        """One value for each of ``rows`` (distinct)."""
        if not rows.size:
            return
        self.win[rows, self.n[rows] % self.window] = x
        self.n[rows] += 1
        self.refresh(rows)

    def refresh(self, rows: np.ndarray) -> None:
        """Compute the median and sigma of ``rows`` from their windows."""
        w = self.window
        k = np.minimum(self.n[rows], w)
        vals = np.where(np.arange(w) < k[:, None], self.win[rows], np.inf)
        vals.sort(axis=1)
        iqr = _quantile(vals, k, 0.75) - _quantile(vals, k, 0.25)
        self.med[rows] = _quantile(vals, k, 0.5)
        self.sig[rows] = np.where(k >= 2, iqr / IQR_PER_SIGMA, 0.0)


def _quantile(sorted_rows: np.ndarray, k: np.ndarray, q: float) -> np.ndarray:
    """Per row, the ``q`` quantile of its first ``k`` (sorted) values, exactly as
    ``np.quantile`` (method "linear") computes it; 0 where ``k`` is 0."""
    vi = q * (np.maximum(k, 1) - 1).astype(float)
    lo = np.floor(vi).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(k, 1) - 1)
    t = vi - lo
    idx = np.arange(sorted_rows.shape[0])
    a, b = sorted_rows[idx, lo], sorted_rows[idx, hi]
    diff = b - a
    out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return np.where(k > 0, out, 0.0)
