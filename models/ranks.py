"""Per-rank state: protected baselines of the rank's own step and how long
it has stood out from its peers.

The baselines are river statistics (``models.stats``), updated once per
step and only from steps where the rank was *not* flagged, so they never
drift to the fault and the alarm never clears itself:

- ``work``: own work as a position against the job-wide level (a ratio):
  rolling median and IQR sigma, so warm-up steps and one-off pauses do not
  move it; the self-relative score of ``models.job`` reads it;
- ``step``, ``own``, ``comm``, ``data``: exponentially weighted mean and
  variance of the step time and its parts (seconds): own work, time blocked
  in collectives, input wait. Input wait above the rank's own usual (and
  above its peers') is what counts as an input stall, and the incident
  evidence shows each part against its usual value.

``cusum`` accumulates the evidence that the rank stands out (robust z-scores
above a reference), so a large slowdown confirms in two steps and a small
one in a few more, while a one-step spike adds a bounded amount.

>>> r = RankState()
>>> r.observe(1.0, 0.9, 0.01, 1.0, flagged=False)
>>> r.observe(2.0, 1.8, 0.01, 2.0, flagged=True)
>>> r.work.median, r.step.mean
(1.0, 1.0)
"""

from __future__ import annotations

from failslow.models.stats import EWMeanVar, RollingMedian

BASELINE_ALPHA = 0.05     # ~20 steps of memory
BASELINE_WINDOW = 32      # steps in the rolling median of own work


class RankState:
    """Baselines and the run of consecutive flagged steps of one rank."""

    __slots__ = ("work", "step", "own", "comm", "data", "streak", "cusum", "clear", "onset_ts",
                 "onset_step", "excess_s", "own_rel", "data_excess_s", "rel", "z", "self_rel",
                 "kind", "quiet", "base_job_s", "lost_s", "c_onset_ts", "c_onset_step",
                 "mean_excess", "mean_z", "mean_n", "recent", "imb", "imb_quiet",
                 "imb_onset_ts", "imb_onset_step", "imb_rel", "imb_excess_s", "imb_lost_s",
                 "since_s", "since_n", "pending", "waited_share", "waited_lag")

    def __init__(self) -> None:
        self.work = RollingMedian(BASELINE_WINDOW)
        self.step = EWMeanVar(BASELINE_ALPHA)
        self.own = EWMeanVar(BASELINE_ALPHA)
        self.comm = EWMeanVar(BASELINE_ALPHA)
        self.data = EWMeanVar(BASELINE_ALPHA)
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
        # An active finding: kind "change" (against its own past) or "far" (far outside
        # its peers), None while the rank is clean; it ends after ``quiet`` clean steps.
        self.kind: str | None = None
        self.quiet = 0             # consecutive steps without evidence
        self.base_job_s = 0.0      # the job's step time before the onset, seconds
        self.lost_s = 0.0          # job time lost to it since the onset, seconds
        self.c_onset_ts = 0.0      # start of the per-step evidence run (cusum > 0)
        self.c_onset_step = 0
        self.mean_excess = 0.0     # windowed mean excess (fraction), its z, its window
        self.mean_z = 0.0
        self.mean_n = 0
        self.recent = 0.0          # own work, seconds, smoothed over every step
        self.imb = False           # a steady imbalance against its peers is recorded
        self.imb_quiet = 0
        self.imb_onset_ts = 0.0
        self.imb_onset_step = 0
        self.imb_rel = 0.0
        self.imb_excess_s = 0.0
        self.imb_lost_s = 0.0
        self.since_s = 0.0         # the job's step times since the onset: sum, count
        self.since_n = 0
        self.pending: list[tuple[float, float, float, float]] = []   # steps not learned yet
        # "waited for by its group" (``models.evidence.WaitedFor``): the share of the last
        # steps its group waited for it, the lag charged to it (fraction of the job's step)
        self.waited_share = 0.0
        self.waited_lag = 0.0

    def observe(self, pos: float, own_s: float, data_s: float, step_s: float,
                flagged: bool, delay: int = 0) -> None:
        """Learn one step (position, own work, input wait and step time, seconds)
        unless the rank was flagged in it. With ``delay``, a step is learned only once
        ``delay`` later steps were not flagged either: a flagged step drops the steps
        still pending before it (on a noisy rank, a fault's first steps are seldom
        flagged one by one, but rarely ``delay`` steps in a row pass clean)."""
        if flagged:
            self.pending.clear()
            return
        self.pending.append((pos, own_s, data_s, step_s))
        if len(self.pending) > delay:
            pos, own_s, data_s, step_s = self.pending.pop(0)
            self.work.update(pos)
            self.step.update(step_s)
            self.own.update(own_s)
            self.comm.update(max(step_s - own_s, 0.0))
            self.data.update(data_s)

    def usual(self) -> dict[str, float]:
        """The learned parts of a normal step (seconds), for incident evidence."""
        return {name: round(getattr(self, name).mean, 4) for name in ("step", "own", "comm", "data")
                if getattr(self, name).n}
