"""Incident tracker: turns per-step findings into CONTRACT ``incident`` events.

An incident opens once, when its finding is confirmed, with a stable id
``{job_id}:{fault}:{culprit}:{onset_step}`` (replays and restarts give the
same id); it is updated only when something an operator cares about changes
(severity, root cause, an escalated mitigation, or the slowdown by half or 5 points); it resolves
after its culprit has been absent (back within its baseline and its peers)
for ``resolve_steps`` consecutive steps of the job, so it does not flap. A
culprit less than ``open_min_pct`` percent slower than its reference (its
peers, its own past) opens nothing, whatever the noise says; nor does a link
that no NIC counter explains and that costs the job less than that.
If the same culprit comes back with the same estimated onset after a resolve,
the new incident's id gets a ``.N`` suffix (still deterministic on replay).
An incident opens as ``info`` and pages (warning / critical) only once its
culprit has stayed confirmed ``page_after_steps`` more steps, so a two-step
blip is recorded but wakes nobody; or at once, when its finding's evidence is
consistent across windows spanning at least ``page_after_s`` seconds (evidence
``sustained_s``: a member its group waited for window after window inside a long
step, ``models.substep``, or a pipeline pair slow in every window, ``models.p2p``): a
stall shorter than that never confirms there, so
waiting for steps to end would only delay the page by steps that last many
seconds. The step-level analogue (``steady``): a confirmation that rests on
evidence spanning at least ``STEADY_MIN_STEPS`` (2, never one) of the job's steps,
whose latest step is still clearly outside the noise (``STEADY_Z`` sigmas from its
peers, at least ``open_min_pct`` slower) and not fading (at least ``STEADY_RATIO`` of
the mean excess of the earlier evidence steps) pages at once. The physics: a
fail-slow is a rate, every step of work takes longer by about the same share, so
the step that confirms it is as slow as the ones before (or slower: the fault
began inside the first); a stall is a lump of lost time, and what spills past
a step boundary is the smaller remainder, so a pause that straddles two short
steps fades on the second and keeps ``page_after_steps``. Two unrelated lumps on
consecutive steps, the second larger, look like a rate for two steps (one in 84
fault runs of the quality table: a compute hiccup then a loader stall); today's
rule pages those two steps later too. Findings with no
windowed evidence (hosts, links) page on their second confirmation when it is
as slow as the first. The span is counted in the job's own steps: those handed
to ``step`` that ended after the finding's onset. Severity never goes down while an incident is open: ``job_slowdown`` is always
``info``, and so is a ``slow_link`` that no NIC counter explains (root cause
``unknown``: seen only in collective timings); otherwise ``critical`` from ``critical_pct`` percent of job slowdown,
else ``warning``.
"""

from __future__ import annotations

import math
from typing import Any

from failslow.models.config import JobConfig
from failslow.models.findings import Finding
from failslow.models.rootcause import attribute
from failslow.models.telemetry import TelemetryStore
from failslow.schema.events import FAULTS, MITIGATIONS, SEVERITY_RANK

LADDER = MITIGATIONS
JOB_ENDED = "job ended"
# Collectors sample about once a second (CONTRACT.md): a cause still unknown after a late
# sample is looked at again one sample period of sample time later.
RECHECK_S = 1.0
# Resolved incidents still waiting for late telemetry to explain them, at most (oldest go).
UNEXPLAINED_MAX = 1024
LATE_FAULTS = ("slow_rank", "slow_host")
# Step-level paging at once (``IncidentTracker.steady``): evidence steps at least, the
# confirming step's share of the earlier evidence steps' mean excess at least (a fading
# excess is a stall's remainder), and its z to its peers at least (a full step of
# CUSUM evidence, 1.5 x z_min: the step alone is far outside the noise).
STEADY_MIN_STEPS = 2
STEADY_RATIO = 0.75
STEADY_Z = 1.5 * JobConfig().z_min
# Evidence that says the finding was weighed against its noise: a rank's z to its peers
# (this step), a z-CUSUM (point-to-point pairs), a host's ranks or a link's collective
# groups each confirmed by their own z-CUSUM.
NOISE_KEYS = ("z_to_peers", "evidence_z", "ranks", "slow_groups")
PERIOD_N = 5               # step gaps whose median is a job's step period
ENDS_N = 33                # step ends kept per job (evidence windows span at most 32)


