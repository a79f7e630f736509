"""A job's ranks by host (``Layout``): derived from its ``rank_host`` (rank -> host) and
kept while that does not change (``models.job.JobState.layout``; never pickled), so what
a judged step reads of the hosts (a host's ranks, the job's hosts, each member's host as
a number) is looked up, not found by a pass over every rank of the job each step.

>>> lay = Layout({0: "a", 1: "b", 2: "a"})
>>> lay.members, sorted(lay.hosts)
({'a': [0, 2], 'b': [1]}, ['a', 'b'])
>>> lay.host_index(np.array([2, 1, 7])).tolist()
[0, 1, -1]
>>> lay.holds({0: "a", 1: "b", 2: "a"}), lay.holds({0: "a", 1: "b", 2: "b"})
(True, False)
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np


class Layout:
    """The ranks of a job by host, as a ``rank_host`` placed them."""

    __slots__ = ("seen", "members", "order", "names", "hosts", "_rix", "_rh", "_lo")

    def __init__(self, rank_host: dict[int, Any]) -> None:
        self.seen = dict(rank_host)          # the placement this was made from
        members: dict[Any, list[int]] = {}
        for r, h in rank_host.items():
            got = members.get(h)
            if got is None:
                members[h] = [r]
            else:
                got.append(r)
        # host -> its ranks in ``rank_host``'s order; hosts in the order of their first rank
        self.members = members
        self.names = list(members)           # the hosts, in that order
        self.order = {h: i for i, h in enumerate(members)}   # host -> its place in names
        self.hosts = frozenset(members)
        self._rix: np.ndarray | None = None   # rank -> its host's place (-1: none)
        self._rh: dict[int, int] | None = None
        self._lo = 0                          # the rank at ``_rix``'s first place

    def holds(self, rank_host: dict[int, Any]) -> bool:
        """Whether ``rank_host`` still places every rank as this was made from: equal
        dicts (ranks are never taken out of one, so its order is the same too)."""
        return self.seen == rank_host

    def host_index(self, rank: np.ndarray) -> np.ndarray:
        """Each of ``rank``'s host as its place in ``names`` (-1: a rank placed nowhere)."""
        if self._rix is None and self._rh is None:
            keys = list(self.seen)
            order = self.order
            if keys and all(type(r) is int for r in keys) \
                    and max(keys) - min(keys) < 2 * len(keys):
                # dense rank numbers (a job's, a shard's block): an array from the lowest
                self._lo = min(keys)
                rix = np.full(max(keys) - self._lo + 1, -1, dtype=np.int64)
                rix[np.array(keys, dtype=np.int64) - self._lo] = \
                    [order[h] for h in self.seen.values()]
                self._rix = rix
            else:       # ranks that index no array: looked up one by one
                self._rh = {r: order[h] for r, h in self.seen.items()}
        if self._rix is not None:
            rix = self._rix
            k = rank - self._lo
            ok = (k >= 0) & (k < rix.size)
            return np.where(ok, rix[np.where(ok, k, 0)], -1)
        rh = self._rh
        assert rh is not None
        return np.fromiter(map(rh.get, rank.tolist(), repeat(-1)), dtype=np.int64,
                           count=rank.size)
