"""A step's cost that does not scale with a rank's share of the batch (issue 32).

When a job's ranks take uneven shares of the global batch (a rebalance: step events
carry ``samples``), each rank's own work is ``fixed + per_sample x samples``: the
optimizer, the all-reduce's CPU, the launch overheads do not shrink with the share.
Judging a rank by ``work / samples`` then makes a rank on a small share look slow per
sample by ``fixed / samples``: a recovered straggler still holding its small share stays
"slow" (its incident resolved 20-44 steps after its recovery on the bench, never with a
fixed cost a quarter of the step), and the planner's time per sample undershoots.

``FixedCost`` estimates ``fixed`` from the job's own steps. It keeps the newest ``keep``
steps' work of each set of shares the job ran on (the ``sets`` most recent sets): the
same per-sample speed at two or more shares is a line per rank, whose intercept is the
fixed cost. Each rank's line is a least-squares fit of its median work on each set
(weighted by its steps there, sets with ``steps`` steps or more), over the sets where it
stood at or above the median share (the ranks that gave no work away: a straggler's
speed changes around its rebalance, its line says nothing of the fixed cost) and whose
shares of it differ by ``spread`` or more. The job's fixed cost is the median of those
ranks' intercepts, clipped to ``[0, fixed_max x the step's median work]``; 0 before any
such line: work scales with the share, as before.

>>> est = FixedCost(steps=2, spread=0.05, fixed_max=0.5, keep=4, sets=4)
>>> for _ in range(2): est.observe([32, 32, 32, 32], [0.148, 0.148, 0.148, 0.148])
>>> for _ in range(2): est.observe([37, 37, 18, 36], [0.168, 0.168, 0.092, 0.164])
>>> round(est.fixed(), 4)
0.02
>>> [round(float(x), 4) for x in est.normalize([37, 37, 18, 36], [0.168, 0.168, 0.092, 0.164])]
[0.166, 0.166, 0.166, 0.166]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class _Set:
    """The newest steps' work on one set of shares (a ring of ``keep`` rows)."""

    __slots__ = ("shares", "ring", "n")

    def __init__(self, shares: np.ndarray, keep: int) -> None:
        self.shares = shares
        self.ring = np.zeros((keep, shares.size))
        self.n = 0

    def add(self, work: np.ndarray) -> None:
        self.ring[self.n % len(self.ring)] = work
        self.n += 1

    def median(self) -> np.ndarray:
        return np.median(self.ring[:min(self.n, len(self.ring))], axis=0)


class FixedCost:
    """One job's fixed per-step cost, from its steps on different shares (see the module).
    ``observe`` each judged step's samples and work (rank order, the same ranks from step
    to step); ``normalize`` a step's work to what each rank would do at the step's median
    share."""

    def __init__(self, steps: int, spread: float, fixed_max: float, keep: int,
                 sets: int) -> None:
        self.steps = steps
        self.spread = spread
        self.fixed_max = fixed_max
        self.keep = keep
        self.sets_max = sets
        self.sets: dict[tuple[float, ...], _Set] = {}   # oldest used first
        self.estimate: float | None = None
        self.stale = 0                                    # steps since the estimate

    def observe(self, samples: Sequence[float] | np.ndarray,
                work: Sequence[float] | np.ndarray) -> None:
        b = np.asarray(samples, dtype=float)
        key = tuple(b.tolist())
        cur = self.sets.pop(key, None)
        if cur is None:
            cur = _Set(b, self.keep)
            if any(len(k) != b.size for k in self.sets):
                self.sets.clear()                         # the world changed
            while len(self.sets) >= self.sets_max:
                del self.sets[next(iter(self.sets))]
        self.sets[key] = cur                              # the newest used last
        cur.add(np.asarray(work, dtype=float))
        self.stale += 1
        if self.stale >= self.steps and len(self.sets) > 1:
            est = self._fit()
            if est is not None:
                self.estimate, self.stale = est, 0

    def _fit(self) -> float | None:
        full = [s for s in self.sets.values() if s.n >= self.steps]
        if len(full) < 2:
            return None
        b = np.array([s.shares for s in full])                    # sets x ranks
        w = np.array([s.median() for s in full])
        giver = b >= np.median(b, axis=1, keepdims=True)
        wt = np.where(giver & np.isfinite(w), np.array([min(s.n, self.keep)
                                                        for s in full])[:, None], 0.0)
        w = np.where(wt > 0, w, 0.0)
        hi = np.where(wt > 0, b, -np.inf).max(axis=0)
        lo = np.where(wt > 0, b, np.inf).min(axis=0)
        lines = np.flatnonzero((hi - lo >= self.spread * hi) & (hi > 0))
        if not lines.size:
            return None
        b, w, wt = b[:, lines], w[:, lines], wt[:, lines]
        tot = wt.sum(axis=0)
        bm = (wt * b).sum(axis=0) / tot
        wm = (wt * w).sum(axis=0) / tot
        slope = (wt * (b - bm) * (w - wm)).sum(axis=0) / (wt * (b - bm) ** 2).sum(axis=0)
        return float(np.median(wm - slope * bm))

    def fixed(self, typical: float | None = None) -> float:
        """The fixed cost (seconds), clipped to ``[0, fixed_max x typical]`` when a typical
        work is given; 0 before steps on different shares have estimated it."""
        if self.estimate is None:
            return 0.0
        c = max(self.estimate, 0.0)
        return c if typical is None else min(c, self.fixed_max * typical)

    def normalize(self, samples: Sequence[float] | np.ndarray,
                  work: Sequence[float] | np.ndarray) -> np.ndarray:
        """Each rank's work at the step's median share: the fixed cost as it is, the rest
        scaled by (median share / its share)."""
        b = np.asarray(samples, dtype=float)
        w = np.asarray(work, dtype=float)
        c = self.fixed(float(np.median(w)))
        return c + np.maximum(w - c, 0.0) * (float(np.median(b)) / b)
