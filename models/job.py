"""One job's step-by-step evaluation: buffer the step events of every rank,
and once a step is complete (all ranks in, or a later step has moved on)
score every rank against its peers and its own past, confirm sustained
outliers, localize them (rank / host) and watch the job's step time for a
job-wide change point. The per-event work is a dict insert; the math runs
once per step with numpy over the ranks.

A rank's *own work* is the part of its step it did not spend blocked in
collectives: ``compute_s + data_s`` when the step carries them, else
``duration_s - comm_s``, else step time minus the time inside its collective
events, else the step time itself (only informative when ranks do not
synchronize). In synchronous training every step time equalizes, so own work
(and arrival lag) carries the signal, and a rank whose own work is normal
while it waits for a late neighbour is never blamed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from models.alignment import Collective, CollectiveAligner, lags
from models.changepoint import BOCPD
from models.findings import Finding
from models.links import LinkMonitor
from models.peers import lower_half_ref, peer_scores
from models.ranks import RankState
from models.stats import EWMeanVar, median

HOLD_STEPS = 4     # how long a possible host fault may hold single-rank verdicts


class JobConfig:
    """Scale-free thresholds (fractions and z-scores) shared by the job's models.

    ``min_rel``: smallest excess over peers (or over the own baseline) worth
    flagging (0.05 = 5%); ``z_min``: how many noise sigmas that excess must
    also be; ``confirm_steps``: steps of full evidence before a culprit is
    confirmed (a CUSUM over z-scores reaching ``confirm_z = confirm_steps *
    z_min``; one-step spikes never confirm); ``lag_steps``: how far a step may
    trail the step most ranks have reached before it is judged without a rank that
    has stalled (sent no newer step while most ranks moved on ``lag_steps``);
    ``max_behind``: how far before it is judged without ranks that still report, but
    late (a host whose clock is that far ahead sends that much later in ts order);
    ``warm_steps``: samples before an own-past baseline is trusted.
    """

    def __init__(self, min_rel: float = 0.05, z_min: float = 4.0, confirm_steps: int = 2,
                 lag_steps: int = 3, warm_steps: int = 10, max_behind: int = 16) -> None:
        self.min_rel = min_rel
        self.z_min = z_min
        self.confirm_steps = confirm_steps
        self.confirm_z = confirm_steps * z_min
        self.lag_steps = lag_steps
        self.max_behind = max_behind
        self.warm_steps = warm_steps


class JobState:
    """Everything failslow knows about one job, fed one event at a time."""

    def __init__(self, job_id: str, cfg: JobConfig) -> None:
        self.job_id = job_id
        self.cfg = cfg
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.last_step: dict[int, int] = {}
        self.progress = -1           # newest step that most ranks have reached
        self.moved: dict[int, int] = {}   # rank -> progress when its last step advanced
        self.evaluated = -1
        self.judged = 0              # steps evaluated so far
        self.host_seen: dict[str, int] = {}   # host -> last step all its ranks stood out
        self.world = 0
        self.ranks: dict[int, RankState] = {}
        self.rank_host: dict[int, str] = {}
        self.rank_gpu: dict[int, int] = {}
        self.aligner = CollectiveAligner()
        self.links = LinkMonitor(cfg)
        self.cpd = BOCPD()
        self.noise = EWMeanVar(0.1)  # peers' relative spread, smoothed over steps
        self.job_step_s = 0.0        # typical healthy step time, seconds
        self.job_onset: tuple[float, int] | None = None
        self.real_steps = False      # step events seen (else steps come from collectives)
        self.synth: dict[int, list[Any]] = {}   # rank -> [step, end ts, seconds in colls]
        self.widest = 0              # largest collective group seen

    # -- ingestion (hot path) --------------------------------------------------

    def add_step(self, ev: dict[str, Any], real: bool = True
                 ) -> list[tuple[int, list[Finding], float]]:
        if real and not self.real_steps:
            self.real_steps = True
            self.pending.clear()       # steps made from collectives give way to real ones
        s = ev["step"]
        r = ev["rank"]
        row = self.pending.get(s)
        if row is None:
            if s <= self.evaluated:
                return []              # too late: that step was already judged
            row = self.pending[s] = {}
        row[r] = ev
        if s > self.last_step.get(r, -1):
            self.moved[r] = self.progress
        self.last_step[r] = s
        self.world = ev["world_size"]
        out = []
        if s > self.progress and 2 * len(row) > self.world:
            # Most ranks reached step s. Progress is what most ranks did, not the newest
            # step of any rank: a host whose clock is behind sends its steps early in ts
            # order, and must not make the others' steps look overdue.
            self.progress = s
            out.extend(self._overdue())
        if len(row) >= self.world and s in self.pending:
            for old in sorted(k for k in self.pending if k <= s):
                out.append(self.evaluate(old))
        return out

    def _overdue(self) -> list[tuple[int, list[Finding], float]]:
        """Judge the incomplete steps most ranks left ``lag_steps`` behind, in order, with the
        ranks they have: once every rank missing from one has stalled (a rank that keeps
        reporting newer steps is late, not gone: its events come later in ts order when
        its host's clock is ahead), or once it is ``max_behind`` steps behind."""
        out = []
        p, cfg = self.progress, self.cfg
        for k in sorted(k for k in self.pending if k <= p - cfg.lag_steps):
            row = self.pending[k]
            if p - k < cfg.max_behind and any(
                    p - self.moved[r] < cfg.lag_steps for r in self.moved if r not in row):
                break
            out.append(self.evaluate(k))
        return out

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Snapshots from before ``progress`` / ``moved``: every rank counts as stalled.
        state.setdefault("progress", state.pop("newest", -1))
        state.setdefault("moved", {})
        self.__dict__.update(state)

    def add_collective(self, ev: dict[str, Any]) -> list[tuple[int, list[Finding], float]]:
        """A collective event that names no step: it belongs to the rank's next
        step; in a job that sends no step events at all (an NCCL-Inspector-like
        source), its collectives make the steps (``_synth_step``)."""
        if not self.real_steps:
            return self._synth_step(ev)
        self.aligner.add(ev, self.last_step.get(ev["rank"], -1) + 1)
        return []

    def _synth_step(self, ev: dict[str, Any]) -> list[tuple[int, list[Finding], float]]:
        """Steps from collectives alone: the job's widest group (by size) syncs
        every rank, so each of its collectives closes a step of the rank. The
        step lasts from the end of the rank's previous one to the end of this
        one, and the rank spent ``comm_s`` of it inside collectives (all groups)
        — both on the rank's own clock, so clock skew between hosts cancels."""
        r = ev["rank"]
        size = ev["group_size"]
        if size > self.widest:
            self.widest = size
        st = self.synth.get(r)
        if st is None:
            st = self.synth[r] = [-1, None, 0.0]
        st[2] += ev["duration_s"]
        k = st[0] + 1
        self.aligner.add(ev, k)
        if size < self.widest:
            return []
        end = ev["start_ts"] + ev["duration_s"]
        prev, comm = st[1], st[2]
        st[0], st[1], st[2] = k, end, 0.0
        if prev is None:
            return []
        step = {"ts": ev["ts"], "job_id": self.job_id, "rank": r, "world_size": self.widest,
                "host": ev["host"], "step": k, "duration_s": end - prev, "comm_s": comm,
                "gpu": ev.get("gpu")}
        return self.add_step(step, real=False)

    def drain(self) -> list[tuple[int, list[Finding], float]]:
        return [self.evaluate(s) for s in sorted(self.pending)]

    # -- once per step -----------------------------------------------------------

    def evaluate(self, s: int) -> tuple[int, list[Finding], float]:
        """Judge step ``s``; returns (step, findings, ts of the newest event in it)."""
        row = self.pending.pop(s)
        self.evaluated = max(self.evaluated, s)
        cfg = self.cfg
        ranks = sorted(row)
        n = len(ranks)
        work = np.empty(n)
        data = np.zeros(n)
        dur = np.empty(n)
        groups = np.zeros(n, dtype=np.int64)
        ts_max = 0.0
        need_time = False
        take_time = self.aligner.take_time
        for i, r in enumerate(ranks):
            ev = row[r]
            d = ev["duration_s"]
            dur[i] = d
            ts_max = max(ts_max, ev["ts"])
            coll = take_time(r, s)
            dt = ev.get("data_s")
            if dt is not None:
                data[i] = dt
            c = ev.get("compute_s")
            cm = ev.get("comm_s")
            if c is not None:
                work[i] = c + data[i]
            elif cm is not None:
                work[i] = d - cm
            else:
                need_time = True
                work[i] = d - coll if coll is not None else d
            pp = ev.get("pp_rank")
            groups[i] = pp if pp is not None else 0
            self.rank_host[r] = ev["host"]
            g = ev.get("gpu")
            if g is not None:
                self.rank_gpu[r] = g
        # Time inside collectives is only counted while steps lack compute_s and comm_s.
        self.aligner.need_time = need_time
        rel, z, perf, sig = peer_scores(work, groups, floor=max(0.01, self.noise.mean))
        if sig > 0:
            self.noise.update(sig)
        # Own past is kept as the rank's position against the job-wide level (the
        # faster half's median of all ranks), so a change of the whole job (a new
        # phase, longer sequences) never looks like a change of one rank.
        level = lower_half_ref(work)[0]
        pos = work / level if level > 0 else np.ones(n)
        rel2, z2 = self._self_scores(ranks, pos)
        risen = np.flatnonzero((rel2 >= cfg.min_rel) & (z2 >= cfg.z_min / 2))
        if risen.size > 2 and len({row[ranks[i]]["host"] for i in risen}) > 1:
            # Many ranks on several hosts rose against their own past at once: a
            # job-wide change (a new phase reaching the stages a step apart), not a
            # culprit. Only peers judge this step.
            rel2 = np.zeros(n)
            z2 = np.zeros(n)
        # Evidence per step, in z-units above the allowance k = z_min / 2: only an
        # excess of at least min_rel counts in full, and one step adds at most
        # z_min, so a confirmation (cusum >= 2 z_min) always spans two steps or more.
        k = cfg.z_min / 2
        zp = np.where(rel >= cfg.min_rel, z, np.minimum(z, k))
        zs = np.where(rel2 >= cfg.min_rel, z2, np.minimum(z2, k))
        inc = np.minimum(np.maximum(zp, zs), cfg.z_min + k) - k
        self.judged += 1
        if self.judged <= cfg.warm_steps:
            # Warm-up steps (compilation, allocator, autotuning) differ from rank to
            # rank for no lasting reason: no evidence from them.
            inc = np.minimum(inc, 0.0)
        weak = (rel >= cfg.min_rel / 2) & (z >= k) | (rel2 >= cfg.min_rel / 2) & (z2 >= k)
        job_s = median(dur)
        findings: list[Finding] = []
        present: list[int] = []
        dref = median(data)
        for i, r in enumerate(ranks):
            st = self.ranks.get(r)
            if st is None:
                st = self.ranks[r] = RankState()
            ev = row[r]
            if inc[i] > 0 and st.cusum == 0.0:
                st.onset_ts = ev["ts"] - ev["duration_s"]
                st.onset_step = s
            # Capped so the evidence drains within a few steps once the fault ends.
            st.cusum = min(max(0.0, st.cusum + float(inc[i])), cfg.confirm_z + cfg.z_min)
            st.streak = st.streak + 1 if st.cusum >= cfg.confirm_z else 0
            st.clear = 0 if weak[i] else st.clear + 1
            ref = float(work[i]) / (1.0 + max(float(rel[i]), float(rel2[i])))
            excess = float(work[i]) - ref
            st.excess_s = excess if st.streak <= 1 else 0.7 * st.excess_s + 0.3 * excess
            own = max(float(rel[i]), float(rel2[i]))
            st.own_rel = own if st.streak <= 1 else 0.7 * st.own_rel + 0.3 * own
            # Input wait above both the peers' and the rank's own usual: a loader
            # that is always a little slower there is no stall.
            usual_data = st.data.mean if st.data.n >= cfg.warm_steps else 0.0
            st.data_excess_s = max(float(data[i]) - max(dref, usual_data), 0.0)
            st.rel, st.z, st.self_rel = float(rel[i]), float(z[i]), float(rel2[i])
            st.observe(float(pos[i]), float(work[i]), float(data[i]), float(dur[i]),
                       bool(weak[i]))
            if st.streak or weak[i]:
                present.append(r)        # weakly present keeps an open incident alive
        colls = self.aligner.take_step(s)
        findings.extend(self._localize(present, s, job_s, perf, ranks, colls))
        findings.extend(self.links.evaluate(s, colls, self.rank_host, ts_max, job_s))
        self.aligner.expire(s)
        findings.extend(self._job_level(s, job_s, ts_max, bool(findings)))
        return s, findings, ts_max

    def _self_scores(self, ranks: list[int], pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each rank's position (own work / job level) over its own usual position,
        compared across ranks: a rank or host that got slower stands out, even
        when its peers are all on that one slow host. The noise is the larger of
        the ranks' spread and the rank's own step-to-step spread."""
        n = len(ranks)
        ratio = np.ones(n)
        own = np.zeros(n)
        ok = np.zeros(n, dtype=bool)
        for i, r in enumerate(ranks):
            st = self.ranks.get(r)
            med = st.work.median if st is not None else 0.0
            if st is not None and st.work.n >= self.cfg.warm_steps and med > 0:
                ratio[i] = pos[i] / med
                own[i] = st.work.sigma / med
                ok[i] = True
        if ok.sum() < 4:
            return np.zeros(n), np.zeros(n)
        ref, sigma = lower_half_ref(ratio[ok])
        if ref <= 0:           # most ranks did no own work this step (odd clocks): no score
            return np.zeros(n), np.zeros(n)
        rel = np.where(ok, ratio / ref - 1.0, 0.0)
        return rel, rel / np.maximum(max(sigma / ref, 0.01, self.noise.mean), own)

    def _localize(self, culprits: list[int], s: int, job_s: float, perf: np.ndarray,
                  ranks: list[int], colls: list[Collective]) -> list[Finding]:
        """Group present culprits: all ranks of a multi-rank host -> slow_host, else slow_rank."""
        if not culprits:
            return []
        per_host: dict[str, list[int]] = {}
        for r, h in self.rank_host.items():
            per_host.setdefault(h, []).append(r)
        out = []
        left = set(culprits)
        for h, members in per_host.items():
            if len(members) < 2:
                continue
            whole = all(m in left for m in members)
            # A host fault drains from its ranks unevenly: while it was seen lately,
            # its remaining ranks keep the host finding alive, never open rank ones.
            draining = not whole and s - self.host_seen.get(h, -10**9) <= 2 * HOLD_STEPS \
                and any(m in left for m in members)
            if whole or draining:
                if whole:
                    self.host_seen[h] = s
                members = [m for m in members if m in left] if draining else members
                sts = [self.ranks[m] for m in members]
                excess = median([st.excess_s for st in sts])
                data_ex = median([st.data_excess_s for st in sts])
                out.append(Finding(
                    key=f"slow_host:{h}", fault="slow_host",
                    confirmed=whole and sum(st.streak > 0 for st in sts) * 2 >= len(sts),
                    onset_ts=min(st.onset_ts for st in sts),
                    onset_step=min(st.onset_step for st in sts),
                    slowdown_pct=_pct(excess, job_s), host=h, hosts=[h],
                    own_pct=100.0 * median([st.own_rel for st in sts]),
                    gpus=[(h, self.rank_gpu[m]) for m in members if m in self.rank_gpu],
                    data_share=_share(data_ex, excess),
                    evidence={"ranks": sorted(members),
                              "work_excess_s": round(excess, 4),
                              "rel_to_peers": round(median([st.rel for st in sts]), 3),
                              "rel_to_own_past": round(median([st.self_rel for st in sts]), 3)}))
                left -= set(members)
        # Half or more of a host rising together, not all of it yet: likely a host
        # fault still spreading over its ranks, so hold the single-rank verdicts for
        # a few steps.
        held = {m for members in per_host.values() if len(members) >= 2
                and 2 * sum(m in left or (m in self.ranks and self.ranks[m].cusum > 0)
                            for m in members) >= len(members)
                for m in members if m in left and s - self.ranks[m].onset_step < HOLD_STEPS}
        pos = {r: i for i, r in enumerate(ranks)}
        late = lags(colls) if left else {}
        for r in sorted(left):
            st = self.ranks[r]
            rh = self.rank_host.get(r)
            g = self.rank_gpu.get(r)
            i = pos.get(r)
            out.append(Finding(
                key=f"slow_rank:r{r}", fault="slow_rank",
                confirmed=st.streak > 0 and r not in held,
                onset_ts=st.onset_ts, onset_step=st.onset_step,
                slowdown_pct=_pct(st.excess_s, job_s), own_pct=100.0 * st.own_rel, rank=r,
                host=rh, gpu=g,
                hosts=[rh] if rh else [],
                gpus=[(rh, g)] if rh is not None and g is not None else [],
                data_share=_share(st.data_excess_s, st.excess_s),
                evidence={"work_excess_s": round(st.excess_s, 4),
                          "rel_to_peers": round(st.rel, 3), "z_to_peers": round(st.z, 1),
                          "rel_to_own_past": round(st.self_rel, 3),
                          "perf_vs_best": round(float(perf[i]), 3) if i is not None else None,
                          "arrival_lag_s": round(late.get(r, 0.0), 4) if i is not None else None,
                          "evidence_z": round(st.cusum, 1),
                          "own_usual_position": round(st.work.median, 4),
                          "own_usual_s": st.usual()}))
        return out

    def _job_level(self, s: int, job_s: float, ts: float, located: bool) -> list[Finding]:
        """Change point on the job's step time; a confirmed slowdown nobody in
        particular explains is a job_slowdown (info)."""
        if job_s <= 0:
            return []
        cpd = self.cpd
        cpd.update(math.log(job_s))
        if cpd.baseline.n:
            self.job_step_s = math.exp(cpd.baseline.mean)
        if cpd.drift_detected and cpd.shift > 0 and self.job_onset is None:
            start = s - cpd.run_length + 1
            self.job_onset = (ts - cpd.run_length * job_s, start)
        elif self.job_onset is not None and (not cpd.baseline.n or
                                              math.log(job_s) - cpd.baseline.mean
                                              < cpd.min_shift / 2):
            self.job_onset = None
        if self.job_onset is None or located:
            return []
        pct = 100.0 * (job_s / self.job_step_s - 1.0) if self.job_step_s else 0.0
        return [Finding(key="job_slowdown:job", fault="job_slowdown",
                        confirmed=cpd.drift_detected, onset_ts=self.job_onset[0],
                        onset_step=self.job_onset[1], slowdown_pct=max(pct, 0.0),
                        own_pct=max(pct, 0.0),
                        evidence={"step_s": round(job_s, 4),
                                  "baseline_step_s": round(self.job_step_s, 4),
                                  "change_prob": round(cpd.change_prob, 3)})]


def _pct(excess_s: float, job_s: float) -> float:
    """Job step-time increase caused by ``excess_s`` extra seconds on the critical path."""
    base = job_s - excess_s
    return 100.0 * excess_s / base if base > 0 and excess_s > 0 else 0.0


def _share(part: float, whole: float) -> float:
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else 0.0
