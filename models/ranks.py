"""Per-rank state: a protected baseline of the rank's own work and how long
it has stood out from its peers.

The baselines (own work as a position against the job-wide level, a ratio:
rolling median and robust sigma, so warm-up steps and one-off pauses do not
move it; input wait and step time, seconds: exponentially weighted
mean/variance) learn only from steps where the rank was
*not* flagged, so they never drift to the fault and the alarm never clears
itself. ``cusum`` accumulates the evidence that the rank stands out (robust
z-scores above a reference), so a large slowdown confirms in two steps and a
small one in a few more, while a one-step spike adds a bounded amount.

>>> r = RankState()
>>> r.observe(1.0, 0.01, 1.0, flagged=False); r.observe(2.0, 0.01, 2.0, flagged=True)
>>> r.work.median
1.0
"""

from __future__ import annotations

from models.stats import EWMeanVar, RollingMedian

BASELINE_ALPHA = 0.05     # ~20 steps of memory
BASELINE_WINDOW = 32      # steps in the rolling median of own work


class RankState:
    """Baselines and the run of consecutive flagged steps of one rank."""

    __slots__ = ("work", "data", "dur", "streak", "cusum", "clear", "onset_ts", "onset_step",
                 "excess_s", "own_rel", "data_excess_s", "rel", "z", "self_rel")

    def __init__(self) -> None:
        self.work = RollingMedian(BASELINE_WINDOW)
        self.data = EWMeanVar(BASELINE_ALPHA)
        self.dur = EWMeanVar(BASELINE_ALPHA)
        self.streak = 0           # consecutive steps flagged
        self.cusum = 0.0          # accumulated evidence (z-units) of standing out
        self.clear = 0            # consecutive steps not even weakly flagged
        self.onset_ts = 0.0       # start of the first step of the current streak
        self.onset_step = 0
        self.excess_s = 0.0       # own work above the peer reference, smoothed, seconds
        self.own_rel = 0.0        # own work above the reference, fraction, smoothed
        self.data_excess_s = 0.0  # the part of it spent waiting for input
        self.rel = 0.0
        self.z = 0.0
        self.self_rel = 0.0

    def observe(self, work: float, data: float, dur: float, flagged: bool) -> None:
        if not flagged:
            self.work.update(work)
            self.data.update(data)
            self.dur.update(dur)

    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, d: dict) -> None:
        for k, v in d.items():
            setattr(self, k, v)
