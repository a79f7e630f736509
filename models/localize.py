"""Localization of one judged step: the ranks that stand out become findings, grouped
by host (every rank of a multi-rank host -> ``slow_host``, else ``slow_rank``), plus
the info-level imbalance records (``models.job``: a rank steadily off its peers
from the start is the layout, not a fail-slow)."""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from failslow.models.alignment import Collective, lags
from failslow.models.config import JobConfig
from failslow.models.evidence import RankEvidence
from failslow.models.findings import Finding, job_pct
from failslow.models.layout import Layout
from failslow.models.ranks import EW_STATS, KINDS, RankState, RankTable
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

    def layout(self) -> Layout: ...


IMBALANCE_ADVICE = ("steady since the job's first steps: the layout, not a fail-slow; "
                    "rebalance micro-batches / stages, or move the rank to a faster GPU")


def localize(job: JobState, culprits: list[int], s: int, job_s: float, perf: np.ndarray,
             ranks: list[int], colls: list[Collective]) -> list[Finding]:
    """Group present culprits: all ranks of a multi-rank host -> slow_host, else slow_rank.

    What it reads of the ranks, it reads from the table's arrays for the culprits and
    their hosts' ranks at once (one pass of numpy each), and the hosts' ranks from the
    job's ``Layout``: no per-rank Python beyond the ranks that stand out and their hosts."""
    if not culprits:
        return []
    out = []
    T = job.ranks
    slots = T.slots
    hold = job.cfg.host_hold_steps
    bar = job.cfg.evidence.waited_bar
    left = set(culprits)
    # A rank with a finding that its group waited for in most of its last steps
    # (``models.evidence.WaitedFor``) is a rank fault whatever its host-mates do: when
    # a host is slow, the group waits for one of its ranks or another, never one alone.
    known = [r for r in left if r in slots]
    solo: set[int] = set()
    if known:
        ix = np.fromiter(map(slots.__getitem__, known), dtype=np.int64, count=len(known))
        sel = (T.kind[ix] != 0) & (T.waited_share[ix] >= bar)
        solo = {r for r, y in zip(known, sel.tolist(), strict=True) if y}
    hosted = left - solo
    # Only a host with a culprit that is not solo can be named or held (below): the
    # others are never looked at (one step of a large job has a handful), so only their
    # members are gathered (in the job's order of ranks, as for every host).
    touched = {job.rank_host.get(r) for r in hosted}
    lay = job.layout()
    order = lay.order
    per_host: dict[Any, list[int]] = {h: lay.members[h] for h in sorted((h for h in touched if h in order),
                                                   key=order.__getitem__)}
    # per member of those hosts: a finding of its own (or a streak), evidence (cusum > 0)
    flat = [m for members in per_host.values() for m in members]
    sl = np.fromiter((slots.get(m, -1) for m in flat), dtype=np.int64, count=len(flat))
    has = sl >= 0
    if has.any():
        at = np.where(has, sl, 0)
        own_l = (has & ((T.kind[at] != 0) | (T.streak[at] > 0))).tolist()
        cus_l = (has & (T.cusum[at] > 0)).tolist()
    else:
        own_l = cus_l = [False] * len(flat)
    own_of = dict(zip(flat, own_l, strict=True))
    cus_of = dict(zip(flat, cus_l, strict=True))
    for h, members in per_host.items():
        if len(members) < 2:
            continue
        # One rank with a finding of its own beside ranks only weakly present (noise, a
        # machine-wide hiccup) is a rank fault: a host verdict needs two ranks of
        # their own, or none yet (a host fault that is still rising).
        n_own = sum(map(own_of.__getitem__, members))
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
                m in hosted or cus_of[m] for m in members) >= 2)
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
    onset_step = T.onset_step
    held = {m for h, members in per_host.items() if len(members) >= 2 and h in touched
            and 2 * sum(m in left or cus_of[m] for m in members) >= len(members)
            for m in members if m in hosted and s - int(onset_step[slots[m]]) < hold}
    if left:
        out.extend(_rank_findings(job, sorted(left), held, perf, ranks, colls))
    return out


