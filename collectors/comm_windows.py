"""``comm`` summaries: ops that ended in a window, one entry per (group, op, peer).

The producers (the training hook, the NCCL Inspector tailer) hand over the ``collective``
events of the ops that ended in a window and each op's *blocked* seconds; ``summarize``
turns them into the ``ops`` entries of one ``comm`` record (CONTRACT.md): ``n``,
``blocked_s`` (summed), ``min_s``/``max_s`` (op durations, issue to completion, as a
``collective`` event's ``duration_s``), ``bytes`` (summed), ``first_seq``/``last_seq``,
``first_start_ts``.

An op's blocked seconds come from ``split_blocked``: the rank's blocked time (the union
of ``collectors.intervals.BlockedTime``, each instant counted once) is shared out among
the ops open at each instant, in equal parts. Two concurrent ops blocking the same
10 ms get 5 ms each, so the ``blocked_s`` of a rank's entries never add up to more than
the time it was blocked, however many ops overlap; blocked time while no op is open (a
wait on an op already done) belongs to no entry.

>>> split_blocked([(0.0, 1.0), (0.5, 1.0)], [], [(0.0, 1.0)])   # [0.5, 1] shared
[0.75, 0.25]
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

INF = float("inf")


def split_blocked(mine: Sequence[tuple[float, float]], others: Iterable[tuple[float, float]],
                  blocked: Iterable[tuple[float, float]]) -> list[float]:
    """Blocked seconds of each op of ``mine`` (``[start, end]``): every blocked instant
    (in the union of ``blocked``) split equally among the ops open at that instant, those
    of ``mine`` and ``others`` (ops reported elsewhere, or still in flight: ``end`` INF).

    >>> split_blocked([(0, 4)], [(2, INF)], [(1, 3)])   # [1,2] alone, [2,3] shared
    [1.5]
    """
    if not mine:
        return []
    lo = min(a for a, _ in mine)
    hi = max(b for _, b in mine)
    # only what overlaps [lo, hi] matters
    spans = list(mine) + [(a, b) for a, b in others if b > lo and a < hi]
    cuts = [(a, b) for a, b in blocked if b > lo and a < hi and b > a]
    points = sorted({lo, hi, *(max(p, lo) for s in spans for p in s if p <= hi),
                     *(min(max(p, lo), hi) for c in cuts for p in c)})
    index = {p: i for i, p in enumerate(points)}
    opened = [0] * (len(points) + 1)
    for a, b in spans:
        opened[index[max(a, lo)]] += 1
        opened[index[min(b, hi)]] -= 1
    covered = [0] * (len(points) + 1)
    for a, b in cuts:
        covered[index[max(a, lo)]] += 1
        covered[index[min(b, hi)]] -= 1
    # cumulative share of blocked time per open op, up to each point
    acc = [0.0] * len(points)
    n_open = n_cut = 0
    for i in range(len(points) - 1):
        n_open += opened[i]
        n_cut += covered[i]
        rate = 1.0 / n_open if n_open > 0 and n_cut > 0 else 0.0
        acc[i + 1] = acc[i] + rate * (points[i + 1] - points[i])
    return [acc[index[min(b, hi)]] - acc[index[max(a, lo)]] for a, b in mine]


def in_flight(issues: Sequence[float], ended_starts: Iterable[float]) -> list[float]:
    """Issue times with no ended op: the starts of the ops still in flight.

    >>> in_flight([1.0, 2.0, 3.0], [2.0])
    [1.0, 3.0]
    """
    left = sorted(issues)
    for s in ended_starts:
        i = bisect_right(left, s) - 1
        if i >= 0 and left[i] == s:
            del left[i]
    return left


def summarize(events: Sequence[dict], blocked: Sequence[float]) -> list[dict]:
    """The ``ops`` entries of a ``comm`` record from ``collective`` events (``group``,
    ``group_size``, ``op``, ``peer``, ``seq``, ``start_ts``, ``duration_s``, ``bytes``)
    and each op's blocked seconds, in order of first appearance."""
    entries: dict[tuple, dict] = {}
    for ev, b in zip(events, blocked, strict=True):
        peer = ev.get("peer")
        key = (ev["group"], ev["op"], peer)
        d, seq = ev["duration_s"], ev["seq"]
        e = entries.get(key)
        if e is None:
            e = entries[key] = {"group": ev["group"], "group_size": ev["group_size"],
                                "op": ev["op"], "n": 0, "blocked_s": 0.0, "min_s": d,
                                "max_s": d, "bytes": 0, "first_seq": seq, "last_seq": seq,
                                "first_start_ts": ev["start_ts"]}
            if peer is not None:
                e["peer"] = peer
        e["n"] += 1
        e["blocked_s"] += b
        e["bytes"] += ev["bytes"]
        e["min_s"] = min(e["min_s"], d)
        e["max_s"] = max(e["max_s"], d)
        e["first_seq"] = min(e["first_seq"], seq)
        e["last_seq"] = max(e["last_seq"], seq)
        e["first_start_ts"] = min(e["first_start_ts"], ev["start_ts"])
    return list(entries.values())


def comm_record(job_id: str, rank: int, host: str, window_start_ts: float, ts: float,
                ops: list[dict], step: int | None = None, step_end: bool | None = False,
                world_size: int | None = None, gpu: int | None = None) -> dict:
    """One ``comm`` event (CONTRACT.md)."""
    return {"v": 1, "kind": "comm", "ts": ts, "job_id": job_id, "rank": rank, "host": host,
            "window_start_ts": min(window_start_ts, ts), "ops": ops, "step": step,
            "step_end": step_end, "world_size": world_size, "gpu": gpu}
