"""Collective alignment: join the events of one collective (same group and
``seq``) from all its members, and derive per rank and per step:

- time spent inside collectives (seconds) — step time minus this is the
  rank's own work when the step event carries neither ``compute_s`` nor
  ``comm_s`` (only then is it counted: ``need_time``, kept by the job);
- arrival lag (``lags``): at each collective the last member to arrive is the
  one the others wait for; it is charged ``last start - second-to-last start``;
- transfers (``models.links``): for every complete collective its transfer
  time once all members were in (``min end - max start``, seconds) and its
  bytes, so the link evaluation can compare effective bandwidth between groups
  and with a group's own past.

Per event the work is one small tuple appended to the collective's entry (the
event dict itself is not kept: holding tens of thousands of decoded events
for a step costs more in memory traffic than reading them). A complete
collective is only set aside with its step; lags and transfer times are
derived once the step is judged, and only where needed (lags for the
evidence of a slow rank, transfers of groups that cross hosts). Collectives
whose members never all arrive are dropped after ``max_age`` steps.

An open collective is a list ``[step, group, op, bytes, (rank, start_ts,
duration_s), ...]``: the first member's group, op and bytes, then one tuple
per member in arrival order. ``Detector.process_batch`` appends to it inline
(``HEAD``, ``add``'s code) on its hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from failslow.models.config import EvidenceConfig, LinkConfig

# A collective is a list (built on the hot path, grown member by member):
# [step, group, op, bytes, (rank, start_ts, duration_s) of each member that arrived...]
STEP, GROUP, OP, BYTES = range(4)
HEAD = 4                     # header entries of an open collective before its members
Collective = list[Any]


class CollArrays:
    """A step's collectives as arrays (``models.comm`` sums them so): per collective its
    group and op (``gid``, ``oid``: places in ``groups``, ``ops``), its bytes (as
    ``float(c[BYTES])``) and member count; per member, collective after collective, its
    rank, start and duration: the values of the ``Collective`` lists bit for bit
    (``models.links`` and ``lags`` read these rather than the lists)."""

    __slots__ = ("gid", "groups", "oid", "ops", "nbytes", "size", "at", "rank", "start", "dur",
                 "finite")

    def __init__(self, gid: np.ndarray, groups: list[str], oid: np.ndarray, ops: list[str],
                 nbytes: np.ndarray, size: np.ndarray, rank: np.ndarray, start: np.ndarray,
                 dur: np.ndarray) -> None:
        self.gid, self.groups, self.oid, self.ops, self.nbytes = gid, groups, oid, ops, nbytes
        self.size, self.rank, self.start, self.dur = size, rank, start, dur
        self.at = np.zeros(size.size, dtype=np.int64)     # each collective's first member
        np.cumsum(size[:-1], out=self.at[1:])
        # NaN compares unlike in Python and numpy: the readers take the lists then
        self.finite = bool(size.size and size.min() >= 1 and np.isfinite(start).all()
                           and np.isfinite(dur).all() and np.isfinite(nbytes).all())


class StepColls(list):      # type: ignore[type-arg]
    """A step's collectives as arrays (``arrays``) and, once a reader needs them
    (``full``), as ``Collective`` lists; until then the list is empty and ``make`` builds
    it. Lives within one judged step only (never pickled)."""

    arrays: CollArrays | None = None
    make: Callable[[], list[Collective]] | None = None

    def full(self) -> StepColls:
        """The collectives as lists too (built once)."""
        if self.make is not None:
            make, self.make = self.make, None
            self.extend(make())
        return self


def listed(colls: list[Collective]) -> list[Collective]:
    """A step's collectives as lists (a ``StepColls`` builds them now)."""
    return colls.full() if isinstance(colls, StepColls) else colls


def arrays_of(colls: list[Collective]) -> CollArrays | None:
    """A step's collectives as arrays where they came so and every value is finite."""
    arr = getattr(colls, "arrays", None)
    return arr if arr is not None and arr.finite else None


