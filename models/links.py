"""Link evaluation: which rank pair or host NIC moves data slower than it
should, while the compute at both ends is normal.

Input per step: the transfers of every complete collective (from
``models.alignment``): group, op, members, transfer seconds once all members
were in, bytes. Only groups that cross hosts are judged (NVLink traffic inside
a host never touches a NIC). A group's *cost* is its transfer seconds per byte
(median over the step's transfers; the inverse of effective bandwidth). It is flagged when it stands
out: its cost over its own past (a protected rolling median), compared with
the same ratio of the other groups (faster-half reference), so a change of the
whole network is no link fault; it is confirmed by the same capped CUSUM of
z-scores as a rank (``models.cusum``). A link slow from the very first step has
no past to differ from and is found by the NIC counters only.

Localization (C4's per-pair view): among candidate culprits — each slow
point-to-point pair, and each host of a slow group — pick the one that
explains the most slow groups while touching the fewest healthy ones; a pair
wins a tie with a host, being the narrower explanation. When the transfers
alone cannot tell (one data-parallel group spans every link), the NIC
counters decide (``refine_with_nics``): NICs whose congestion or error
counters grow far faster than the job's other NICs point at a host (most of
its NICs) or at a rank pair (one NIC at each end; NIC k of a host serves its
local GPU k, the rail-optimized layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np

from failslow.models.alignment import (
    BYTES,
    GROUP,
    HEAD,
    OP,
    CollArrays,
    Collective,
    arrays_of,
    listed,
    member_ranks,
    transfer,
)
from failslow.models.config import CauseConfig, JobConfig, LinkConfig
from failslow.models.cusum import capped_increment
from failslow.models.findings import Finding
from failslow.models.layout import Layout
from failslow.models.peers import lower_half_ref
from failslow.models.rootcause import CONGESTION, NIC_ERRORS, lower_quartiles
from failslow.models.stats import RollingMedian, RollingMedians
from failslow.models.telemetry import TelemetryStore

P2P = ("send", "recv")


class GroupState:
    """A group as snapshots before version 9 kept it (``GroupTable.of_groups``)."""

    __slots__ = ("cost", "streak", "cusum", "onset_ts", "onset_step", "extra_s", "rel", "run",
                 "z")

    def __init__(self) -> None:
        self.cost = RollingMedian(LinkConfig().cost_window)
        self.streak = 0
        self.cusum = 0.0
        self.onset_ts = 0.0
        self.onset_step = 0
        self.extra_s = 0.0
        self.rel = 0.0
        # log(1 + relative excess) of each step of the evidence run (since the CUSUM left
        # zero, the newest last, ``run_max`` at most) and the newest step's z: the per-step
        # series its evidence reports (``mean_excess``, ``step_z``)
        self.run: list[float] = []
        self.z = 0.0


class GroupTable:
    """Every cross-host group of one job, one row each (``rows``: group -> row), in
    arrays: its cost baseline (a rolling median of seconds per byte) and its evidence
    (the capped CUSUM, the steps it confirmed in a row, its onset, and the relative
    excess and job seconds of its newest slow step). ``runs``: per row with evidence,
    log(1 + relative excess) of each step of its run (since the CUSUM left zero, the
    newest last, ``run_max`` at most), the series its incident reports."""

    def __init__(self, window: int) -> None:
        self.rows: dict[str, int] = {}
        self.cost = RollingMedians(window)
        self.cusum = np.zeros(0)
        self.streak = np.zeros(0, dtype=np.int64)
        self.onset_ts = np.zeros(0)
        self.onset_step = np.zeros(0, dtype=np.int64)
        self.extra_s = np.zeros(0)
        self.rel = np.zeros(0)
        self.z = np.zeros(0)
        self.runs: dict[int, list[float]] = {}

    # the names of the last ``rows_for`` and their rows (a step's groups come again and
    # again: one list comparison, not a lookup per group; rows are never taken out)
    _last: tuple[list[str], np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("_last", None)          # never pickled
        return d

    def rows_for(self, names: list[str]) -> np.ndarray:
        last = self._last
        if last is not None and last[0] == names:
            return last[1].copy()
        rows = self.rows
        new = [g for g in names if g not in rows]
        if new:
            for g in new:
                rows[g] = len(rows)
            n, have = len(rows), self.cusum.size
            if n > have:
                cap = max(n, 2 * have, 8)
                for name in ("cusum", "streak", "onset_ts", "onset_step", "extra_s", "rel",
                             "z"):
                    a = getattr(self, name)
                    b = np.zeros(cap, dtype=a.dtype)
                    b[:have] = a
                    setattr(self, name, b)
                self.cost.grow(cap)
        out = np.fromiter(map(rows.__getitem__, names), dtype=np.int64, count=len(names))
        self._last = (list(names), out.copy())
        return out

    @classmethod
    def of_groups(cls, groups: dict[str, Any]) -> GroupTable:
        """The table of groups as snapshots before version 9 kept them (``GroupState``):
        the cost window, which river keeps out of reach, rebuilt (``RollingMedians.seed``)."""
        t = cls(LinkConfig().cost_window)     # the window they ran with
        rows = t.rows_for(list(groups))
        for i, st in zip(rows.tolist(), groups.values(), strict=True):
            for name in ("cusum", "streak", "onset_ts", "onset_step", "extra_s", "rel", "z"):
                getattr(t, name)[i] = getattr(st, name, 0)
            if getattr(st, "run", None):
                t.runs[i] = list(st.run)
            cost = st.cost
            t.cost.seed(i, cost.n, cost.median, cost.sigma)
        t.cost.refresh(rows)
        return t


@dataclass(slots=True)
class _GroupStep:
    """One cross-host group's transfers in the step being judged."""

    ranks: tuple[int, ...]
    p2p: bool                   # a send/recv pair, not a collective of the whole group
    hosts: set[Any]             # its members' hosts (two or more, all known)
    transfer_s: float = 0.0     # summed over the step's transfers
    costs: list[float] = field(default_factory=list)   # seconds per byte, per transfer


