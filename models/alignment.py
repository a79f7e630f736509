"""Collective alignment: join the events of one collective (same group and
``seq``) from all its members, and derive per rank and per step:

- time spent inside collectives (seconds) — step time minus this is the
  rank's own work when the step event carries neither ``compute_s`` nor
  ``comm_s`` (only then is it counted: ``need_time``, kept by the job);
- arrival lag: at each collective the last member to arrive is the one the
  others wait for; it is charged ``last start - second-to-last start``;
- transfers: for every complete collective its transfer time once all
  members were in (``min end - max start``, seconds) and its bytes, so the
  link evaluation can compare effective bandwidth between groups and with a
  group's own past.

Per event the work is a dict append; the join runs once per complete
collective, one pass over its members. Collectives whose members never all
arrive are dropped after ``max_age`` steps.
"""

from __future__ import annotations

from typing import Any

P2P = ("send", "recv")
Transfer = tuple[str, str, tuple[int, ...], float, int]


class CollectiveAligner:
    """Aligns the collective events of one job."""

    def __init__(self, max_age: int = 4) -> None:
        self.max_age = max_age
        self.need_time = True        # count time in collectives (steps lack compute/comm)
        self.open: dict[tuple[str, int], list[Any]] = {}
        self.coll_time: dict[tuple[int, int], float] = {}
        self.late: dict[tuple[int, int], float] = {}
        # step -> list of (group, op, member ranks, transfer seconds, bytes)
        self.transfers: dict[int, list[Transfer]] = {}

    def add(self, ev: dict[str, Any], step: int) -> None:
        """Take one collective event of a rank; ``step`` is the step it belongs to."""
        if self.need_time:
            key = (ev["rank"], step)
            ct = self.coll_time
            ct[key] = ct.get(key, 0.0) + ev["duration_s"]
        gk = (ev["group"], ev["seq"])
        members = self.open.get(gk)
        if members is None:
            self.open[gk] = [step, ev]
            return
        members.append(ev)
        if len(members) > ev["group_size"]:
            del self.open[gk]
            self._join(members)

    def _join(self, members: list[Any]) -> None:
        """One pass over a complete collective (``members[0]`` is its step)."""
        step = members[0]
        first = members[1]
        last_start = second = float("-inf")
        last_rank = first["rank"]
        end = float("inf")
        ranks = []
        for m in members[1:]:
            st = m["start_ts"]
            e = st + m["duration_s"]
            if e < end:
                end = e
            r = m["rank"]
            ranks.append(r)
            # Ties leave the lag at zero, whoever is charged.
            if st > last_start:
                second, last_start, last_rank = last_start, st, r
            elif st > second:
                second = st
        if len(ranks) > 1:
            key = (last_rank, step)
            late = self.late
            late[key] = late.get(key, 0.0) + last_start - second
        ranks.sort()
        t = end - last_start
        row = (first["group"], first["op"], tuple(ranks), t if t > 0.0 else 0.0, first["bytes"])
        lst = self.transfers.get(step)
        if lst is None:
            self.transfers[step] = [row]
        else:
            lst.append(row)

    def take(self, rank: int, step: int) -> tuple[float | None, float]:
        """Pop (seconds in collectives or None if none counted, arrival lag) of a rank-step."""
        return self.coll_time.pop((rank, step), None), self.late.pop((rank, step), 0.0)

    def take_transfers(self, step: int) -> list[Transfer]:
        return self.transfers.pop(step, [])

    def expire(self, step: int) -> None:
        """Forget anything of steps older than ``step - max_age`` (members that never came)."""
        horizon = step - self.max_age
        for gk in [k for k, v in self.open.items() if v[0] < horizon]:
            del self.open[gk]
        for d in (self.coll_time, self.late):
            for k in [k for k in d if k[1] < horizon]:
                del d[k]
        for s in [s for s in self.transfers if s < horizon]:
            del self.transfers[s]
