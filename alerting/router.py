"""Who hears about which incident change: severity routes, de-duplication and rate limits.

Pure: no I/O, the clock is an argument. The rules:

- Routes by severity (default): ``info`` -> console, webhook; ``warning`` ->
  console, Slack, webhook; ``critical`` -> console, PagerDuty, Slack, webhook.
  ``info`` and ``job_slowdown`` never page, whatever the configuration says.
- De-duplication per incident_id: notify when it opens, when its severity rises
  (escalation: the new severity's destinations, e.g. PagerDuty is triggered on
  warning -> critical), and when it resolves (only the destinations that heard
  of it). Updates in between are silent.
- Rate limits: a token bucket per destination for opens and escalations; what
  does not fit is counted and announced later in one summary notification.
  A resolve of something a destination was told about is never held back, so
  no page stays open because of the limiter.

>>> r = Router(Policy(), enabled=["slack", "pagerduty"])
>>> ev = {"incident_id": "i1", "status": "open", "severity": "critical", "fault": "slow_rank"}
>>> [n.destination for n in r.decide(ev, now=0.0)]
['pagerduty', 'slack']
>>> r.decide(ev, now=1.0)
[]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from failslow.alerting.base import ESCALATE, OPEN, RESOLVE, SUMMARY, AlertingError, Notification
from failslow.schema.events import SEVERITY_RANK

PAGERS = frozenset({"pagerduty"})
KNOWN_DESTINATIONS = frozenset({"console", "slack", "pagerduty", "webhook"})
DEFAULT_ROUTES: dict[str, tuple[str, ...]] = {
    "info": ("console", "webhook"),
    "warning": ("console", "slack", "webhook"),
    "critical": ("console", "pagerduty", "slack", "webhook"),
}
# How many incident ids a rate-limit summary lists by name.
SUMMARY_IDS = 20


@dataclass(frozen=True)
class RateLimit:
    """At most ``burst`` notifications at once, refilled at ``burst`` per ``per_s`` seconds."""

    burst: int
    per_s: float

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``10/60`` -> 10 per 60 s."""
        try:
            n, s = text.split("/")
            limit = cls(int(n), float(s))
        except ValueError:
            raise AlertingError(f"rate {text!r}: expected N/SECONDS, e.g. 10/60") from None
        if limit.burst < 1 or limit.per_s <= 0:
            raise AlertingError(f"rate {text!r}: N and SECONDS must be positive")
        return limit


# Slack accepts ~1 message/s per webhook; PagerDuty 120 events/min per routing key.
DEFAULT_RATES: dict[str, RateLimit | None] = {
    "console": None,
    "slack": RateLimit(10, 60.0),
    "pagerduty": RateLimit(20, 60.0),
    "webhook": RateLimit(60, 60.0),
}


@dataclass
class TokenBucket:
    """Classic token bucket; ``take(now)`` spends one token if there is one."""

    limit: RateLimit
    tokens: float = -1.0
    stamp: float | None = None

    def take(self, now: float) -> bool:
        if self.stamp is None:
            self.tokens, self.stamp = float(self.limit.burst), now
        rate = self.limit.burst / self.limit.per_s
        self.tokens = min(float(self.limit.burst), self.tokens + max(now - self.stamp, 0.0) * rate)
        self.stamp = max(self.stamp, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True)
class Policy:
    """Severity -> destinations, and the rate limit of each destination (None: unlimited)."""

    routes: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_ROUTES))
    rates: Mapping[str, RateLimit | None] = field(default_factory=lambda: dict(DEFAULT_RATES))

    def __post_init__(self) -> None:
        for severity, dests in self.routes.items():
            if severity not in SEVERITY_RANK:
                raise AlertingError(f"route {severity!r}: severity must be info, warning "
                                    "or critical")
            unknown = set(dests) - KNOWN_DESTINATIONS
            if unknown:
                raise AlertingError(f"route {severity!r}: unknown destination "
                                    f"{sorted(unknown)[0]!r} (known: "
                                    f"{', '.join(sorted(KNOWN_DESTINATIONS))})")
            if severity == "info" and PAGERS & set(dests):
                raise AlertingError("route 'info': info incidents never page")
        unknown = set(self.rates) - KNOWN_DESTINATIONS
        if unknown:
            raise AlertingError(f"rate: unknown destination {sorted(unknown)[0]!r}")

    def destinations(self, ev: Mapping[str, Any]) -> tuple[str, ...]:
        dests = self.routes.get(str(ev.get("severity")), ())
        if ev.get("severity") == "info" or ev.get("fault") == "job_slowdown":
            dests = tuple(d for d in dests if d not in PAGERS)
        return dests