class _Culprit(NamedTuple):
    """A candidate explanation of slow groups: a rank pair or a host."""

    kind: str                   # "pair" or "host"
    target: Any                 # (rank, rank) or the host name


class _Agg:
    """The step's cross-host groups as ``_aggregate`` finds them, collective by
    collective: what ``LinkMonitor.evaluate`` and ``_localize`` read of them."""

    def __init__(self, agg: dict[str, _GroupStep]) -> None:
        self.agg = agg
        self.names = list(agg)
        self.cost = np.array([_median(agg[g].costs) for g in self.names])
        self.transfer_s = np.array([agg[g].transfer_s for g in self.names])

    def ranks(self, g: str) -> tuple[int, ...]:
        return self.agg[g].ranks

    def p2p(self, g: str) -> bool:
        return self.agg[g].p2p

    def hits(self, slow: np.ndarray, healthy: np.ndarray, ends: set[int]
             ) -> tuple[dict[Any, list[int]], dict[int, set[str]]]:
        """Per host, how many slow and healthy groups (places in ``names``) it is in;
        per rank of ``ends``, the names of those groups it is a member of."""
        host_hits: dict[Any, list[int]] = {}
        rank_groups: dict[int, set[str]] = {r: set() for r in ends}
        for side, at in ((0, slow), (1, healthy)):
            for g in [self.names[i] for i in at.tolist()]:
                a = self.agg[g]
                for h in a.hosts:
                    got = host_hits.get(h)
                    if got is None:
                        got = host_hits[h] = [0, 0]
                    got[side] += 1
                if ends:
                    for r in a.ranks:
                        if r in ends:
                            rank_groups[r].add(g)
        return host_hits, rank_groups


class _Hosts:
    """The hosts of a step's members as numbers (``member``: a place in ``names``, -1
    for a rank placed nowhere), each host value of ``rank_host`` one."""

    names: list[Any]
    _ix: dict[Any, int]

    def __init__(self, rank: np.ndarray, rank_host: dict[int, str],
                 layout: Layout | None = None) -> None:
        if layout is not None:
            # the same numbers, from the job's layout (made from this ``rank_host``)
            self.names, self._ix = layout.names, layout.order
            self.member = layout.host_index(rank)
            return
        hix: dict[Any, int] = {}
        rh = {r: hix.setdefault(h, len(hix)) for r, h in rank_host.items()}
        self.names = list(hix)
        self._ix = hix
        self.member = np.fromiter(map(rh.get, rank.tolist(), repeat(-1)), dtype=np.int64,
                                  count=rank.size)

    def unplaced(self, blank: Any) -> np.ndarray:
        """Per member: placed nowhere, or on the host value ``blank`` (None, "")."""
        out = self.member < 0
        b = self._ix.get(blank)
        return out | (self.member == b) if b is not None else out


