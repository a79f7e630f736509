"""``comm`` windows as evidence: who each group waits for, its transfer cost, link pairs.

A ``comm`` record (CONTRACT.md) sums one rank's ops per (group, op, peer) over a window;
durations are the rank's own, so nothing here needs the hosts' clocks to agree. Per job
step and per (group, kind of op), ``CommWindows`` adds up each member's blocked seconds
and bytes over the windows of the step; when the step is judged it hands the same
evidence the per-op path derives from ``collective`` events (``models.alignment``), as
one collective per (group, kind of op) and step:

- who the group waits for: the member that blocked least. A member is given
  ``start_ts = -blocked_s``, so ``alignment.lags`` charges the least-blocked member the
  gap to the next one — the per-op arrival lag summed over the step, when the same member
  arrives last;
- transfer cost: the shortest op (``min_s``) of any member, times the ops of a member:
  an op takes its transfer time on the member that arrived last (it waits for nobody),
  and the shortest one is the one least inflated by waiting — also on a pipeline link,
  whose blocked time is mostly the wait for the other stage. Members end together, so
  ``alignment.transfer`` (last start to first end) returns exactly that, and the link
  evaluation (``models.links``) divides it by the bytes; no clock offsets (all 0);
- link pairs: ``send``/``recv`` entries of a two-member group are one point-to-point
  collective of the pair, as the ``collective`` events of a pipeline link are;
- time inside collectives per rank and step (own work when steps lack ``compute_s`` and
  ``comm_s``): the sum of the rank's ``blocked_s``.

A window without ``step`` (a producer that does not know steps) belongs to the rank's next
step. A record's entries are kept per step as columns ((group, op) and the four numbers
of each entry, the rank and entry count of each record), taken by C-level maps when the
record arrives, while its dicts are still in the CPU cache (read back a step later they
cost a cache miss each: 2x the time on a 1,024-rank job), until the step is judged,
``max_age`` steps at most; the sums are made once, when the step is judged, with numpy
reductions over the columns.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from failslow.models.alignment import Collective

KIND = {"send": "p2p", "recv": "p2p"}      # a pair's sends and recvs are one link
_KEY = itemgetter("group", "op")
_NUMS = itemgetter("blocked_s", "bytes", "n", "min_s")


class _Columns:
    """The entries of one step's windows, as columns taken when each record arrives (its
    dicts are then still in the CPU cache; read back a step later, they cost a cache miss
    each): per entry its (group, op) and (blocked_s, bytes, n, min_s), per window its rank
    and number of entries."""

    __slots__ = ("keys", "nums", "ranks", "counts")

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self.nums: list[tuple] = []
        self.ranks: list[int] = []
        self.counts: list[int] = []

    def __len__(self) -> int:
        """Windows (records) taken."""
        return len(self.ranks)


class CommWindows:
    """One job's ``comm`` windows per step, and their sums per group, kind of op and member."""

    __slots__ = ("max_age", "steps", "_step", "_time", "_colls")

    def __init__(self, max_age: int = 4) -> None:
        self.max_age = max_age
        # step -> its windows' entries as columns, in arrival order
        self.steps: dict[int, _Columns] = {}
        self._step: int | None = None      # the step whose sums are below
        self._time: dict[int, float] = {}  # rank -> seconds in ops
        self._colls: list[Collective] = []

    def add(self, ev: dict[str, Any], step: int) -> None:
        """Take one ``comm`` record of a rank; ``step`` is the step it belongs to."""
        ops = ev["ops"]
        if ops:
            rank = ev["rank"]
            keys = list(map(_KEY, ops))       # all of a record's fields, or none of them
            nums = list(map(_NUMS, ops))
            cols = self.steps.get(step)
            if cols is None:
                cols = self.steps[step] = _Columns()
            cols.keys += keys
            cols.nums += nums
            cols.ranks.append(rank)
            cols.counts.append(len(ops))

    def take_time(self, rank: int, step: int) -> float | None:
        """Pop the seconds a rank spent in collectives in a step (None if none counted)."""
        if step != self._step:
            self._sum(step)
        return self._time.pop(rank, None)

    def take_step(self, step: int) -> list[Collective]:
        """Pop a step's groups as collectives in ``models.alignment``'s layout."""
        if step != self._step:
            self._sum(step)
        out = self._colls
        self._step, self._time, self._colls = None, {}, []
        return out

    def _sum(self, step: int) -> None:
        self._step = step
        self._time, self._colls = {}, []
        cols = self.steps.pop(step, None)
        if cols is None:
            return
        if type(cols) is list:     # a snapshot from before columns: (rank, ts, ops) windows
            old, cols = cols, _Columns()
            for r, _, ops in old:
                cols.keys.extend(map(_KEY, ops))
                cols.nums.extend(map(_NUMS, ops))
                cols.ranks.append(r)
                cols.counts.append(len(ops))
        keys, nums, ranks, counts = cols.keys, cols.nums, cols.ranks, cols.counts
        ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        # (group, op) -> its link: one per (group, kind of op), named by its first op
        link: dict[tuple[str, str], int] = {}
        names: list[tuple[str, str]] = []
        to_link = np.empty(len(ids), dtype=np.int64)
        for (group, op), i in ids.items():
            lk = (group, KIND.get(op, op))
            j = link.get(lk)
            if j is None:
                j = link[lk] = len(names)
                names.append((group, op))
            to_link[i] = j
        rank = np.repeat(np.array(ranks, dtype=np.int64), counts)
        v = np.fromiter(chain.from_iterable(nums), dtype=np.float64,
                        count=4 * len(nums)).reshape(-1, 4)
        blocked = v[:, 0]
        self._time = _by_rank(rank, blocked)
        gid = to_link[np.fromiter(map(ids.__getitem__, keys), dtype=np.int64, count=len(keys))]
        # one member per (link, rank): sums, and the shortest op
        span = int(rank.max()) + 1
        member, inv = np.unique(gid * span + rank, return_inverse=True)
        m = len(member)
        sums = np.zeros((m, 3))
        np.add.at(sums, inv, v[:, :3])
        shortest = np.full(m, np.inf)
        np.minimum.at(shortest, inv, v[:, 3])
        mg = member // span
        mr = member % span
        cut = np.flatnonzero(np.diff(mg)) + 1
        first = np.concatenate([[0], cut])
        size = np.diff(np.concatenate([first, [m]]))
        least = np.minimum.reduceat(sums[:, 0], first)
        # Members end together: last start (-least) to first end is the transfer.
        end = (np.maximum.reduceat(sums[:, 2], first) * np.minimum.reduceat(shortest, first)
               - least)
        nbytes = np.maximum.reduceat(sums[:, 1], first)
        mr_l, b_l = mr.tolist(), sums[:, 0].tolist()
        colls = self._colls
        for a, k, e, nb, g in zip(first.tolist(), size.tolist(), end.tolist(),
                                  nbytes.tolist(), mg[first].tolist(), strict=True):
            if k < 2:
                continue
            group, op = names[g]
            c: Collective = [step, group, op, int(nb)]
            c.extend([(r, -b, e + b) for r, b in zip(mr_l[a:a + k], b_l[a:a + k],
                                                     strict=True)])
            colls.append(c)

    def expire(self, step: int) -> None:
        """Forget the windows of steps older than ``step - max_age`` (never judged)."""
        horizon = step - self.max_age
        for s in [s for s in self.steps if s < horizon]:
            del self.steps[s]


def _by_rank(rank: np.ndarray, seconds: np.ndarray) -> dict[int, float]:
    """Seconds summed per rank."""
    ranks, inv = np.unique(rank, return_inverse=True)
    return dict(zip(ranks.tolist(), np.bincount(inv, weights=seconds).tolist(), strict=True))