# The fields of a rank a ``slow_rank`` finding reads (``_rank_findings``), from the table.
_RANK_FIELDS = ("streak", "onset_ts", "onset_step", "own_rel", "data_excess_s", "excess_s",
                "lost_s", "rel", "self_rel", "mean_excess", "mean_z", "mean_n",
                "waited_share", "waited_lag", "base_job_s", "cusum", "z", "kind")


def _rank_findings(job: JobState, order: list[int], held: set[int], perf: np.ndarray,
                   ranks: list[int], colls: list[Collective]) -> list[Finding]:
    """The ``slow_rank`` findings of ``order`` (sorted ranks of the table), their fields
    read for all of them at once (the values a ``RankState`` reads, as Python numbers)."""
    T = job.ranks
    ix = np.fromiter(map(T.slots.__getitem__, order), dtype=np.int64, count=len(order))
    col = {name: getattr(T, name)[ix].tolist() for name in _RANK_FIELDS}
    ew = [(name, getattr(T, f"{name}_n")[ix].tolist(), getattr(T, f"{name}_m")[ix].tolist())
          for name in EW_STATS]
    usual_pos = T.work.med[ix].tolist()
    bar = job.cfg.evidence.waited_bar
    pos = {r: i for i, r in enumerate(ranks)}
    late = lags(colls, set(order))     # read for these ranks only
    out = []
    for j, r in enumerate(order):
        kind = KINDS[col["kind"][j]]
        share = col["waited_share"][j]
        excess_s = col["excess_s"][j]
        rh = job.rank_host.get(r)
        g = job.rank_gpu.get(r)
        i = pos.get(r)
        f = Finding(
            key=f"slow_rank:r{r}", fault="slow_rank",
            confirmed=col["streak"][j] > 0 and r not in held,
            onset_ts=col["onset_ts"][j], onset_step=col["onset_step"][j],
            slowdown_pct=job.slowdown_pct(RankState(T, int(ix[j]))),
            own_pct=100.0 * col["own_rel"][j], rank=r,
            host=rh, gpu=g,
            hosts=[rh] if rh else [],
            gpus=[(rh, g)] if rh is not None and g is not None else [],
            data_share=_share(col["data_excess_s"][j], excess_s),
            lost_s=col["lost_s"][j], world=job.world,
            rule=_rank_rule(share, kind, bar),
            evidence={"work_excess_s": round(excess_s, 4),
                      "rel_to_peers": round(col["rel"][j], 3),
                      "rel_to_own_past": round(col["self_rel"][j], 3),
                      "mean_excess": round(col["mean_excess"][j], 3),
                      "mean_excess_z": round(col["mean_z"][j], 1),
                      "mean_excess_steps": col["mean_n"][j],
                      "evidence": kind,
                      # the share of its last steps its group waited for it, and the lag
                      # charged to it then (fraction of the job's step): models.evidence
                      "waited_share": round(share, 3),
                      "waited_lag_rel": round(col["waited_lag"][j], 3),
                      "waited_lag_now": round(job.evidence.waited.now(r), 3),
                      "baseline_step_s": round(col["base_job_s"][j], 4),
                      "perf_vs_best": round(float(perf[i]), 3) if i is not None else None,
                      "arrival_lag_s": round(late.get(r, 0.0), 4) if i is not None else None,
                      "evidence_z": round(col["cusum"][j], 1),
                      "own_usual_position": round(usual_pos[j], 4),
                      "own_usual_s": {name: round(m[j], 4) for name, n, m in ew if n[j]}})
        if r not in job.alone:
            # a rank alone in its pipeline stage has no z to peers (no measurement, not
            # 0): the tracker weighs its noise by its own-past evidence (``evidence_z``)
            f.evidence["z_to_peers"] = round(col["z"][j], 1)
        out.append(f)
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


def _rank_rule(waited_share: float, kind: str | None, waited_bar: float) -> str:
    """The signal behind a rank's finding: its group waiting for it in most of its last
    steps (``waited_bar``), else what confirmed it (a change against its own past, or its
    peers)."""
    if waited_share >= waited_bar:
        return "step-waited"
    return "step-own-past" if kind == "change" else "step-peers"


def _share(part: float, whole: float) -> float:
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else 0.0
