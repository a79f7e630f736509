"""Human-readable text for an incident change: who is slow, why, what to do, since when.

Shared by the Slack, PagerDuty and console notifiers so an operator reads the
same words everywhere.

>>> ev = {"incident_id": "job0:slow_rank:r5:20", "job_id": "job0", "status": "open",
...       "fault": "slow_rank", "severity": "critical", "rank": 5, "host": "h0", "gpu": 5,
...       "root_cause": "gpu_thermal", "slowdown_pct": 31.25, "onset_ts": 0.0,
...       "detected_ts": 8.0, "ts": 8.0}
>>> headline(ev, "open")
'[CRITICAL] slow_rank in job0: rank 5 (host h0, GPU 5), cause gpu_thermal, job +31.2%'
>>> headline({**ev, "gpu_hours_lost": 3.456}, "open")[-38:]
'job +31.2%, 3.46 GPU-hours lost so far'
>>> ev["evidence"] = {"rule": "step-peers", "policy": "persisted 4 steps (4.0 s) -> critical"}
>>> headline(ev, "open")[-68:]
'job +31.2% -- rule step-peers; persisted 4 steps (4.0 s) -> critical'
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from failslow.alerting.base import ESCALATE, RESOLVE, SUMMARY

# Why a mitigation is proposed, when the incident does not say (evidence.mitigation_reason).
MITIGATION_REASONS = {
    "ignore": "short or small slowdown: acting would cost more than it saves",
    "rebalance_microbatches": "give the slow rank fewer micro-batches; no restart needed",
    "adjust_pipeline": "re-split pipeline stages around the slow stage; no restart needed",
    "migrate_node": "persistent slowdown: move this node's ranks to a spare node",
    "checkpoint_restart": "severe persistent slowdown: checkpoint, then restart without the node",
}


def utc(ts: float | None) -> str:
    """``2026-11-21 06:34:12Z`` for seconds since the epoch; ``?`` when unknown."""
    if ts is None:
        return "?"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float) -> str:
    """``45.0 s``, ``12m05s``, ``3h02m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _rank_at(rank: Any, host: Any, gpu: Any = None) -> str:
    bits = [f"host {host}"] if host is not None else []
    if gpu is not None:
        bits.append(f"GPU {gpu}")
    inner = f" ({', '.join(bits)})" if bits else ""
    return f"rank {rank}{inner}" if rank is not None else (f"host {host}" if host else "?")


def where(ev: dict[str, Any]) -> str:
    """The culprit: a rank, a link between two ranks or hosts, a host NIC, a host, or the job."""
    fault = ev.get("fault")
    rank, host = ev.get("rank"), ev.get("host")
    if fault == "slow_link":
        peer_rank, peer_host = ev.get("peer_rank"), ev.get("peer_host")
        if rank is None and peer_rank is None and peer_host is None:
            return f"NIC of host {host}"
        return f"link {_rank_at(rank, host)} <-> {_rank_at(peer_rank, peer_host)}"
    if fault == "slow_host":
        return f"host {host}"
    if fault == "job_slowdown" and rank is None and host is None:
        return "whole job, no single culprit"
    return _rank_at(rank, host, ev.get("gpu"))


def mitigation(ev: dict[str, Any]) -> str | None:
    """``migrate_node (persistent slowdown: ...)`` or None when no mitigation is proposed."""
    name = ev.get("mitigation")
    if not name:
        return None
    evidence = ev.get("evidence") or {}
    reason = evidence.get("mitigation_reason") or evidence.get("reason") \
        or MITIGATION_REASONS.get(name)
    return f"{name} ({reason})" if reason else name


def cost(ev: dict[str, Any]) -> str | None:
    """``3.46 GPU-hours lost so far`` (CONTRACT.md gpu_hours_lost), None when not priced."""
    lost = ev.get("gpu_hours_lost")
    if lost is None:
        return None
    lost = float(lost)
    shown = f"{lost:.2f}" if lost >= 0.01 else f"{lost:.4f}"
    return f"{shown} GPU-hours lost{'' if ev.get('status') == 'resolved' else ' so far'}"


def acted(ev: dict[str, Any]) -> str | None:
    """What failslow did about it (issue 32, ``evidence.action``): ``apply
    rebalance_microbatches: rank 2 takes 31% less ...`` when it acted, later ``rebalanced:
    rank 2 takes 31% less; job step 0.41 s -> 0.27 s``; None when nothing was done."""
    done = (ev.get("evidence") or {}).get("action")
    return str(done) if done else None


def headline(ev: dict[str, Any], action: str) -> str:
    """One line: state, fault, job, culprit, cause, slowdown, cost."""
    if action == RESOLVE or ev.get("status") == "resolved":
        tag = "RESOLVED"
    elif action == ESCALATE:
        tag = f"ESCALATED {str(ev.get('severity')).upper()}"
    else:
        tag = str(ev.get("severity", "?")).upper()
    cause = ev.get("root_cause") or "unknown"
    text = (f"[{tag}] {ev.get('fault')} in {ev.get('job_id')}: {where(ev)}, cause {cause}, "
            f"job +{float(ev.get('slowdown_pct') or 0.0):.1f}%")
    priced = cost(ev)
    text = f"{text}, {priced}" if priced else text
    why = reason(ev)
    return f"{text} -- {why}" if why else text


def reason(ev: dict[str, Any]) -> str | None:
    """Why it pages (CONTRACT.md ``evidence.rule`` / ``evidence.policy``): ``rule
    step-peers; persisted 4 steps (4.2 s), 0.01 GPU-h lost -> warning``."""
    evidence = ev.get("evidence") or {}
    rule, policy = evidence.get("rule"), evidence.get("policy")
    if not rule and not policy:
        return None
    return "; ".join(x for x in (f"rule {rule}" if rule else "", policy or "") if x)


def timeline(ev: dict[str, Any]) -> str:
    """Onset, detection (with the delay) and, once resolved, how long it lasted."""
    onset, detected = ev.get("onset_ts"), ev.get("detected_ts")
    text = f"onset {utc(onset)}, detected {utc(detected)}"
    if onset is not None and detected is not None:
        text += f" (+{duration(max(detected - onset, 0.0))})"
    resolved = ev.get("resolved_ts")
    if ev.get("status") == "resolved" and resolved is not None and onset is not None:
        text += f", resolved {utc(resolved)} after {duration(max(resolved - onset, 0.0))}"
    return text


def summary_text(record: dict[str, Any]) -> str:
    """The rate-limit summary: how many notifications were held back, for which incidents."""
    ids = record.get("incident_ids") or []
    more = record.get("suppressed", 0) - len(ids)
    listed = ", ".join(ids) + (f" and {more} more" if more > 0 else "")
    by_sev = ", ".join(f"{k} {v}" for k, v in sorted((record.get("severities") or {}).items()))
    return (f"[RATE LIMITED] {record.get('suppressed', 0)} notification(s) to "
            f"{record.get('destination')} held back between {utc(record.get('since_ts'))} and "
            f"{utc(record.get('until_ts'))} ({by_sev}): {listed}")


def console_line(action: str, ev: dict[str, Any]) -> str:
    """The demo's one line per incident change."""
    if action == SUMMARY:
        return summary_text(ev)
    parts = [headline(ev, action), timeline(ev)]
    fix = mitigation(ev)
    if fix and action != RESOLVE:
        parts.append(f"mitigation {fix}")
    done = acted(ev)
    if done:
        parts.append(f"done: {done}")
    parts.append(f"id {ev.get('incident_id')}")
    return " | ".join(parts)