class CollectiveAligner:
    """Aligns the collective events of one job."""

    def __init__(self, max_age: int = LinkConfig.pending_steps) -> None:
        self.max_age = max_age
        self.need_time = True        # count time in collectives (steps lack compute/comm)
        self.open: dict[tuple[str, int], Collective] = {}
        self.coll_time: dict[tuple[int, int], float] = {}
        # step -> its complete collectives, in completion order
        self.done: dict[int, list[Collective]] = {}

    def add(self, ev: dict[str, Any], step: int) -> None:
        """Take one collective event of a rank; ``step`` is the step it belongs to."""
        if self.need_time:
            key = (ev["rank"], step)
            ct = self.coll_time
            ct[key] = ct.get(key, 0.0) + ev["duration_s"]
        gk = (ev["group"], ev["seq"])
        members = self.open.get(gk)
        if members is None:
            self.open[gk] = [step, ev["group"], ev["op"], ev["bytes"],
                             (ev["rank"], ev["start_ts"], ev["duration_s"])]
            return
        members.append((ev["rank"], ev["start_ts"], ev["duration_s"]))
        if len(members) >= ev["group_size"] + HEAD:
            del self.open[gk]
            self.complete(members)

    def complete(self, coll: Collective) -> None:
        """Set a collective whose members are all in aside with its step."""
        lst = self.done.get(coll[0])
        if lst is None:
            self.done[coll[0]] = [coll]
        else:
            lst.append(coll)

    def take_time(self, rank: int, step: int) -> float | None:
        """Pop the seconds a rank spent in collectives in a step (None if none counted)."""
        return self.coll_time.pop((rank, step), None)

    def take_step(self, step: int) -> list[Collective]:
        """Pop the complete collectives of a step."""
        return self.done.pop(step, [])

    def expire(self, step: int) -> None:
        """Forget anything of steps older than ``step - max_age`` (members that never came)."""
        horizon = step - self.max_age
        for gk in [k for k, v in self.open.items() if v[0] < horizon]:
            del self.open[gk]
        for k in [k for k in self.coll_time if k[1] < horizon]:
            del self.coll_time[k]
        for s in [s for s in self.done if s < horizon]:
            del self.done[s]


def lags(colls: list[Collective], only: set[int] | frozenset[int] | None = None
         ) -> dict[int, float]:
    """Arrival lag (seconds) per rank over complete collectives: at each, the
    last member to start is charged its lead over the second-to-last. ``only``: the
    ranks whose lag is read (a pair with neither of them is not looked at; the others'
    lags may be missing or partial)."""
    arr = arrays_of(colls)
    if arr is not None:
        return _lags_arrays(arr, only)
    colls = listed(colls)
    late: dict[int, float] = {}
    neg = float("-inf")
    for c in colls:
        k = len(c)
        if k <= HEAD + 1:
            continue
        if k == HEAD + 2 and only is not None and c[HEAD][0] not in only \
                and c[HEAD + 1][0] not in only:
            continue
        if k == HEAD + 2 and (s0 := c[HEAD][1]) > neg and (s1 := c[HEAD + 1][1]) > neg:
            # two members (a send/recv pair, most of a pipeline's): last_lead written out
            last_rank, lead = (c[HEAD + 1][0], s1 - s0) if s1 > s0 else (c[HEAD][0], s0 - s1)
        else:
            last_rank, lead = last_lead(c)
        late[last_rank] = late.get(last_rank, 0.0) + lead
    return late


def _lags_arrays(arr: CollArrays, only: set[int] | frozenset[int] | None) -> dict[int, float]:
    """``lags`` on a step's arrays, every collective at once: the member that started
    last is the first with the latest start, its lead over the latest start of the
    others; summed per rank in the collectives' order (the same floats as the loop)."""
    size, at, st = arr.size, arr.at, arr.start
    m = st.size
    top = np.maximum.reduceat(st, at)
    cid = np.repeat(np.arange(size.size), size)
    last = np.minimum.reduceat(np.where(st == top[cid], np.arange(m), m), at)
    rest = st.copy()
    rest[last] = -np.inf
    lead = top - np.maximum.reduceat(rest, at)
    rank = arr.rank[last]
    keep = size >= 2
    if only is not None:
        keep &= np.isin(rank, np.fromiter(only, dtype=np.int64, count=len(only)))
    late: dict[int, float] = {}
    for r, x in zip(rank[keep].tolist(), lead[keep].tolist(), strict=True):
        late[r] = late.get(r, 0.0) + x
    return late


