"""Localization of one judged step: the ranks that stand out become findings, grouped
by host (every rank of a multi-rank host -> ``slow_host``, else ``slow_rank``), plus
the info-level imbalance records (``models.job``: a rank steadily off its peers
from the start is the layout, not a fail-slow)."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from failslow.models.alignment import Collective, lags
from failslow.models.config import JobConfig
from failslow.models.evidence import RankEvidence
from failslow.models.findings import Finding, job_pct
from failslow.models.ranks import RankState, RankTable
from failslow.models.stats import median


class JobState(Protocol):
    """What localization reads of a job (``models.job.JobState``): a protocol, so this
    module does not import the job that calls it."""

    rank_host: dict[int, str]
    rank_gpu: dict[int, int]
    ranks: RankTable
    host_seen: dict[str, int]
    host_firm: dict[str, int]
    alone: set[int]
    world: int
    evidence: RankEvidence
    cfg: JobConfig

    def slowdown_pct(self, st: RankState) -> float: ...

IMBALANCE_ADVICE = ("steady since the job's first steps: the layout, not a fail-slow; "
                    "rebalance micro-batches / stages, or move the rank to a faster GPU")


def localize(job: JobState, culprits: list[int], s: int, job_s: float, perf: np.ndarray,
             ranks: list[int], colls: list[Collective]) -> list[Finding]:
    """Group present culprits: all ranks of a multi-rank host -> slow_host, else slow_rank."""
    if not culprits:
        return []
    out = []
    hold = job.cfg.host_hold_steps
    left = set(culprits)
    # A rank with a finding that its group waited for in most of its last steps
    # (``models.evidence.WaitedFor``) is a rank fault whatever its host-mates do: when
    # a host is slow, the group waits for one of its ranks or another, never one alone.
    solo = {r for r in left if r in job.ranks and job.ranks[r].kind is not None
            and job.ranks[r].waited_share >= job.cfg.evidence.waited_bar}
    hosted = left - solo
    # Only a host with a culprit that is not solo can be named or held (below): the
    # others are never looked at (one step of a large job has a handful), so only their
    # members are gathered (in the job's order of ranks, as for every host).
    touched = {job.rank_host.get(r) for r in hosted}
    per_host: dict[str, list[int]] = {}
    for r, h in job.rank_host.items():
        if h in touched:
            per_host.setdefault(h, []).append(r)
    for h, members in per_host.items():
        if len(members) < 2 or h not in touched:
            continue
        # One rank with a finding of its own beside ranks only weakly present (noise, a
        # machine-wide hiccup) is a rank fault: a host verdict needs two ranks of
        # their own, or none yet (a host fault that is still rising).
        n_own = sum(job.ranks[m].kind is not None or job.ranks[m].streak > 0
                    for m in members if m in job.ranks)
        whole = all(m in hosted for m in members) and n_own != 1
        # A host fault drains from its ranks unevenly: while it was seen lately,
        # its remaining ranks keep the host finding alive, never open rank ones. A host
        # finding confirmed lately (a host fault) holds them 2 * ``host_hold_steps``; ranks that
        # only rose together (a possible host fault: say a host-mate's noise beside a
        # rank that then confirmed alone) hold them ``host_hold_steps``, as ``held`` does, and
        # only while two of them still stand out (with its host-mates clean again, the
        # one left is a rank fault).
        firm = job.host_firm
        draining = not whole and any(m in hosted for m in members) and (
            s - firm.get(h, -math.inf) <= 2 * hold
            or s - job.host_seen.get(h, -math.inf) <= hold and sum(
                m in hosted or (m in job.ranks and job.ranks[m].cusum > 0)
                for m in members) >= 2)
        if whole or draining:
            members = [m for m in members if m in hosted] if draining else members
            sts = [job.ranks[m] for m in members]
            confirmed = whole and sum(st.streak > 0 for st in sts) * 2 >= len(sts)
            if whole:
                job.host_seen[h] = s
            if confirmed:
                firm[h] = s
            excess = median([st.excess_s for st in sts])
            data_ex = median([st.data_excess_s for st in sts])
            out.append(Finding(
                key=f"slow_host:{h}", fault="slow_host",
                confirmed=confirmed,
                # a member never confirmed has no onset of its own yet (0): its
                # evidence run's start stands in
                onset_ts=min(st.onset_ts or st.c_onset_ts for st in sts),
                onset_step=min(st.onset_step if st.onset_ts else st.c_onset_step
                               for st in sts),
                slowdown_pct=job_pct(excess, job_s), host=h, hosts=[h], rule="host-ranks",
                own_pct=100.0 * median([st.own_rel for st in sts]),
                gpus=[(h, job.rank_gpu[m]) for m in members if m in job.rank_gpu],
                data_share=_share(data_ex, excess),
                lost_s=max(st.lost_s for st in sts), world=job.world,
                evidence={"ranks": sorted(members),
                          "work_excess_s": round(excess, 4),
                          "rel_to_peers": round(median([st.rel for st in sts]), 3),
                          "rel_to_own_past": round(median([st.self_rel for st in sts]), 3),
                          # issue 15 hook (owner of models/incidents.py): the ranks' windowed
                          # evidence, for the tracker's fade check (``steady``)
                          "mean_excess": round(median([st.mean_excess for st in sts]), 3),
                          "mean_excess_steps": int(median([float(st.mean_n) for st in sts]))}))
            left -= set(members)
            hosted -= set(members)
    # Half or more of a host rising together, not all of it yet: likely a host
    # fault still spreading over its ranks, so hold the single-rank verdicts for
    # a few steps.
    touched = {job.rank_host.get(r) for r in hosted}
    held = {m for h, members in per_host.items() if len(members) >= 2 and h in touched
            and 2 * sum(m in left or (m in job.ranks and job.ranks[m].cusum > 0)
                        for m in members) >= len(members)
            for m in members if m in hosted and s - job.ranks[m].onset_step < hold}
    pos = {r: i for i, r in enumerate(ranks)}
    late = lags(colls, left) if left else {}     # read for the ranks left only
    for r in sorted(left):
        st = job.ranks[r]
        rh = job.rank_host.get(r)
        g = job.rank_gpu.get(r)
        i = pos.get(r)
        out.append(Finding(
            key=f"slow_rank:r{r}", fault="slow_rank",
            confirmed=st.streak > 0 and r not in held,
            onset_ts=st.onset_ts, onset_step=st.onset_step,
            slowdown_pct=job.slowdown_pct(st), own_pct=100.0 * st.own_rel, rank=r,
            host=rh, gpu=g,
            hosts=[rh] if rh else [],
            gpus=[(rh, g)] if rh is not None and g is not None else [],
            data_share=_share(st.data_excess_s, st.excess_s),
            lost_s=st.lost_s, world=job.world, rule=_rank_rule(st, job.cfg.evidence.waited_bar),
            evidence={"work_excess_s": round(st.excess_s, 4),
                      "rel_to_peers": round(st.rel, 3),
                      "rel_to_own_past": round(st.self_rel, 3),
                      "mean_excess": round(st.mean_excess, 3),
                      "mean_excess_z": round(st.mean_z, 1),
                      "mean_excess_steps": st.mean_n,
                      "evidence": st.kind,
                      # the share of its last steps its group waited for it, and the lag
                      # charged to it then (fraction of the job's step): models.evidence
                      "waited_share": round(st.waited_share, 3),
                      "waited_lag_rel": round(st.waited_lag, 3),
                      "waited_lag_now": round(job.evidence.waited.now(r), 3),
                      "baseline_step_s": round(st.base_job_s, 4),
                      "perf_vs_best": round(float(perf[i]), 3) if i is not None else None,
                      "arrival_lag_s": round(late.get(r, 0.0), 4) if i is not None else None,
                      "evidence_z": round(st.cusum, 1),
                      "own_usual_position": round(st.work.median, 4),
                      "own_usual_s": st.usual()}))
        if r not in job.alone:
            # a rank alone in its pipeline stage has no z to peers (no measurement, not
            # 0): the tracker weighs its noise by its own-past evidence (``evidence_z``)
            out[-1].evidence["z_to_peers"] = round(st.z, 1)
    return out


def imbalances(job: JobState, ranks: list[int], job_s: float) -> list[Finding]:
    """Info-level records of ranks steadily off their peers since the start."""
    out = []
    table = job.ranks
    for i in np.flatnonzero(table.imb[table.slots_for(ranks)]).tolist():
        r = ranks[i]
        st = table[r]
        rh = job.rank_host.get(r)
        g = job.rank_gpu.get(r)
        cost = job_pct(st.imb_excess_s, job_s)
        out.append(Finding(
            key=f"imbalance:r{r}", fault="slow_rank", confirmed=True,
            onset_ts=st.imb_onset_ts, onset_step=st.imb_onset_step,
            slowdown_pct=cost, own_pct=100.0 * st.imb_rel, rank=r, host=rh, gpu=g,
            hosts=[rh] if rh else [], gpus=[(rh, g)] if rh is not None and g is not None else [],
            lost_s=st.imb_lost_s, world=job.world, imbalance=True, rule="imbalance",
            evidence={"imbalance": True, "rel_to_peers": round(st.imb_rel, 3),
                      "work_excess_s": round(st.imb_excess_s, 4),
                      "cost_pct": round(cost, 2), "advice": IMBALANCE_ADVICE}))
    return out


def _rank_rule(st: RankState, waited_bar: float) -> str:
    """The signal behind a rank's finding: its group waiting for it in most of its last
    steps (``waited_bar``), else what confirmed it (a change against its own past, or its
    peers)."""
    if st.waited_share >= waited_bar:
        return "step-waited"
    return "step-own-past" if st.kind == "change" else "step-peers"


def _share(part: float, whole: float) -> float:
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else 0.0
