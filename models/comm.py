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
step. The windows themselves are kept per step until it is judged, ``max_age`` steps at
most, so a later sub-step judgement (seconds, not steps) can read them.
"""

from __future__ import annotations

from typing import Any

from models.alignment import Collective

P2P = frozenset(("send", "recv"))


class CommWindows:
    """Per-step sums of one job's ``comm`` windows, per group, kind of op and member."""

    __slots__ = ("max_age", "steps", "time")

    def __init__(self, max_age: int = 4) -> None:
        self.max_age = max_age
        # step -> (group, op or "p2p") -> [op, rank -> [blocked_s, bytes, n, min_s]]
        self.steps: dict[int, dict[tuple[str, str], list[Any]]] = {}
        self.time: dict[tuple[int, int], float] = {}   # (rank, step) -> seconds in ops

    def add(self, ev: dict[str, Any], step: int) -> None:
        """Take one ``comm`` record of a rank; ``step`` is the step it belongs to."""
        ops = ev["ops"]
        if not ops:
            return
        rank = ev["rank"]
        groups = self.steps.get(step)
        if groups is None:
            groups = self.steps[step] = {}
        total = 0.0
        for e in ops:
            op = e["op"]
            blocked = e["blocked_s"]
            total += blocked
            key = (e["group"], "p2p" if op in P2P else op)
            g = groups.get(key)
            if g is None:
                g = groups[key] = [op, {}]
            m = g[1].get(rank)
            if m is None:
                g[1][rank] = [blocked, e["bytes"], e["n"], e["min_s"]]
            else:
                m[0] += blocked
                m[1] += e["bytes"]
                m[2] += e["n"]
                if e["min_s"] < m[3]:
                    m[3] = e["min_s"]
        tk = (rank, step)
        t = self.time
        t[tk] = t.get(tk, 0.0) + total

    def take_time(self, rank: int, step: int) -> float | None:
        """Pop the seconds a rank spent in collectives in a step (None if none counted)."""
        return self.time.pop((rank, step), None)

    def take_step(self, step: int) -> list[Collective]:
        """Pop a step's groups as collectives in ``models.alignment``'s layout."""
        groups = self.steps.pop(step, None)
        if not groups:
            return []
        out: list[Collective] = []
        for (group, _), (op, members) in groups.items():
            if len(members) < 2:
                continue
            ms = members.values()
            nbytes = max(m[1] for m in ms)
            least = min(m[0] for m in ms)
            # ends at transfer - least: last start (-least) to first end is the transfer
            end = max(m[2] for m in ms) * min(m[3] for m in ms) - least
            c: Collective = [step, group, op, nbytes]
            c.extend((r, -m[0], end + m[0]) for r, m in sorted(members.items()))
            out.append(c)
        return out

    def expire(self, step: int) -> None:
        """Forget anything of steps older than ``step - max_age``."""
        horizon = step - self.max_age
        for s in [s for s in self.steps if s < horizon]:
            del self.steps[s]
        for k in [k for k in self.time if k[1] < horizon]:
            del self.time[k]