def last_lead(c: Collective) -> tuple[int, float]:
    """The member of a collective (two or more members) that started last, and its lead
    over the second-to-last (ties leave it at zero, whoever is charged)."""
    last_start = second = float("-inf")
    last_rank = c[HEAD][0]
    for r, st, _ in c[HEAD:]:
        if st > last_start:
            second, last_start, last_rank = last_start, st, r
        elif st > second:
            second = st
    return last_rank, last_start - second


def transfer(c: Collective, offset: dict[int, float] | None = None) -> float:
    """Transfer seconds of a complete collective: min end - max start, at least 0. With
    ``offset`` (rank -> its host clock's offset, seconds), on a common clock."""
    last_start = float("-inf")
    end = float("inf")
    if offset:
        get = offset.get
        for r, st, d in c[HEAD:]:
            st -= get(r, 0.0)
            e = st + d
            if e < end:
                end = e
            if st > last_start:
                last_start = st
    else:
        for _, st, d in c[HEAD:]:
            e = st + d
            if e < end:
                end = e
            if st > last_start:
                last_start = st
    t = end - last_start
    return t if t > 0.0 else 0.0


def member_ranks(c: Collective) -> tuple[int, ...]:
    """The sorted ranks of a collective."""
    return tuple(sorted([m[0] for m in c[HEAD:]]))


P2P_OPS = frozenset(("send", "recv", "isend", "irecv", "p2p"))


def waited_for(colls: list[Collective], p: EvidenceConfig | None = None
               ) -> tuple[dict[int, float], set[int]]:
    """Who each group waited for in one step: per group of ``p.waited_min_members`` (3)
    members or more, the member charged the largest summed arrival lag (``lags``, > 0) over the
    group's collectives of the step. Returns (rank -> the lag charged to it in the groups
    it was waited for in, seconds; the ranks that were members of such a group).

    - Two-member groups never make a rank waited for (one of two is last half the time;
      a pipeline's heavier stage always is, by design), but a rank that waited for the
      other member of one, or for another member of any group, is not counted as waited
      for in any: in a 2-D layout the members of a straggler's tensor-parallel group
      reach their data-parallel collectives late together, victims of the one they
      waited for.
    - A rank that took part in a point-to-point op (send / recv) in the step is left out,
      as if in no group: a pipeline passes any stage's delay to every stage of its
      replica, which then reach their data-parallel collectives late together
      (``models.p2p`` judges the pairs).

    One pass over the members of the step's collectives, one over those of its groups:
    O(members) per step."""
    per: dict[str, dict[int, float]] = {}
    first: dict[str, Collective] = {}      # group -> its first collective (its members)
    pairs: set[int] = set()
    for c in colls:
        if c[OP] in P2P_OPS:
            pairs.update(m[0] for m in c[HEAD:])
            continue
        if len(c) < HEAD + 2:
            continue
        last_rank, lead = last_lead(c)
        g = per.get(c[GROUP])
        if g is None:
            g = per[c[GROUP]] = {}
            first[c[GROUP]] = c
        g[last_rank] = g.get(last_rank, 0.0) + lead
    least = (p or EvidenceConfig()).waited_min_members
    wide = {name for name, c in first.items() if len(c) >= HEAD + least}
    members = {m[0] for name in wide for m in first[name][HEAD:]}
    top: dict[int, float] = {}
    gtop: dict[str, int] = {}
    for name, g in per.items():
        r, lag = max(g.items(), key=lambda kv: kv[1])
        if lag > 0.0:
            gtop[name] = r
            if name in wide:
                top[r] = top.get(r, 0.0) + lag
    if top and len(gtop) > 1:
        # the members of a group whose waited-for member is another rank waited there
        for name, r in gtop.items():
            for m, _, _ in first[name][HEAD:]:
                if m != r:
                    top.pop(m, None)
    if pairs:
        members -= pairs
        for m in pairs:
            top.pop(m, None)
    return top, members