class _StepGroups:
    """The step's cross-host groups in arrays, every collective at once (issue 31: no
    per-collective Python): the same groups, in the same order, with the same transfer
    seconds and costs as ``_aggregate`` (min end - max start per collective, on the
    job's clock; summed and median per group), the members of each group's first
    collective for ``_localize``. From the arrays the comm windows' sums carry
    (``StepColls``); collectives without them (``collective`` events) or with a value
    that is not finite (NaN compares unlike in Python and numpy) are ``_aggregate``'s."""

    names: list[str]
    cost: np.ndarray
    transfer_s: np.ndarray
    _grp: np.ndarray            # per member of a group's first collective: its group,
    _rank: np.ndarray           # its rank and its host (a number: ``_hosts``)
    _host: np.ndarray
    _hosts: list[Any]
    _bounds: list[int]          # group i's members: [_bounds[i], _bounds[i + 1])
    _p2p: list[bool]
    _at: dict[str, int]         # group -> its place in ``names``

    @classmethod
    def of(cls, arr: CollArrays, hosts: _Hosts, off: np.ndarray | None) -> _StepGroups:
        """The groups of ``arr`` (``hosts``: its members' hosts; ``off``: each member's
        clock offset, s, or None for none)."""
        k = arr.size.size
        size, nbytes, at = arr.size, arr.nbytes, arr.at
        start = arr.start if off is None else arr.start - off
        t = np.minimum.reduceat(start + arr.dur, at) - np.maximum.reduceat(start, at)
        t = np.where(t > 0.0, t, 0.0)
        mh = hosts.member
        unplaced = hosts.unplaced(None)
        lo, hi = np.minimum.reduceat(mh, at), np.maximum.reduceat(mh, at)
        p2p = np.array([o in P2P for o in arr.ops], dtype=bool)[arr.oid]
        nowhere = np.maximum.reduceat(unplaced, at)
        # inside one host, a rank placed nowhere, or sends and receives of a group larger
        # than a pair (several links at once: ``models.p2p`` judges them per rank pair)
        local = nowhere | (lo == hi) | (p2p & (size != 2))
        # each group's collectives with bytes, the group decided by its first one: groups
        # in the order of their first such collective
        valid = np.flatnonzero(nbytes > 0)
        ug, fi = np.unique(arr.gid[valid], return_index=True)
        order = np.argsort(fi)
        fc = valid[fi[order]]
        place = np.full(len(arr.groups), -1, dtype=np.int64)
        place[ug[order]] = np.arange(ug.size)
        gi = np.full(k, -1, dtype=np.int64)
        gi[valid] = place[arr.gid[valid]]
        keep = ~local[fc]
        new = np.cumsum(keep) - 1          # a kept group's place among the kept
        out = cls()
        out.names = [arr.groups[g] for g in ug[order][keep].tolist()]
        n = len(out.names)
        on = gi >= 0
        on[on] = keep[gi[on]]
        cols = np.flatnonzero(on)
        grp = new[gi[cols]]
        out.transfer_s = np.bincount(grp, weights=t[cols], minlength=n)  # in order, as +=
        per = t[cols] / nbytes[cols]
        cnt = np.bincount(grp, minlength=n)
        cost = np.zeros(n)
        one = cnt[grp] == 1
        cost[grp[one]] = per[one]
        for j in np.flatnonzero(cnt > 1).tolist():
            cost[j] = _median(per[grp == j].tolist())
        out.cost = cost
        # the members of each kept group's first collective
        fk = fc[keep]
        sz = size[fk]
        idx = np.repeat(at[fk] - np.concatenate(([0], np.cumsum(sz)[:-1])), sz) \
            + np.arange(int(sz.sum()))
        out._grp = np.repeat(np.arange(n), sz)
        out._rank = arr.rank[idx]
        out._host = mh[idx]
        out._hosts = hosts.names
        out._bounds = np.concatenate(([0], np.cumsum(sz))).tolist()
        out._p2p = p2p[fk].tolist()
        out._at = {g: i for i, g in enumerate(out.names)}
        return out

    def ranks(self, g: str) -> tuple[int, ...]:
        i = self._at[g]
        return tuple(sorted(self._rank[self._bounds[i]:self._bounds[i + 1]].tolist()))

    def p2p(self, g: str) -> bool:
        return self._p2p[self._at[g]]

    def hits(self, slow: np.ndarray, healthy: np.ndarray, ends: set[int]
             ) -> tuple[dict[Any, list[int]], dict[int, set[str]]]:
        """As ``_Agg.hits``, on arrays."""
        side = np.full(len(self.names), -1, dtype=np.int64)
        side[healthy] = 1
        side[slow] = 0
        on = side[self._grp] >= 0
        nh = max(len(self._hosts), 1)
        pair = _uniq(self._grp[on] * nh + self._host[on])    # (group, host) once
        ps, ph = side[pair // nh], pair % nh
        c0 = np.bincount(ph[ps == 0], minlength=nh)
        c1 = np.bincount(ph[ps == 1], minlength=nh)
        host_hits = {self._hosts[h]: [a, b] for h, a, b in
                     zip(np.flatnonzero(c0 + c1).tolist(), c0[c0 + c1 > 0].tolist(),
                         c1[c0 + c1 > 0].tolist(), strict=True)}
        rank_groups: dict[int, set[str]] = {}
        for r in ends:
            rank_groups[r] = {self.names[j]
                              for j in _uniq(self._grp[on & (self._rank == r)]).tolist()}
        return host_hits, rank_groups


class LinkMonitor:
    """Per-group transfer baselines of one job, and link localization."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.table = GroupTable(cfg.links.cost_window)
        self.slow_members: list[tuple[int, ...]] = []   # members of the located slow groups
        self.clock: dict[str, float] = {}   # host -> its clock's offset from the job's, s

    def _clocks(self, colls: list[Collective], rank_host: dict[int, str]) -> dict[int, float]:
        """Rank -> its host clock's offset (s), learned from the collectives that span
        hosts: the members of an all-reduce (all-gather, ...) leave it together,
        whatever link is slow, so a host whose members end later than the others, step
        after step, has a clock that far ahead. Transfers are timed on one clock from it:
        a few milliseconds of skew are as long as a transfer. Point-to-point operations
        do not teach it (an eager send ends before its receive)."""
        clock = self.clock
        resid: dict[str, list[float]] = {}
        seen: set[str] = set()
        for c in colls:
            if c[OP] in P2P or c[GROUP] in seen:
                continue
            seen.add(c[GROUP])       # one collective per group and step is plenty
            hosts = [rank_host.get(m[0], "") for m in c[HEAD:]]
            if "" in hosts or len(set(hosts)) < 2:
                continue
            ends = [st + d - clock.get(h, 0.0)
                    for (_, st, d), h in zip(c[HEAD:], hosts, strict=True)]
            mid = _median(ends)
            for h, e in zip(hosts, ends, strict=True):
                resid.setdefault(h, []).append(e - mid)
        for h, rs in resid.items():
            clock[h] = clock.get(h, 0.0) + self.cfg.links.clock_gain * _median(rs)
        if not clock:
            return {}
        return {r: clock.get(h, 0.0) for r, h in rank_host.items()}

    def _clocks_arrays(self, arr: CollArrays, hosts: _Hosts) -> np.ndarray | None:
        """``_clocks`` on the step's arrays (the same values, every collective at once);
        returns each member's offset (s), None while no clock is learned."""
        clock = self.clock
        at, size = arr.at, arr.size
        mh = hosts.member
        # each group's first collective that is no send / recv
        p2p = np.array([o in P2P for o in arr.ops], dtype=bool)[arr.oid]
        cand = np.flatnonzero(~p2p)
        _, fi = np.unique(arr.gid[cand], return_index=True)
        pick = np.sort(cand[fi])
        # all members placed, on two hosts or more
        blank = np.maximum.reduceat(hosts.unplaced(""), at)
        lo, hi = np.minimum.reduceat(mh, at), np.maximum.reduceat(mh, at)
        use = pick[~blank[pick] & (lo[pick] != hi[pick])]
        if use.size:
            sz = size[use]
            cid = np.repeat(np.arange(use.size), sz)
            idx = np.repeat(at[use] - np.concatenate(([0], np.cumsum(sz)[:-1])), sz) \
                + np.arange(int(sz.sum()))
            h = mh[idx]
            known = np.array([clock.get(x, 0.0) for x in hosts.names])
            ends = (arr.start[idx] + arr.dur[idx]) - known[h]
            mid = np.empty(use.size)
            for n in _uniq(sz).tolist():
                rows = sz == n
                e = np.sort(ends[rows[cid]].reshape(-1, n), axis=1)
                mid[rows] = e[:, n // 2] if n % 2 else 0.5 * (e[:, n // 2 - 1] + e[:, n // 2])
            resid = ends - mid[cid]
            # per host, the median of its residuals, hosts in the order first seen
            o = np.lexsort((resid, h))
            hs, rs = h[o], resid[o]
            uh, first, cnt = np.unique(hs, return_index=True, return_counts=True)
            m = cnt // 2
            med = np.where(cnt % 2 == 1, rs[first + m], 0.5 * (rs[first + m - 1] + rs[first + m]))
            _, seen = np.unique(h, return_index=True)     # in the order of uh
            gain = self.cfg.links.clock_gain
            for j in np.argsort(seen).tolist():
                name = hosts.names[int(uh[j])]
                clock[name] = clock.get(name, 0.0) + gain * float(med[j])
        if not clock:
            return None
        off = np.array([clock.get(x, 0.0) for x in hosts.names] + [0.0])
        return off[mh]          # -1: a rank placed nowhere, offset 0

    def evaluate(self, s: int, colls: list[Collective], rank_host: dict[int, str], ts: float,
                 job_s: float, layout: Layout | None = None) -> list[Finding]:
        """Judge the step's complete collectives (``models.alignment``); a slow_link
        finding, if any group stands out. ``layout``: ``rank_host``'s (``models.layout``),
        where the caller keeps one."""
        cfg = self.cfg
        arr = arrays_of(colls)
        agg: _Agg | _StepGroups
        if arr is not None:
            # the comm windows' sums, as arrays: every collective at once
            hosts = _Hosts(arr.rank, rank_host, layout)
            agg = _StepGroups.of(arr, hosts, self._clocks_arrays(arr, hosts))
        else:
            colls = listed(colls)
            if not colls:
                return []
            offset = self._clocks(colls, rank_host)
            agg = _Agg(_aggregate(colls, rank_host, offset))
        names = agg.names
        if not names:
            return []
        # Median over the step's transfers: one transfer queued behind other traffic
        # must not make its whole group look slow.
        cost = agg.cost
        # Groups are compared through their cost relative to their own past: paths
        # differ (NVLink, rails, shared NICs), so raw costs of two groups are not
        # comparable, but a healthy network moves every group's ratio alike.
        G = self.table
        rows = G.rows_for(names)
        b_med = G.cost.med[rows]
        # A zero cost (the data moved in no measurable time: an eager send that
        # completed before its receive was posted) tells nothing about bandwidth.
        warm = (G.cost.n[rows] >= cfg.warm_steps) & (b_med > 0) & (cost > 0)
        safe = np.where(warm, b_med, 1.0)
        ratio = np.where(warm, cost / safe, 0.0)
        own = np.where(warm, G.cost.sig[rows] / safe, 0.0)
        peer_rel = np.zeros(len(names))
        peer_z = np.zeros(len(names))
        ref, sigma = lower_half_ref(ratio[warm]) if warm.sum() >= cfg.links.groups_min \
            else (0.0, 0.0)
        if ref > 0:
            peer_rel = np.where(warm, ratio / ref - 1.0, 0.0)
            peer_z = peer_rel / np.maximum(max(sigma / ref, cfg.links.noise_floor), own)
        elif warm.any():
            # Too few groups to compare: each against its own past alone.
            peer_rel = np.where(warm, ratio - 1.0, 0.0)
            peer_z = peer_rel / np.maximum(own, cfg.links.noise_floor)
        # The evidence rule of ranks (models.cusum): gated, capped CUSUM of z, every
        # group at once; per-group Python only for groups with evidence (a run to keep)
        inc = capped_increment(peer_rel, peer_z, cfg.min_rel, cfg)
        weak = (peer_rel >= cfg.min_rel / 2) & (peer_z >= cfg.z_min / 2)
        cus = G.cusum[rows]
        new = rows[(inc > 0) & (cus == 0.0)]
        G.onset_ts[new] = ts - job_s
        G.onset_step[new] = s
        for r in new.tolist():
            G.runs[r] = []
        cus = np.minimum(np.maximum(0.0, cus + inc), cfg.confirm_z + cfg.z_min)
        G.cusum[rows] = cus
        G.streak[rows] = np.where(cus >= cfg.confirm_z, G.streak[rows] + 1, 0)
        on = np.flatnonzero(cus > 0)
        if on.size:
            G.z[rows[on]] = peer_z[on]
            run_max = cfg.links.run_max
            for i, x in zip(on.tolist(), np.log1p(np.maximum(peer_rel[on], -0.5)).tolist(),
                            strict=True):
                run = G.runs.setdefault(int(rows[i]), [])
                run.append(x)
                del run[:-run_max]
        learn = ~weak & (cost > 0)
        G.cost.update(rows[learn], cost[learn])
        healthy = np.flatnonzero(~weak)
        hit = np.flatnonzero(weak & (cus > 0))
        slow = [names[i] for i in hit.tolist()]
        if hit.size:
            rel = peer_rel[hit]
            transfer_s = agg.transfer_s[hit]
            G.rel[rows[hit]] = rel
            G.extra_s[rows[hit]] = transfer_s * rel / (1.0 + rel)
        self.slow_members = []
        if not slow:
            return []
        return [self._localize(slow, hit, healthy, agg, rank_host, job_s)]

    def _localize(self, slow: list[str], slow_at: np.ndarray, healthy: np.ndarray,
                  agg: _Agg | _StepGroups, rank_host: dict[int, str], job_s: float
                  ) -> Finding:
        """The culprit of the slow groups (``slow``: their names, ``slow_at``: their
        places in ``agg.names``; ``healthy``: the places of the healthy groups)."""
        cands: list[_Culprit] = []
        for g in slow:
            ranks = agg.ranks(g)
            if agg.p2p(g) and len(ranks) == 2:
                cands.append(_Culprit("pair", ranks))
            cands.extend(_Culprit("host", rank_host[r]) for r in ranks)

        def covers(c: _Culprit, g: str) -> bool:
            ranks = agg.ranks(g)
            if c.kind == "pair":
                return c.target[0] in ranks and c.target[1] in ranks
            return any(rank_host[r] == c.target for r in ranks)

        # (slow, healthy) groups each candidate covers, counted in one pass over
        # the groups: a candidate's score is then a lookup.
        ends = {r for c in cands if c.kind == "pair" for r in c.target}
        host_hits, rank_groups = agg.hits(slow_at, healthy, ends)
        slow_set = set(slow)

        def score(c: _Culprit) -> tuple[int, int]:
            if c.kind == "pair":
                both = rank_groups[c.target[0]] & rank_groups[c.target[1]]
                hit = len(both & slow_set)
                return hit - (len(both) - hit), True
            hits = host_hits.get(c.target, (0, 0))
            return hits[0] - hits[1], False

        ranked = sorted(dict.fromkeys(cands), key=score, reverse=True)
        best = ranked[0]
        ambiguous = len(ranked) > 1 and score(ranked[1]) == score(best)
        mine = [g for g in slow if covers(best, g)]
        self.slow_members = [agg.ranks(g) for g in mine]
        G = self.table
        sts = G.rows_for(mine)
        confirmed = bool((G.streak[sts] > 0).any())
        extra = float(G.extra_s[sts].max())
        base = job_s - extra
        pct = 100.0 * extra / base if base > 0 else 0.0
        evidence = {"slow_groups": sorted(mine)[:16],
                    "transfer_rel_slowdown": round(float(G.rel[sts].max()), 3),
                    "healthy_groups": int(healthy.size)}
        evidence["ambiguous"] = ambiguous
        # The worst group's steps of evidence, as a rank's window (``mean_excess`` over
        # ``mean_excess_steps``) and its z this step: a confirmation whose latest step is as
        # slow as the earlier ones is a rate, not a lump (the evidence an operator reads).
        worst = int(sts[int(np.argmax(G.rel[sts]))])
        run = G.runs.get(worst, [])
        if run:
            evidence["mean_excess"] = round(sum(run) / len(run), 3)
            evidence["mean_excess_steps"] = len(run)
            evidence["step_z"] = round(float(G.z[worst]), 1)
        f = Finding(key="", fault="slow_link", confirmed=confirmed,
                    onset_ts=float(G.onset_ts[sts].min()),
                    onset_step=int(G.onset_step[sts].min()), slowdown_pct=pct,
                    own_pct=100.0 * float(G.rel[sts].max()), evidence=evidence,
                    step_z=float(G.z[sts].max()), step_rel=float(G.rel[sts].max()),
                    rule="link-groups")
        if best.kind == "pair":
            a, b = best.target
            ha, hb = rank_host[a], rank_host[b]
            f.key, f.rank, f.peer_rank, f.host, f.peer_host = f"slow_link:r{a}-r{b}", a, b, ha, hb
            f.hosts = [ha, hb]
        else:
            f.key, f.host, f.hosts = f"slow_link:{best.target}", best.target, [best.target]
        return f


def far_end(f: Finding, members: Sequence[tuple[int, ...]], rank_host: dict[int, str]) -> None:
    """Give a host-level ``slow_link`` its other end (``peer_host``): the host most of its
    slow pairs (``evidence.slow_pairs``), else of its slow groups' members, reach beyond
    it; every such host goes to ``evidence.peer_hosts``. A page must name both ends."""
    if f.fault != "slow_link" or f.peer_host is not None or f.host is None:
        return
    count: dict[str, int] = {}
    pairs = [p.split("-") for p in f.evidence.get("slow_pairs") or []]
    ranks = [int(x[1:]) for pair in pairs for x in pair if x[1:].isdigit()]
    if not ranks:
        ranks = [r for group in members for r in group]
    for r in ranks:
        h = rank_host.get(r)
        if h is not None and h != f.host:
            count[h] = count.get(h, 0) + 1
    if count:
        ranked = sorted(count, key=lambda h: (-count[h], h))
        f.peer_host = ranked[0]
        f.evidence["peer_hosts"] = ranked[:16]


def refine_with_nics(f: Finding, slow_members: Sequence[tuple[int, ...]], store: TelemetryStore,
                     rank_host: dict[int, str], rank_gpu: dict[int, int],
                     memo: dict[Any, Any] | None = None, c: CauseConfig | None = None
                     ) -> tuple[Finding, bool]:
    """Re-aim a slow_link finding at the host or rank pair whose NIC counters
    stand out (``c.nic_outlier`` x the job's other NICs; ``c.nics_min`` NICs or more), when that explanation is
    consistent with every slow group: most NICs of one host, or a single NIC,
    -> that host; one NIC at each of two hosts -> the rank pair they serve.
    Returns (the finding, possibly re-aimed; whether the NICs decided it).

    ``memo``: a dict the caller keeps while the store and the job's ranks do not change
    (one judged step): the job's hosts, its NICs and their outliers are then found once,
    not per finding (each is a pass over every rank or port of the job: at 131,072 ranks,
    milliseconds a finding)."""
    c = c or CauseConfig()
    memo = {} if memo is None else memo
    hosts = memo.get("hosts")
    if hosts is None:
        hosts = memo["hosts"] = frozenset(rank_host.values())
    got = memo.get(hosts)
    if got is None:
        nics = {k: d for k, d in store.nics.items() if k[0] in hosts}
        got = memo[hosts] = (nics, outlier_nics(nics, c, store)
                                    if len(nics) >= c.nics_min else [])
    nics, bad = got
    if len(nics) < c.nics_min:
        return f, False
    if not bad:
        return f, False
    per_host: dict[str, int] = {}
    for h, _ in bad:
        per_host[h] = per_host.get(h, 0) + 1
    h = max(per_host, key=lambda x: per_host[x])
    total = memo.get(("ports", h))
    if total is None:
        total = memo["ports", h] = sum(1 for k in nics if k[0] == h)
    if len(bad) == 1 or (total >= 2 and per_host[h] * 2 >= total):
        if all(any(rank_host[r] == h for r in m) for m in slow_members):
            nic = bad[0][1] if len(bad) == 1 else None
            return _retarget(f, f"slow_link:{h}", nic, host=h, hosts=[h]), True
        return f, False
    if len(bad) == 2 and bad[0][0] != bad[1][0]:
        by_slot = memo.get("slots")
        if by_slot is None:
            by_slot = memo["slots"] = {(rank_host[r], g): r for r, g in rank_gpu.items()
                                       if r in rank_host}
        ends = [by_slot.get((h, i)) for h, n in bad if (i := _nic_index(n)) is not None]
        if len(ends) != 2 or ends[0] is None or ends[1] is None:
            return f, False
        a, b = sorted((ends[0], ends[1]))
        if all(a in m and b in m for m in slow_members):
            return _retarget(f, f"slow_link:r{a}-r{b}", None, rank=a, peer_rank=b,
                             host=rank_host[a], peer_host=rank_host[b],
                             hosts=[rank_host[a], rank_host[b]]), True
    return f, False


def _aggregate(colls: list[Collective], rank_host: dict[int, str], offset: dict[int, float]
               ) -> dict[str, _GroupStep]:
    """The step's cross-host groups, collective by collective (``_StepGroups`` in
    arrays does the same where every value is finite)."""
    agg: dict[str, _GroupStep] = {}
    local: set[str] = set()      # groups of this step inside one host (or unplaced)
    for c in colls:
        nbytes = c[BYTES]
        if nbytes <= 0:
            continue
        group = c[GROUP]
        a = agg.get(group)
        if a is None:
            if group in local:
                continue
            if len(c) == HEAD + 2:        # a pair: member_ranks without a sort call
                r0, r1 = c[HEAD][0], c[HEAD + 1][0]
                ranks: tuple[int, ...] = (r0, r1) if r0 <= r1 else (r1, r0)
            else:
                ranks = member_ranks(c)
            hosts = set(map(rank_host.get, ranks))
            # Sends and receives of a group larger than a pair (a pipeline group) are
            # several links at once: ``models.p2p`` judges them per rank pair.
            if len(hosts) < 2 or None in hosts or c[OP] in P2P and len(ranks) != 2:
                local.add(group)
                continue
            a = agg[group] = _GroupStep(ranks, c[OP] in P2P, hosts)
        if len(c) == HEAD + 2:
            # a pair (most collectives of a pipeline): ``transfer`` written out, the
            # same comparisons in the same order
            (ra, sa, da), (rb, sb, db) = c[HEAD], c[HEAD + 1]
            if offset:
                sa -= offset.get(ra, 0.0)
                sb -= offset.get(rb, 0.0)
            end, last = _INF, -_INF
            if (e := sa + da) < end:
                end = e
            if sa > last:
                last = sa
            if (e := sb + db) < end:
                end = e
            if sb > last:
                last = sb
            t = end - last
            if not t > 0.0:
                t = 0.0
        else:
            t = transfer(c, offset)
        a.transfer_s += t
        a.costs.append(t / nbytes)
    return agg


def _uniq(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` of an integer array (its distinct values, sorted) by a sort: numpy
    2's hash table takes ~5x as long on a few thousand integers (issue 31)."""
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size > 1 else s


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    k = len(xs)
    return xs[k // 2] if k % 2 else 0.5 * (xs[k // 2 - 1] + xs[k // 2])


_INF = float("inf")
_OUTLIER_NAMES = CONGESTION + NIC_ERRORS   # outlier_nics' counters, in its rows' order


def outlier_nics(nics: dict[tuple[str, str, int], Any], c: CauseConfig | None = None,
                 store: TelemetryStore | None = None) -> list[tuple[str, str]]:
    """(host, nic) of the ports whose congestion or error counters grow at least
    ``c.nic_outlier`` times the ports' lower quartile (at least ``c.ref_floor`` of their
    own rate), on ``c.nic_agree`` counters.
    The quartile is taken once per counter over all ports (one port more or
    less in the reference does not move a quartile). One numpy pass over a
    (counter x port) matrix of rates: read from ``store``'s table of ports when given
    (``nics`` are its), else from each port's ``rates``."""
    if not nics:
        return []
    c = c or CauseConfig()
    if store is not None:
        rates = store.nic_rates(list(nics), _OUTLIER_NAMES)
    else:
        devs = [d.rates for d in nics.values()]
        rates = np.array([[r.get(name, 0.0) for r in devs] for name in _OUTLIER_NAMES])
    refs = lower_quartiles(rates)
    hit = (rates > 0) & (rates >= c.nic_outlier * np.maximum(refs[:, None],
                                                             c.ref_floor * rates))
    k = len(CONGESTION)
    bad = (hit[:k].sum(axis=0) >= c.nic_agree) | (hit[k:].sum(axis=0) >= c.nic_agree)
    keys = list(nics)
    return [(keys[i][0], keys[i][1]) for i in np.flatnonzero(bad).tolist()]



def nic_slots(f: Finding, store: TelemetryStore, job: Any) -> set[tuple[str, str]] | None:
    """The NICs (host, name) serving the two ranks of a pair finding, by the
    rail-optimized convention (NIC k of a host serves local GPU k); None when
    the hosts' NIC numbering does not allow it."""
    out = set()
    for r in (f.rank, f.peer_rank):
        h, g = job.rank_host.get(r), job.rank_gpu.get(r)
        names = [k[1] for k in store.nics if k[0] == h and _nic_index(k[1]) == g]
        if h is None or g is None or len(names) != 1:
            return None
        out.add((h, names[0]))
    return out


def _nic_index(name: str) -> int | None:
    """Trailing number of a NIC name (``mlx5_3`` -> 3), or None."""
    digits = ""
    for ch in reversed(name):
        if not ch.isdigit():
            break
        digits = ch + digits
    return int(digits) if digits else None


def _retarget(f: Finding, key: str, nic: str | None, **where: Any) -> Finding:
    evidence = {**f.evidence, "located_by": "nic counters", **({"nic": nic} if nic else {})}
    fields = {"rank": None, "peer_rank": None, "host": None, "peer_host": None, **where}
    return Finding(key=key, fault=f.fault, confirmed=f.confirmed, onset_ts=f.onset_ts,
                   onset_step=f.onset_step, slowdown_pct=f.slowdown_pct, own_pct=f.own_pct,
                   lost_s=f.lost_s, world=f.world, evidence=evidence, rule=f.rule,
                   step_z=f.step_z, step_rel=f.step_rel, **fields)
