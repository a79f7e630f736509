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
