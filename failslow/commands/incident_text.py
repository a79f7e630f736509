"""Incidents as one line of text each, for people: when, who, why, what it cost.

``detect --format text`` folds an incident's events (open, updates, resolved) into one
line with its latest state and its worst slowdown, so a trace's story fits a screen.
"""

from __future__ import annotations

import datetime as dt
from typing import Any


class IncidentLines:
    """Collects incident events; ``lines()`` gives one line per incident, by onset."""

    def __init__(self) -> None:
        self.last: dict[str, dict[str, Any]] = {}
        self.worst: dict[str, float] = {}

    def add(self, inc: dict[str, Any]) -> None:
        key = inc["incident_id"]
        self.last[key] = inc
        self.worst[key] = max(self.worst.get(key, 0.0), float(inc.get("slowdown_pct") or 0.0))

    def lines(self) -> list[str]:
        incs = sorted(self.last.values(), key=lambda i: (i["onset_ts"], i["incident_id"]))
        return [line(i, self.worst[i["incident_id"]]) for i in incs]


def line(inc: dict[str, Any], worst_pct: float | None = None) -> str:
    """``2026-01-01 00:00:30 UTC  job0  rank 5 (h0 GPU 5)  critical slow_rank, cause
    gpu_thermal  24 % slower at worst (now 8 %), 0.051 GPU-h lost  resolved after
    1 min 24 s, detected +2.6 s  action rebalance_microbatches  [job0:slow_rank:r5:25]``"""
    onset = float(inc["onset_ts"])
    when = dt.datetime.fromtimestamp(onset, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    why = f"{inc['severity']} {inc['fault']}, cause {inc.get('root_cause') or 'unknown'}"
    now = float(inc.get("slowdown_pct") or 0.0)
    worst = now if worst_pct is None else max(worst_pct, now)
    cost = f"{worst:.0f} % slower at worst (now {now:.0f} %)"
    if inc.get("gpu_hours_lost") is not None:
        cost += f", {float(inc['gpu_hours_lost']):.3g} GPU-h lost"
    end = inc.get("resolved_ts") if inc["status"] == "resolved" else inc["ts"]
    state = (f"{'resolved' if inc['status'] == 'resolved' else 'open'} "
             f"{'after' if inc['status'] == 'resolved' else 'for'} "
             f"{_duration(float(end or onset) - onset)}, "
             f"detected +{float(inc['detected_ts']) - onset:.1f} s")
    parts = [when, str(inc["job_id"]), who(inc), why, cost, state]
    if inc.get("mitigation"):
        parts.append(f"action {inc['mitigation']}")
    return "  ".join(parts) + f"  [{inc['incident_id']}]"


def who(inc: dict[str, Any]) -> str:
    """The culprit: a rank (its host and GPU), a link between hosts, or a host."""
    where = []
    if inc.get("host"):
        where.append(str(inc["host"]))
    if inc.get("gpu") is not None:
        where.append(f"GPU {inc['gpu']}")
    if inc.get("rank") is not None:
        out = f"rank {inc['rank']}" + (f" ({' '.join(where)})" if where else "")
        if inc.get("peer_rank") is not None:
            out += f" <-> rank {inc['peer_rank']}"
        return out
    out = f"host {' '.join(where)}" if where else "the whole job"
    if inc.get("peer_host"):
        out += f" <-> {inc['peer_host']}"
    return out


def _duration(seconds: float) -> str:
    s = int(round(max(0.0, seconds)))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"