@dataclass(frozen=True)
class IncidentState:
    """What the destinations were last told about one incident."""

    status: str
    severity: str
    destinations: tuple[str, ...]
    updated_ts: float

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "severity": self.severity,
                "destinations": list(self.destinations), "updated_ts": self.updated_ts}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IncidentState:
        return cls(d["status"], d["severity"], tuple(d["destinations"]), float(d["updated_ts"]))


@dataclass
class _Held:
    """Notifications a destination's rate limit held back since its last summary."""

    count: int = 0
    since_ts: float = 0.0
    until_ts: float = 0.0
    incident_ids: list[str] = field(default_factory=list)
    severities: dict[str, int] = field(default_factory=dict)


class Router:
    """Turns incident events into notifications; ``state`` maps incident_id -> IncidentState
    (restored from disk after a restart). ``dirty`` collects the ids whose state changed,
    for the caller to persist together with the notifications."""

    def __init__(self, policy: Policy, enabled: Iterable[str],
                 state: dict[str, IncidentState] | None = None) -> None:
        self.policy = policy
        self.enabled = frozenset(enabled)
        self.state: dict[str, IncidentState] = dict(state or {})
        self.dirty: set[str] = set()
        self.suppressed_total = 0
        self._buckets = {d: TokenBucket(lim) for d, lim in policy.rates.items() if lim}
        self._held: dict[str, _Held] = {}

    def decide(self, ev: Mapping[str, Any], now: float) -> list[Notification]:
        """The notifications one incident event calls for (often none)."""
        iid = str(ev["incident_id"])
        prev = self.state.get(iid)
        severity = str(ev["severity"])
        if ev["status"] == "resolved":
            if prev is not None and prev.status == "resolved":
                return []
            action = RESOLVE
            # Only those told of the incident hear that it ended; an incident never
            # seen open is news to its non-paging destinations (there is no page to close).
            told = prev.destinations if prev is not None else ()
            targets = told if prev is not None else tuple(
                d for d in self.policy.destinations(ev) if d not in PAGERS)
            status = "resolved"
        else:
            if prev is None or prev.status == "resolved":
                action, told = OPEN, ()
            elif SEVERITY_RANK[severity] > SEVERITY_RANK[prev.severity]:
                action, told = ESCALATE, prev.destinations
            else:
                return []
            targets = self.policy.destinations(ev)
            status = "open"
        notes = []
        reached = set(told)
        for dest in targets:
            if dest not in self.enabled:
                continue
            exempt = action == RESOLVE and dest in told
            if not exempt and not self._admit(dest, iid, severity, now):
                continue
            notes.append(Notification(dest, action, dict(ev)))
            reached.add(dest)
        if prev is not None and status == "open":
            severity = max(severity, prev.severity, key=SEVERITY_RANK.__getitem__)
        self.state[iid] = IncidentState(status, severity, tuple(sorted(reached)), now)
        self.dirty.add(iid)
        return notes

    def _admit(self, dest: str, iid: str, severity: str, now: float) -> bool:
        bucket = self._buckets.get(dest)
        if bucket is None or bucket.take(now):
            return True
        held = self._held.setdefault(dest, _Held(since_ts=now))
        held.count += 1
        held.until_ts = now
        if len(held.incident_ids) < SUMMARY_IDS and iid not in held.incident_ids:
            held.incident_ids.append(iid)
        held.severities[severity] = held.severities.get(severity, 0) + 1
        self.suppressed_total += 1
        return False

    def summaries(self, now: float) -> list[Notification]:
        """One summary per destination that held notifications back, once its bucket
        has a token again (the summary spends it)."""
        notes = []
        for dest, held in list(self._held.items()):
            if not self._buckets[dest].take(now):
                continue
            del self._held[dest]
            notes.append(Notification(dest, SUMMARY, {
                "kind": "notification_summary", "destination": dest,
                "suppressed": held.count, "since_ts": held.since_ts, "until_ts": held.until_ts,
                "incident_ids": held.incident_ids, "severities": held.severities}))
        return notes

    def take_dirty(self) -> dict[str, IncidentState]:
        """The changed incident states since the last call (to be persisted)."""
        out = {iid: self.state[iid] for iid in self.dirty if iid in self.state}
        self.dirty.clear()
        return out

    def prune(self, before_ts: float) -> list[str]:
        """Forget incidents resolved before ``before_ts``; returns their ids."""
        old = [iid for iid, s in self.state.items()
               if s.status == "resolved" and s.updated_ts < before_ts]
        for iid in old:
            del self.state[iid]
        return old
