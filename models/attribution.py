"""What a finding costs the job: when it began, the job's step time before it, the
job's step-time increase attributed to it, and the job time lost to it so far.

Every figure comes from measured step durations (the step events' ``duration_s``),
never from a count of steps times an assumed step time: ``lost_s`` sums, step by
step since the onset, the job's step time over its step time before the onset,
bounded by the culprit's own excess that step (a job slower for other reasons does
not bill the culprit). ``gpu_hours_lost`` is ``world * lost_s / 3600``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from failslow.models.config import JobConfig
from failslow.models.findings import job_pct
from failslow.models.ranks import RankState
from failslow.models.stats import RollingMedian


class Attribution:
    """The job-level half of ``models.job.JobState``: its step-time history and the
    lifecycle of each rank's finding (onset, baseline, cost, imbalance records)."""

    cfg: JobConfig
    job_hist: deque[tuple[int, float]]
    job_recent: float
    job_clean: RollingMedian
    job_step_s: float
    step_start: dict[int, float]

    def _activate(self, st: RankState, s: int, ev: Any, i: int, base: float) -> None:
        """A rank's first confirmed step: when it began, and the job's step time before."""
        back = int(ev.back[i])
        if back > 0:
            st.onset_step = s - back + 1
            st.onset_ts = self.step_start.get(st.onset_step, st.c_onset_ts)
        else:
            st.onset_ts, st.onset_step = st.c_onset_ts, st.c_onset_step
        st.kind = "change" if ev.self_driven[i] else "far"
        cc = self.cfg.cost
        before = [d for k, d in self.job_hist if k < st.onset_step][-cc.base_steps:]
        # The mean, as elapsed time adds up step times. An onset estimated late leaves
        # fault steps in ``before``: the job's usual step time (a rolling median,
        # learned while no rank had a finding) bounds it.
        mean = sum(before) / len(before) if len(before) >= cc.base_min_steps else 0.0
        st.base_job_s = min(mean, base) if mean > 0 and base > 0 else mean or base
        # The job's extra time since the onset, up to this step.
        since = [d for k, d in self.job_hist if k >= st.onset_step]
        st.lost_s = sum(max(d - st.base_job_s, 0.0) for d in since) if st.kind == "change" \
            else 0.0
        st.since_s, st.since_n = sum(since), len(since)
        st.quiet = 0

    @staticmethod
    def _reach(st: RankState) -> float:
        """How many job seconds one second of the rank's own excess can cost at most: its
        usual step over its usual own work (>= 1). In data parallel a straggler's excess
        is the job's (everyone waits for it: ~1-2x here); a pipeline stage's excess per
        micro-batch delays every later micro-batch and stage, so the job's step grows by
        up to (micro-batches + stages - 1) / micro-batches times it, which the step /
        own-work ratio of a stage covers (a stage's own work is that fraction of a step)."""
        own, step = st.own.mean if st.own.n else 0.0, st.step.mean if st.step.n else 0.0
        return max(step / own, 1.0) if own > 0 else 1.0

    def _extra(self, st: RankState, job_s: float, excess_s: float) -> float:
        """Job seconds this step lost to the rank: the step's measured excess over the
        job's step time before the onset, bounded by what the rank's own excess can cost
        (``_reach``; a job slower for other reasons does not bill it); a rank far outside
        its peers since the start has no clean past: its own excess."""
        if st.kind == "change" and st.base_job_s > 0:
            return min(max(job_s - st.base_job_s, 0.0), excess_s * self._reach(st))
        return min(excess_s, job_s)

    def slowdown_pct(self, st: RankState) -> float:
        """The job's step-time increase attributed to the rank, percent: the job's MEASURED
        mean step time since the onset over its step time before, minus one, bounded by what
        the rank's own excess can cost (``_reach``); with no clean past, the excess over the
        job's step without it."""
        now = st.since_s / st.since_n if st.since_n else self.job_recent
        if st.kind == "change" and st.base_job_s > 0 and now > 0:
            return 100.0 * min(max(now / st.base_job_s - 1.0, 0.0),
                               max(st.excess_s, 0.0) * self._reach(st) / st.base_job_s)
        return job_pct(st.excess_s, now)

    def _imbalance(self, st: RankState, s: int, ev: Any, i: int, work: float, job_s: float,
                   start_ts: float) -> None:
        """A rank steadily off its peers over the longest window with no change against
        its own past: the layout (an info record), or the end of one."""
        if st.imb:
            if ev.imb_present[i]:
                st.imb_quiet = 0
                a = self.cfg.ranks.imb_alpha
                st.imb_rel = (1.0 - a) * st.imb_rel + a * float(ev.peer_mean[i])
                st.imb_excess_s = st.recent * st.imb_rel / (1.0 + st.imb_rel)
                st.imb_lost_s += min(max(st.imb_excess_s, 0.0), job_s)
            else:
                st.imb_quiet += 1
                st.imb = st.imb_quiet < self.cfg.clean_steps
        elif ev.imbalance[i] and st.kind is None:
            st.imb, st.imb_quiet = True, 0
            st.imb_rel = float(ev.peer_mean[i])
            st.imb_excess_s = st.recent * st.imb_rel / (1.0 + st.imb_rel)
            st.imb_onset_step = max(s - int(ev.peer_n[i]) + 1, 0)
            st.imb_onset_ts = self.step_start.get(st.imb_onset_step, start_ts)
            st.imb_lost_s = st.imb_excess_s * int(ev.peer_n[i])

    def _learn_job(self, s: int, job_s: float, ts: float, faulty: bool) -> None:
        """The job's step history (for pre-onset baselines) and its recent step time."""
        self.job_hist.append((s, job_s))
        a = self.cfg.cost.recent_alpha
        self.job_recent = job_s if self.job_recent == 0.0 else (1.0 - a) * self.job_recent + a * job_s
        if not faulty:
            self.job_clean.update(job_s)
        self.step_start[s] = ts - job_s
        for k in [k for k in self.step_start if k < s - self.cfg.cost.history_steps]:
            del self.step_start[k]

    def _job_base(self) -> float:
        return self.job_clean.median if self.job_clean.n else self.job_step_s