class Incident:
    """An open incident: its last emitted event and what drives its updates."""

    __slots__ = ("event", "absent", "age", "causes", "emitted", "lost_s", "lost_ts", "where",
                 "recheck", "last_rel")

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        self.lost_s = 0.0         # a link's job seconds lost so far (``_link_lost``)
        self.lost_ts: float | None = None
        # (hosts, gpus, data share) of the culprit as last seen: what a late sample
        # re-attributes with (``IncidentTracker.late_sample``)
        self.where: tuple[list[str], list[tuple[str, int]], float] = ([], [], 0.0)
        self.recheck = -1e300     # a late sample before this ts re-attributes nothing
        self.absent = 0
        self.age = 0              # steps the culprit was present since the incident opened
        self.causes: dict[str, int] = {}
        self.emitted: dict[str, Any] = {}
        self.last_rel = 0.0       # the culprit's step excess at its last confirmation


class IncidentTracker:
    """Open / update / resolve incidents of every job from their findings."""

    def __init__(self, resolve_steps: int = 5, critical_pct: float = 20.0,
                 open_min_pct: float = 5.0, page_after_steps: int = 2,
                 min_update_s: float = 5.0, page_after_s: float = 2.0) -> None:
        self.resolve_steps = resolve_steps
        self.min_update_s = min_update_s
        self.page_after_steps = page_after_steps
        # (the default is JobConfig's sustain_s: a sub-step confirmation spans it)
        self.page_after_s = page_after_s
        self.critical_pct = critical_pct
        self.open_min_pct = open_min_pct
        self.open: dict[tuple[str, str], Incident] = {}
        self.reopened: dict[str, int] = {}    # incident id -> times it was opened again
        # incident id -> (job, incident as resolved): resolved with root cause unknown, whose
        # culprit's late telemetry may still come (``late_sample``)
        self.unexplained: dict[str, tuple[str, Incident]] = {}
        # job -> the ends (ts) of its last ENDS_N steps: how many steps evidence spans
        self.ends: dict[str, list[float]] = {}

    def period(self, job_id: str, ts: float) -> tuple[float, list[float]]:
        """Record a step of the job ending at ``ts``; returns its step period (the median
        gap between its last steps, 0 while unknown) and the ends of its last steps."""
        kept = getattr(self, "ends", None)
        if kept is None:                  # a tracker restored from an older snapshot
            kept = self.ends = {}
        ends = kept.get(job_id) or []
        if not ends or ts > ends[-1]:
            ends = (ends + [ts])[-ENDS_N:]
            kept[job_id] = ends
        last = ends[-PERIOD_N - 1:]
        gaps = sorted(b - a for a, b in zip(last[:-1], last[1:], strict=True))
        return (gaps[len(gaps) // 2] if gaps else 0.0), ends

    def steady(self, inc: Incident | None, f: Finding,
               period: tuple[float, list[float]]) -> bool:
        """Whether a confirmation pages at once, without ``page_after_steps`` more: its
        evidence spans ``STEADY_MIN_STEPS`` steps or more and its latest step is clearly
        outside the noise and not fading (module doc)."""
        gap, ends = period
        if not f.confirmed or f.imbalance or gap <= 0:
            return False
        ev = f.evidence
        if ev.get("evidence") == "change" and float(ev.get("evidence_z", 0.0)) < STEADY_Z / 2:
            # A change against the rank's own past confirmed by its window mean alone
            # (its per-step CUSUM, ``evidence_z``, still low: no step far outside the
            # noise) rests on a baseline of a few dozen noisy steps: it pages only once
            # it persists (today's rule).
            return False
        cur = self._step_rel(f)
        # Clearly outside the noise: its step's z to its peers; a rank with no peer doing
        # the same work (alone in its pipeline stage) has none, and its own-past evidence
        # stands in: its window's mean-excess z (one step against a baseline of a few
        # dozen noisy steps is no measure; a lump in one step does not lift a window).
        z = ev.get("z_to_peers")
        if z is None and ev.get("evidence") == "change":
            z = ev.get("mean_excess_z")
        if cur < self.open_min_pct / 100.0 or not any(k in ev for k in NOISE_KEYS) \
                or float(z if z is not None else STEADY_Z) < STEADY_Z:
            # Too small, or no word on the noise (a finding carrying no z-scored evidence):
            # today's rule.
            return False
        if inc is not None and inc.age >= 1 and getattr(inc, "last_rel", 0.0) > 0:
            # a second confirmation: as slow as the first (an incident's own memory)
            return cur >= STEADY_RATIO * inc.last_rel
        if float(ev.get("step_z", STEADY_Z)) < STEADY_Z:
            # a link group's step inside the noise (its z to the other groups and its own
            # past): its first confirmation waits for a second
            return False
        mean, n = ev.get("mean_excess"), ev.get("mean_excess_steps")
        # Steps of evidence: the job's steps that ended after the onset (the start of the
        # culprit's first step under it; the step before ends there, give or take the
        # ranks' skew, a small share of a step).
        since = float(f.onset_ts) + 0.25 * gap
        k = sum(1 for e in ends if e > since)
        if mean is None or not n or k < STEADY_MIN_STEPS:
            return False
        # The window holds the log excess of its last n steps, the confirming one
        # included: the rest of its sum is the earlier evidence steps' (k - 1 of them;
        # steps before the onset add only noise).
        cur_l = math.log1p(cur)
        prior = (float(mean) * int(n) - cur_l) / (min(k, int(n)) - 1)
        return cur_l >= STEADY_RATIO * prior

    @staticmethod
    def _step_rel(f: Finding) -> float:
        """The culprit's relative excess in the step at hand."""
        ev = f.evidence
        if "transfer_rel_slowdown" in ev:
            return float(ev["transfer_rel_slowdown"])
        if "rel_to_peers" in ev or "rel_to_own_past" in ev:
            return max(float(ev.get("rel_to_peers") or 0.0),
                       float(ev.get("rel_to_own_past") or 0.0))
        return f.own_pct / 100.0

    def severity(self, fault: str, pct: float, cause: str = "unknown") -> str:
        if fault == "job_slowdown" or (fault == "slow_link" and cause == "unknown"):
            # A link seen slower only in collective timings, with no NIC counter
            # behind it, is a suspicion: paths differ and queueing varies.
            return "info"
        return "critical" if pct >= self.critical_pct else "warning"

    def vote_cause(self, job_id: str, key: str, cause: str) -> str:
        """Record this step's root cause; return the incident's most supported one."""
        inc = self.open.get((job_id, key))
        if inc is None:
            return cause
        inc.causes[cause] = inc.causes.get(cause, 0) + 1
        known = {c: n for c, n in inc.causes.items() if c != "unknown"}
        pool = known or inc.causes
        return max(pool, key=lambda c: pool[c])

    def step(self, job_id: str, ts: float, found: list[tuple[Finding, str, str, str, dict]]
             ) -> list[dict[str, Any]]:
        """Apply one evaluated step of a job. ``found`` holds (finding, root_cause,
        mitigation, mitigation reason, root-cause evidence); ``ts`` is the time of the
        newest event of the step. Returns the incident events to publish."""
        out: list[dict[str, Any]] = []
        seen = set()
        ts = float(ts)
        period = self.period(job_id, ts)
        for f, cause, action, why, rc_ev in found:
            k = (job_id, f.key)
            inc = self.open.get(k)
            if inc is None and (not f.confirmed or f.own_pct < self.open_min_pct
                                or (f.fault == "slow_link" and cause == "unknown"
                                    and f.slowdown_pct < self.open_min_pct)):
                continue
            seen.add(k)
            pct = round(float(f.slowdown_pct), 2)
            if inc is None:
                culprit = f.key.split(":", 1)[1]
                iid = f"{job_id}:{f.fault}:{culprit}:{f.onset_step}"
                again = self.reopened.get(iid)
                self.reopened[iid] = (again or 0) + 1
                if again:          # same culprit and onset, after a resolve: a new incident
                    iid = f"{iid}.{again}"
                ev = {"v": 1, "kind": "incident", "ts": ts, "incident_id": iid,
                      "job_id": job_id, "status": "open", "fault": f.fault,
                      "severity": "info", "onset_ts": float(f.onset_ts),
                      "detected_ts": ts, "slowdown_pct": pct}
                for name in ("rank", "host", "gpu", "peer_rank", "peer_host"):
                    value = getattr(f, name)
                    if value is not None:
                        ev[name] = value
                fast = self.steady(None, f, period)
                inc = self.open[k] = Incident(ev)
                inc.causes[cause] = 1
                inc.last_rel = self._step_rel(f)
                self._fill(inc, f, cause, action, why, rc_ev, pct, ts, fast)
                out.append(dict(ev))
                continue
            inc.absent = 0
            fast = False
            if f.confirmed:          # only a culprit still standing out counts toward paging
                inc.age += 1
                fast = self.steady(inc, f, period)
                inc.last_rel = self._step_rel(f)
            if self._fill(inc, f, cause, action, why, rc_ev, pct, ts, fast):
                out.append(dict(inc.event))
        for k in [k for k in self.open if k[0] == job_id and k not in seen]:
            inc = self.open[k]
            inc.absent += 1
            if inc.absent >= self.resolve_steps:
                del self.open[k]
                ev = dict(inc.event, ts=ts, status="resolved", resolved_ts=ts)
                self._unexplained(job_id, inc, ev)
                out.append(ev)
        return out

    def late_pending(self) -> bool:
        """Whether a late device sample may change an incident (``late_sample``)."""
        return bool(self.open or getattr(self, "unexplained", None))

    def _unexplained(self, job_id: str, inc: Incident, resolved: dict[str, Any]) -> None:
        """Keep a resolved incident whose root cause is unknown for its late telemetry."""
        if resolved.get("root_cause") != "unknown" or resolved["fault"] not in LATE_FAULTS:
            return
        kept = getattr(self, "unexplained", None)
        if kept is None:                  # a tracker restored from an older snapshot
            kept = self.unexplained = {}
        late = Incident(dict(resolved))      # a copy: the emitted event stays as sent
        late.where, late.recheck = getattr(inc, "where", ([], [], 0.0)), \
            getattr(inc, "recheck", -1e300)
        kept[resolved["incident_id"]] = (job_id, late)
        while len(kept) > UNEXPLAINED_MAX:
            del kept[next(iter(kept))]

    def late_sample(self, host: str, sample_ts: float, now: float, store: TelemetryStore,
                    job_hosts: Any) -> list[dict[str, Any]]:
        """A device sample of ``host`` arrived after the steps it explains were judged
        (telemetry delivered late, e.g. replayed): a rank or host incident whose root cause
        is still ``unknown``, open or resolved since (the fault may end before its late
        samples come; up to ``UNEXPLAINED_MAX`` of those are kept, each until its window's
        samples all came), with its culprit on ``host``, is attributed again once
        the late samples reach the moment it was detected (what its judge would have seen
        on time), then every ``RECHECK_S`` of sample time while the cause stays unknown.
        A cause found is an incident update at ``now`` (event time), and is kept (a known
        cause outvotes ``unknown``, ``vote_cause``). ``job_hosts(job_id)``: the hosts of the
        job, its culprit's peers. Same input order, same output: offline and in the stream."""
        out: list[dict[str, Any]] = []
        kept = getattr(self, "unexplained", None) or {}
        todo = [(job_id, inc, False) for (job_id, _), inc in sorted(self.open.items())]
        todo += [(job_id, inc, True) for job_id, inc in kept.values()]
        for job_id, inc, resolved in todo:
            ev = inc.event
            where = getattr(inc, "where", None)     # None: restored from an older snapshot
            if (ev["root_cause"] != "unknown" or where is None or host not in where[0]
                    or ev["fault"] not in LATE_FAULTS
                    or sample_ts < max(inc.recheck, ev["detected_ts"] - RECHECK_S)):
                continue
            inc.recheck = sample_ts + RECHECK_S
            hosts, gpus, data_share = where
            peers = set(job_hosts(job_id)) or {h for h, _ in store.gpus} | set(store.hosts)
            cause, rc_ev = attribute(ev["fault"], store, hosts, gpus, peers, data_share)
            if cause == "unknown":
                if resolved and sample_ts > ev["resolved_ts"] + RECHECK_S:
                    del kept[ev["incident_id"]]    # its whole window came: nothing to add
                continue
            inc.causes[cause] = inc.causes.get(cause, 0) + 1
            ts = max(float(now), ev["ts"])
            evidence = dict(ev.get("evidence") or {}, root_cause=rc_ev,
                            root_cause_from="late telemetry")
            ev.update(ts=ts, root_cause=cause, evidence=evidence)
            if resolved:
                del kept[ev["incident_id"]]
            elif inc.emitted:
                inc.emitted = dict(inc.emitted, root_cause=cause, ts=ts)
            out.append(dict(ev))
        return out

    def end_job(self, job_id: str, ts: float) -> list[dict[str, Any]]:
        """The job ended (no events for a while, or the end of the input): resolve its
        open incidents at ``ts`` with ``resolved_reason`` "job ended", and forget it."""
        out = []
        for k in sorted(k for k in self.open if k[0] == job_id):
            inc = self.open.pop(k)
            ts = max(float(ts), inc.event["ts"])
            evidence = dict(inc.event.get("evidence") or {}, resolved_reason=JOB_ENDED)
            ev = dict(inc.event, ts=ts, status="resolved", resolved_ts=ts,
                      resolved_reason=JOB_ENDED, evidence=evidence)
            self._unexplained(job_id, inc, ev)
            out.append(ev)
        prefix = f"{job_id}:"
        for iid in [i for i in self.reopened if i.startswith(prefix)
                    and i[len(prefix):].split(":", 1)[0] in FAULTS]:
            del self.reopened[iid]
        getattr(self, "ends", {}).pop(job_id, None)
        return out

    def _fill(self, inc: Incident, f: Finding, cause: str, action: str, why: str,
              rc_ev: dict, pct: float, ts: float, fast: bool = False) -> bool:
        """Refresh the incident's fields; True when the change deserves an update event."""
        ev = inc.event
        last = inc.emitted
        # Escalation only: a mitigation once recommended stays until a stronger one.
        if last and LADDER.index(action) < LADDER.index(last["mitigation"]):
            action = last["mitigation"]
        sustained = f.evidence.get("sustained_s", 0.0) >= getattr(self, "page_after_s", 2.0)
        sev = self.severity(f.fault, pct, cause) \
            if inc.age >= self.page_after_steps or sustained or fast else "info"
        if f.imbalance or pct < self.open_min_pct or action == "ignore":
            # The layout, or a slowdown the planner would ignore: recorded, never paged.
            # (A paged incident's mitigation never falls back to ignore: the ladder above.)
            sev = "info"
        if SEVERITY_RANK[sev] < SEVERITY_RANK[ev["severity"]]:
            sev = ev["severity"]
        prev = last.get("slowdown_pct", pct)
        # A page (a new severity) goes out at once; other changes at most once per
        # min_update_s of event time, so a noisy estimate does not flood the channel.
        changed = (not last or sev != last.get("severity")
                   or ts - last.get("ts", -1e300) >= self.min_update_s
                   and (cause != last.get("root_cause") or action != last.get("mitigation")
                        or abs(pct - prev) > max(0.5 * prev, 5.0)))
        extra: dict[str, Any] = {"root_cause": rc_ev, "mitigation_reason": why}
        lost_s = f.lost_s
        if lost_s is None and f.fault == "slow_link":
            lost_s = self._link_lost(inc, f, ts)
        world = f.world or int(f.evidence.get("world_size") or 0)
        if lost_s is not None:
            extra["lost_s"] = round(lost_s, 3)
            if world:
                extra["gpu_hours_lost"] = round(world * lost_s / 3600.0, 6)
        ev.update(ts=ts, severity=sev, slowdown_pct=pct, root_cause=cause, mitigation=action,
                  evidence={**f.evidence, **extra})
        inc.where = (list(f.hosts), list(f.gpus), float(f.data_share))
        if "gpu_hours_lost" in extra:      # CONTRACT.md: top-level, current with every change
            ev["gpu_hours_lost"] = extra["gpu_hours_lost"]
        if changed:
            inc.emitted = {"severity": sev, "root_cause": cause, "mitigation": action,
                           "slowdown_pct": pct, "ts": ts}
        return changed

    @staticmethod
    def _link_lost(inc: Incident, f: Finding, ts: float) -> float:
        """A slow link's job seconds lost so far, priced as a rank's are: from real elapsed
        time, each stretch of it (since the onset, then since the previous step the link
        was seen) slower by ``slowdown_pct``, so ``slowdown / (1 + slowdown)`` of it is
        extra (a step of ``(1 + s) x base`` seconds loses ``s x base``)."""
        # getattr: incidents restored from a snapshot taken before these slots existed
        since = getattr(inc, "lost_ts", None)
        if since is None:
            since = float(f.onset_ts)
        share = max(f.slowdown_pct, 0.0) / (100.0 + max(f.slowdown_pct, 0.0))
        inc.lost_s = getattr(inc, "lost_s", 0.0) + max(ts - since, 0.0) * share
        inc.lost_ts = max(ts, since)
        return inc.lost_s
