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

import os
from collections.abc import Sequence

import numpy as np

from failslow.schema.events import OPS_MAX

INF = float("inf")
GRAINS = ("comm", "collective", "both")


def resolve_grain(grain: str | None = None, window_s: float | None = None) -> tuple[str, float]:
    """What the hook publishes and its window: argument > ``FAILSLOW_HOOK_GRAIN`` /
    ``FAILSLOW_HOOK_WINDOW_S`` > ``comm`` every 1 s. Raises ValueError on a bad value."""
    grain = grain or os.environ.get("FAILSLOW_HOOK_GRAIN") or "comm"
    if grain not in GRAINS:
        raise ValueError(f"grain must be one of {', '.join(GRAINS)}, not {grain!r}")
    if window_s is None:
        text = os.environ.get("FAILSLOW_HOOK_WINDOW_S") or "1"
        try:
            window_s = float(text)
        except ValueError:
            raise ValueError(f"FAILSLOW_HOOK_WINDOW_S: not a number: {text!r}") from None
    if not window_s > 0 or window_s == float("inf"):
        raise ValueError(f"window_s must be a positive number of seconds, not {window_s}")
    return grain, float(window_s)


Spans = Sequence[tuple[float, float]] | np.ndarray  # [start, end] pairs, or an (n, 2) array


def split_blocked(mine: Spans, others: Spans, blocked: Spans) -> list[float]:
    """Blocked seconds of each op of ``mine`` (``[start, end]``): every blocked instant
    (in the union of ``blocked``) split equally among the ops open at that instant, those
    of ``mine`` and ``others`` (ops reported elsewhere, or still in flight: ``end`` INF).

    >>> split_blocked([(0, 4)], [(2, INF)], [(1, 3)])   # [1,2] alone, [2,3] shared
    [1.5]
    """
    own = np.asarray(mine, dtype=float).reshape(-1, 2)
    if not len(own):
        return []
    lo, hi = own[:, 0].min(), own[:, 1].max()
    # only what overlaps [lo, hi] matters, clipped to it
    rest = np.asarray(others, dtype=float).reshape(-1, 2)
    rest = rest[(rest[:, 1] > lo) & (rest[:, 0] < hi)]
    cuts = np.asarray(blocked, dtype=float).reshape(-1, 2)
    cuts = cuts[(cuts[:, 1] > lo) & (cuts[:, 0] < hi) & (cuts[:, 1] > cuts[:, 0])]
    spans = np.clip(np.vstack([own, rest]), lo, hi)
    cuts = np.clip(cuts, lo, hi)
    points = np.unique(np.concatenate([spans.ravel(), cuts.ravel()]))
    size = len(points)

    def count(iv: np.ndarray) -> np.ndarray:  # how many intervals cover each segment
        delta = (np.bincount(np.searchsorted(points, iv[:, 0]), minlength=size)
                 - np.bincount(np.searchsorted(points, iv[:, 1]), minlength=size))
        return np.cumsum(delta)[:-1]

    n_open, n_cut = count(spans), count(cuts)
    rate = np.where((n_open > 0) & (n_cut > 0), 1.0 / np.maximum(n_open, 1), 0.0)
    acc = np.concatenate([[0.0], np.cumsum(rate * np.diff(points))])
    share = acc[np.searchsorted(points, own[:, 1])] - acc[np.searchsorted(points, own[:, 0])]
    return [float(x) for x in share]


def clip_to_issues(spans: Sequence[tuple[float, float]],
                   issues: Sequence[float]) -> list[tuple[float, float]]:
    """``collectors.intervals.clip_to_last_issue`` of many async ops at once (``issues``
    sorted): each starts no earlier than the last issue at or before its end.

    >>> clip_to_issues([(0.0, 1.0), (0.1, 0.2)], [0.0, 0.3, 0.7, 1.2])
    [(0.7, 1.0), (0.1, 0.2)]
    """
    if not spans:
        return []
    iv = np.asarray(spans, dtype=float).reshape(-1, 2)
    marks = np.asarray(issues, dtype=float)
    i = np.searchsorted(marks, iv[:, 1], side="right")
    last = np.where(i > 0, marks[np.maximum(i - 1, 0)] if len(marks) else -INF, -INF)
    start = np.maximum(iv[:, 0], last)
    return list(zip(start.tolist(), iv[:, 1].tolist(), strict=True))


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
                                "op": ev["op"], "n": 1, "blocked_s": b, "min_s": d,
                                "max_s": d, "bytes": ev["bytes"], "first_seq": seq,
                                "last_seq": seq, "first_start_ts": ev["start_ts"]}
            if peer is not None:
                e["peer"] = peer
            continue
        e["n"] += 1
        e["blocked_s"] += b
        e["bytes"] += ev["bytes"]
        if d < e["min_s"]:
            e["min_s"] = d
        elif d > e["max_s"]:
            e["max_s"] = d
        if seq < e["first_seq"]:
            e["first_seq"] = seq
        elif seq > e["last_seq"]:
            e["last_seq"] = seq
        if ev["start_ts"] < e["first_start_ts"]:
            e["first_start_ts"] = ev["start_ts"]
    return list(entries.values())


def comm_record(job_id: str, rank: int, host: str, window_start_ts: float, ts: float,
                ops: list[dict], step: int | None = None, step_end: bool | None = False,
                world_size: int | None = None, gpu: int | None = None) -> dict:
    """One ``comm`` event (CONTRACT.md)."""
    return {"v": 1, "kind": "comm", "ts": ts, "job_id": job_id, "rank": rank, "host": host,
            "window_start_ts": min(window_start_ts, ts), "ops": ops, "step": step,
            "step_end": step_end, "world_size": world_size, "gpu": gpu}


def comm_records(job_id: str, rank: int, host: str, window_start_ts: float, ts: float,
                 ops: list[dict], step: int | None = None, step_end: bool | None = False,
                 world_size: int | None = None, gpu: int | None = None) -> list[dict]:
    """``comm_record``, split into several records of the same window when it has more
    entries than a record may hold (``schema.events.OPS_MAX``); only the last carries
    ``step_end``. No record when ``ops`` is empty."""
    parts = [ops[i:i + OPS_MAX] for i in range(0, len(ops), OPS_MAX)]
    not_last = None if step_end is None else False
    return [comm_record(job_id, rank, host, window_start_ts, ts, part, step,
                        step_end if i == len(parts) - 1 else not_last, world_size, gpu)
            for i, part in enumerate(parts)]
