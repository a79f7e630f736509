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
step. The windows themselves are kept per step (the record's rank, ``ts`` and ``ops``,
nothing copied: taking a record is one append) until the step is judged, ``max_age`` steps at
most, so a later sub-step judgement (seconds, not steps) can read them; the sums are
made once, when the step is judged, in one pass over its entries and numpy reductions.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from models.alignment import Collective

KIND = {"send": "p2p", "recv": "p2p"}      # a pair's sends and recvs are one link
_KEY = itemgetter("group", "op")
_NUMS = itemgetter("blocked_s", "bytes", "n", "min_s")


class CommWindows:
    """One job's ``comm`` windows per step, and their sums per group, kind of op and member."""

    __slots__ = ("max_age", "steps", "_step", "_time", "_colls")

    def __init__(self, max_age: int = 4) -> None:
        self.max_age = max_age
        # step -> its windows as (rank, ts, ops), in arrival order
        self.steps: dict[int, list[tuple[int, float, list[dict[str, Any]]]]] = {}
        self._step: int | None = None      # the step whose sums are below
        self._time: dict[int, float] = {}  # rank -> seconds in ops
        self._colls: list[Collective] = []

    def add(self, ev: dict[str, Any], step: int) -> None:
        """Take one ``comm`` record of a rank; ``step`` is the step it belongs to."""
        ops = ev["ops"]
        if ops:
            lst = self.steps.get(step)
            if lst is None:
                self.steps[step] = [(ev["rank"], ev["ts"], ops)]
            else:
                lst.append((ev["rank"], ev["ts"], ops))

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
        windows = self.steps.pop(step, None)
        if not windows:
            return
        # Columns of every entry, built by C-level maps (no Python code per entry).
        keys: list[tuple[str, str]] = []
        nums: list[tuple] = []
        ranks: list[int] = []
        counts: list[int] = []
        for r, _, ops in windows:
            keys.extend(map(_KEY, ops))
            nums.extend(map(_NUMS, ops))
            ranks.append(r)
            counts.append(len(ops))
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
        v = np.array(nums, dtype=np.float64)
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
