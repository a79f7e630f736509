"""The arbiter: turns the signals of each judged step (``Finding``) into CONTRACT
``incident`` events, in one place (docs/detection.md, "The paging policy").

- **Open**: a confirmed signal about a culprit at least ``open_min_pct`` slower than its
  reference, in a step where it is that slow (a link no NIC counter explains also needs
  to cost the job that much). Id ``{job_id}:{fault}:{culprit}:{onset_step}`` (replays
  and restarts give the same id; ``.N`` when the same culprit and onset come back after
  a resolve). Two signals about one culprit (a steady-imbalance record and a rank
  verdict on the same rank, two rules at once) are one incident (``culprit_key``).
- **Severity**: ``models.policy.PagingPolicy``, from persistence (slowed steps and their
  seconds, or in-step evidence in long steps) and cost (GPU-hours lost, or the
  slowdown times how long it lasted), never from the size of the first excess; it never
  goes down while open. Every event says why: ``evidence.rule`` (the signal that
  confirmed it, or made it loud), ``evidence.policy`` (the reason for its severity),
  ``evidence.signals`` (every signal seen about it).
- **Update**: a new severity at once; otherwise at most once per ``min_update_s`` a new
  cause, mitigation, slowdown, or cost grown ``cost_update_ratio`` times (never a page:
  the router notifies severity rises only).
- **Resolve**: after ``resolve_steps`` steps in a row with the culprit back among its
  peers (absent, unconfirmed, or below ``back_pct``), plus ``flap_steps`` per time it
  came back, at most ``resolve_max_steps``: a flapping culprit stays one incident.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from failslow.models.config import CauseConfig
from failslow.models.findings import Finding
from failslow.models.policy import PagingPolicy, Persistence, PolicyConfig
from failslow.models.rootcause import attribute
from failslow.models.telemetry import TelemetryStore
from failslow.schema.events import FAULTS, MITIGATIONS, SEVERITY_RANK

LADDER = MITIGATIONS
JOB_ENDED = "job ended"
# Resolved incidents still waiting for late telemetry to explain them, at most (oldest go).
UNEXPLAINED_MAX = 1024
LATE_FAULTS = ("slow_rank", "slow_host")
ENDS_N = 33   # step ends kept per job at least (evidence windows span at most 32; more when
#               [policy] period_steps or open_steps_max ask for more: ``period``)


class Incident:
    """An open incident: its last emitted event and what drives its updates."""

    __slots__ = ("event", "absent", "age", "causes", "emitted", "lost_s", "lost_ts", "where",
                 "recheck", "last_rel", "steps", "seconds", "rule", "signals", "returns",
                 "cost_sent", "gap", "level", "level_n", "cost_level")

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        self.lost_s = 0.0         # a link's job seconds lost so far (``_link_lost``)
        self.lost_ts: float | None = None
        # (hosts, gpus, data share) of the culprit as last seen: what a late sample
        # re-attributes with (``IncidentTracker.late_sample``)
        self.where: tuple[list[str], list[tuple[str, int]], float] = ([], [], 0.0)
        self.recheck = -1e300     # a late sample before this ts re-attributes nothing
        self.absent = 0           # steps in a row the culprit was back among its peers
        self.age = 0              # steps the culprit was present since the incident opened
        self.causes: dict[str, int] = {}
        self.emitted: dict[str, Any] = {}
        self.last_rel = 0.0       # the culprit's step excess at its last confirmation
        self.steps = 0            # slowed steps so far (``models.policy.Persistence``)
        self.seconds = 0.0        # and their seconds
        self.rule = ""            # the signal that confirmed it (or made it loud)
        self.signals: set[str] = set()   # every signal seen about the culprit
        self.returns = 0          # times it came back after being back among its peers
        self.cost_sent = 0.0      # gpu_hours_lost in the last emitted event
        self.gap = 0              # the longest absence it came back after (its flapping)
        self.level = 0.0          # its mean step excess (fraction) over its slowed steps
        self.level_n = 0
        self.cost_level = 0.0     # and the job's mean slowdown (%) over them


def _period(ends: list[float], n: int) -> float:
    """A job's step period: the median gap between its last ``n + 1`` step ends (0 while
    unknown)."""
    last = ends[-n - 1:]
    gaps = sorted(b - a for a, b in zip(last[:-1], last[1:], strict=True))
    return gaps[len(gaps) // 2] if gaps else 0.0


def culprit_key(f: Finding) -> str:
    """One incident per culprit: a steady imbalance of a rank and a rank verdict about the
    same rank are two signals about one culprit."""
    if f.imbalance and f.key.startswith("imbalance:"):
        return f"{f.fault}:{f.key.split(':', 1)[1]}"
    return f.key


class IncidentTracker:
    """The arbiter: opens, grades, updates and resolves the incidents of every job from
    their findings (signals), by ``models.policy.PagingPolicy``.

    ``policy``: the default ``PolicyConfig``; ``policy_for(job_id)``: a job's own (per-job
    overrides, ``models.detection_config``); keyword overrides set fields of the default
    (``IncidentTracker(resolve_steps=3)``)."""

    def __init__(self, policy: PolicyConfig | None = None,
                 policy_for: Callable[[str], PolicyConfig] | None = None,
                 **overrides: Any) -> None:
        base = policy or PolicyConfig()
        if overrides:
            base = replace(base, **overrides)
        base.check()
        self.policy = base
        self.policy_for = policy_for
        self.open: dict[tuple[str, str], Incident] = {}
        self.reopened: dict[str, int] = {}    # incident id -> times it was opened again
        # incident id -> (job, incident as resolved): resolved with root cause unknown, whose
        # culprit's late telemetry may still come (``late_sample``)
        self.unexplained: dict[str, tuple[str, Incident]] = {}
        # job -> the ends (ts) of its last ENDS_N steps: how many steps evidence spans
        self.ends: dict[str, list[float]] = {}
        # (job, culprit) -> its gap to its peers when first recorded as steady imbalance
        self.steady_gap: dict[tuple[str, str], float] = {}
        # (job, culprit) -> its last incident resolved (resolved ts, mean step excess, mean
        # job slowdown %): a rule still remembering that episode (an onset before that
        # resolve) reopens nothing on a step that would have counted as faded in it (noise
        # about a recovered culprit, not a return)
        self.faded: dict[tuple[str, str], tuple[float, float, float]] = {}

    def cfg(self, job_id: str) -> PolicyConfig:
        return self.policy_for(job_id) if self.policy_for is not None else self.policy

    def period(self, job_id: str, ts: float) -> tuple[float, list[float]]:
        """Record a step of the job ending at ``ts``; returns its step period (the median
        gap between its last steps, 0 while unknown) and the ends of its last steps."""
        kept = self.ends
        ends = kept.get(job_id) or []
        if not ends or ts > ends[-1]:
            cfg = self.cfg(job_id)   # enough for the period and the open-step count
            ends = (ends + [ts])[-max(ENDS_N, cfg.period_steps + 1, cfg.open_steps_max + 1):]
            kept[job_id] = ends
            return _period(ends, cfg.period_steps), ends
        return _period(ends, self.cfg(job_id).period_steps), ends

    @staticmethod
    def _step_rel(f: Finding, lag_max: float) -> float:
        """The culprit's relative excess in the step at hand."""
        ev = f.evidence
        if "transfer_rel_slowdown" in ev:
            return float(ev["transfer_rel_slowdown"])
        if "rel_to_group" in ev:
            return float(ev["rel_to_group"])
        if "rel_to_peers" in ev or "rel_to_own_past" in ev:
            # a rank its group waits for: the lag charged to it (a share of the job's
            # step) is its excess, whatever its own work says (noisy under overlap)
            lag = min(float(ev.get("waited_lag_now") or 0.0), lag_max)
            return max(float(ev.get("rel_to_peers") or 0.0),
                       float(ev.get("rel_to_own_past") or 0.0), lag / (1.0 - lag))
        return f.own_pct / 100.0

    @classmethod
    def _back_rel(cls, f: Finding, lag_max: float) -> float:
        """The culprit's excess as judged for resolving: against the nearer of its
        references (its peers, its own past), so a rank back at its own usual resolves
        even when it always ran a little apart from its peers; a group still waiting for
        it keeps it."""
        ev = f.evidence
        if "rel_to_peers" in ev and "rel_to_own_past" in ev and "transfer_rel_slowdown" not in ev:
            lag = min(float(ev.get("waited_lag_now") or 0.0), lag_max)
            return max(min(float(ev["rel_to_peers"] or 0.0), float(ev["rel_to_own_past"] or 0.0)),
                       lag / (1.0 - lag))
        return cls._step_rel(f, lag_max)

    def vote_cause(self, job_id: str, key: str, cause: str) -> str:
        """Record this step's root cause; return the incident's most supported one."""
        inc = self.open.get((job_id, key.replace("imbalance:", "slow_rank:", 1)))
        if inc is None:
            return cause
        inc.causes[cause] = inc.causes.get(cause, 0) + 1
        known = {c: n for c, n in inc.causes.items() if c != "unknown"}
        pool = known or inc.causes
        return max(pool, key=lambda c: pool[c])

    def _signals(self, job_id: str, found: list[tuple[Finding, str, str, str, dict]]
                 ) -> dict[str, tuple[tuple[Finding, str, str, str, dict], set[str]]]:
        """The step's signals by culprit: the one that speaks for it (a confirmed verdict
        over a steady-imbalance record), and the names of all of them. Records the steady
        gap of a culprit the first time it is seen as imbalance."""
        by: dict[str, tuple[tuple[Finding, str, str, str, dict], set[str]]] = {}
        for item in found:
            f = item[0]
            key = culprit_key(f)
            if f.imbalance:
                self.steady_gap.setdefault((job_id, key), max(f.own_pct, 0.0) / 100.0)
            prev = by.get(key)
            rule = f.rule or f.fault
            if prev is None:
                by[key] = (item, {rule})
                continue
            prev[1].add(rule)
            g = prev[0][0]
            if (g.imbalance and not f.imbalance) or (not g.confirmed and f.confirmed):
                by[key] = (item, prev[1])
        return by

    def step(self, job_id: str, ts: float, found: list[tuple[Finding, str, str, str, dict]],
             sub: bool = False, step_s: float = 0.0) -> list[dict[str, Any]]:
        """Apply one evaluated step of a job. ``found`` holds (finding, root_cause,
        mitigation, mitigation reason, root-cause evidence); ``ts`` is the time of the
        newest event of the step. ``sub``: a judgement from windows inside a step that has
        not ended (``models.substep``): it opens and grades, but counts no step (neither
        slowed nor back among its peers). ``step_s``: the job's step time as its judge
        knows it, used until the tracker saw enough step ends to know the period itself.
        Returns the incident events to publish."""
        out: list[dict[str, Any]] = []
        seen = set()
        ts = float(ts)
        cfg = self.cfg(job_id)
        if sub:
            ends = self.ends.get(job_id) or []
            gap = _period(ends, cfg.period_steps)
        else:
            gap, ends = self.period(job_id, ts)
        gap = gap or max(float(step_s), 0.0)
        for key, (item, rules) in sorted(self._signals(job_id, found).items()):
            f, cause, action, why, rc_ev = item
            k = (job_id, key)
            inc = self.open.get(k)
            rel = self._step_rel(f, cfg.lag_max)
            slowed = f.confirmed and rel >= cfg.open_min_pct / 100.0
            x = rel if f.step_rel is None else f.step_rel
            pct = round(float(f.slowdown_pct), 2)
            if inc is None and (not slowed or f.own_pct < cfg.open_min_pct
                                or (f.fault == "slow_link" and cause == "unknown"
                                    and f.slowdown_pct < cfg.open_min_pct)
                                or self._remembered(k, f, x, pct, cfg)):
                continue
            seen.add(k)
            # its rule's score of this very step is under the bar and its excess a small
            # share of the episode's: the rule's memory (a CUSUM, a smoothed excess)
            # confirms it, the link itself is back (a rule without a score of the step:
            # its excess alone, a small share of the episode's, is a culprit back within
            # noise of its peers); or what it costs the job this step is a small share of
            # what the episode cost per step (a link's transfers still stand out now and
            # then, the job no longer waits for them)
            faded = (inc is not None and inc.level_n >= cfg.page_steps
                     and self._fading(f, x, pct, inc.level, inc.cost_level, cfg))
            fresh = inc is None
            if inc is None:
                inc = self._open(job_id, key, f, cause, ts, pct)
                # The confirmation rests on the steps since the onset, open_steps_max (2)
                # at most (a confirmation needs two steps of evidence; an onset estimated
                # early must not make a transient look persistent).
                since = float(f.onset_ts) + cfg.onset_margin * gap
                inc.steps = max(1, min(sum(1 for e in ends if e > since), cfg.open_steps_max))
                inc.seconds = inc.steps * gap
                inc.rule = f.rule or f.fault
            elif sub:
                inc.absent = 0 if slowed and not faded else inc.absent
            else:
                inc.age += 1
                steady = self.steady_gap.get(k)
                if slowed and steady is not None and (
                        f.imbalance or f.own_pct / 100.0 < PagingPolicy(cfg).need(steady)):
                    # the layout, as known since the start: present, not a slowdown that
                    # persists (until its gap grows past the margin)
                    inc.absent = 0
                elif slowed and not faded:
                    if inc.absent >= 2:
                        inc.returns += 1
                        inc.gap = max(inc.gap, inc.absent)
                    inc.absent = 0
                    inc.steps += 1
                    inc.seconds += gap
                elif faded or self._back_rel(f, cfg.lag_max) < cfg.back_pct / 100.0:
                    inc.absent += 1
                # else: weakly present (unconfirmed: a rule's memory of the episode, a
                # run's maximum) or slow under open_min_pct: neither slowed nor back
            inc.signals |= rules
            inc.last_rel = rel
            if slowed and not faded:
                inc.level_n += 1
                inc.level += (x - inc.level) / inc.level_n
                inc.cost_level += (pct - inc.cost_level) / inc.level_n
            in_step = not any(e > float(f.onset_ts) for e in ends) if sub else False
            if self._fill(job_id, key, inc, f, cause, action, why, rc_ev, pct, ts, cfg,
                          gap, in_step) or fresh:
                out.append(dict(inc.event))
        if sub:
            return out
        for k in [k for k in self.open if k[0] == job_id and k not in seen]:
            self.open[k].absent += 1
        for k in [k for k in self.open if k[0] == job_id]:
            inc = self.open[k]
            # a flapping culprit: longer than the longest absence it came back after
            need = min(max(cfg.resolve_steps, inc.gap + cfg.flap_steps) if inc.returns
                       else cfg.resolve_steps, cfg.resolve_max_steps)
            if inc.absent >= need:
                del self.open[k]
                if inc.level_n >= cfg.page_steps:
                    self.faded[k] = (ts, inc.level, inc.cost_level)
                ev = dict(inc.event, ts=ts, status="resolved", resolved_ts=ts)
                self._unexplained(job_id, inc, ev)
                out.append(ev)
        return out

    @staticmethod
    def _fading(f: Finding, x: float, pct: float, level: float, cost_level: float,
                cfg: PolicyConfig) -> bool:
        """Whether a step of the culprit (step excess ``x``, job slowdown ``pct``) is a
        small share of an episode's (mean excess ``level``, mean slowdown ``cost_level``)."""
        return (((f.step_z is None or f.step_z < cfg.present_z)
                 and x < cfg.fade_ratio * level) or pct < cfg.fade_ratio * cost_level)

    def _remembered(self, k: tuple[str, str], f: Finding, x: float, pct: float,
                    cfg: PolicyConfig) -> bool:
        """Whether ``f`` is its rule's memory of an episode resolved as faded (an onset
        before that resolve), on a step that would have counted as faded in it: no new
        incident."""
        past = self.faded.get(k)
        return (past is not None and float(f.onset_ts) < past[0]
                and self._fading(f, x, pct, past[1], past[2], cfg))

    def _open(self, job_id: str, key: str, f: Finding, cause: str, ts: float,
              pct: float) -> Incident:
        culprit = key.split(":", 1)[1]
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
        inc = self.open[(job_id, key)] = Incident(ev)
        inc.causes[cause] = 1
        return inc

    def late_pending(self) -> bool:
        """Whether a late device sample may change an incident (``late_sample``)."""
        return bool(self.open or self.unexplained)

    def _unexplained(self, job_id: str, inc: Incident, resolved: dict[str, Any]) -> None:
        """Keep a resolved incident whose root cause is unknown for its late telemetry."""
        if resolved.get("root_cause") != "unknown" or resolved["fault"] not in LATE_FAULTS:
            return
        kept = self.unexplained
        late = Incident(dict(resolved))      # a copy: the emitted event stays as sent
        late.where, late.recheck = inc.where, inc.recheck
        kept[resolved["incident_id"]] = (job_id, late)
        while len(kept) > UNEXPLAINED_MAX:
            del kept[next(iter(kept))]

    def late_sample(self, host: str, sample_ts: float, now: float, store: TelemetryStore,
                    job_hosts: Any, causes_for: Callable[[str], CauseConfig] | None = None
                    ) -> list[dict[str, Any]]:
        """A device sample of ``host`` arrived after the steps it explains were judged
        (telemetry delivered late, e.g. replayed): a rank or host incident whose root cause
        is still ``unknown``, open or resolved since (the fault may end before its late
        samples come; up to ``UNEXPLAINED_MAX`` of those are kept, each until its window's
        samples all came), with its culprit on ``host``, is attributed again once
        the late samples reach the moment it was detected (what its judge would have seen
        on time), then every ``recheck_s`` (``[policy]``) of sample time while the cause stays unknown.
        A cause found is an incident update at ``now`` (event time), and is kept (a known
        cause outvotes ``unknown``, ``vote_cause``). ``job_hosts(job_id)``: the hosts of the
        job, its culprit's peers; ``causes_for(job_id)``: the job's root-cause thresholds
        (``[rules.causes]``, the defaults without it). Same input order, same output:
        offline and in the stream."""
        out: list[dict[str, Any]] = []
        kept = self.unexplained
        todo = [(job_id, inc, False) for (job_id, _), inc in sorted(self.open.items())]
        todo += [(job_id, inc, True) for job_id, inc in kept.values()]
        for job_id, inc, resolved in todo:
            ev = inc.event
            where = inc.where
            if (ev["root_cause"] != "unknown" or host not in where[0]
                    or ev["fault"] not in LATE_FAULTS
                    or sample_ts < max(inc.recheck,
                                       ev["detected_ts"] - self.cfg(job_id).recheck_s)):
                continue
            recheck_s = self.cfg(job_id).recheck_s
            inc.recheck = sample_ts + recheck_s
            hosts, gpus, data_share = where
            peers = set(job_hosts(job_id)) or {h for h, _ in store.gpus} | set(store.hosts)
            cause, rc_ev = attribute(ev["fault"], store, hosts, gpus, peers, data_share,
                                     c=causes_for(job_id) if causes_for else None)
            if cause == "unknown":
                if resolved and sample_ts > ev["resolved_ts"] + recheck_s:
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
        self.ends.pop(job_id, None)
        for k in [k for k in self.faded if k[0] == job_id]:
            del self.faded[k]
        return out

    def _fill(self, job_id: str, key: str, inc: Incident, f: Finding, cause: str,
              action: str, why: str, rc_ev: dict, pct: float, ts: float, cfg: PolicyConfig,
              period_s: float, in_step: bool = False) -> bool:
        """Refresh the incident's fields and grade it (``PagingPolicy``); True when the
        change deserves an update event: a new severity (a page goes out at once), else at
        most once per ``min_update_s`` a new cause, mitigation, slowdown (by half or 5
        points) or cost (grown ``cost_update_ratio`` times; silent for the router)."""
        ev = inc.event
        last = inc.emitted
        # Escalation only: a mitigation once recommended stays until a stronger one.
        if last and LADDER.index(action) < LADDER.index(last["mitigation"]):
            action = last["mitigation"]
        extra: dict[str, Any] = {"root_cause": rc_ev, "mitigation_reason": why}
        lost_s = f.lost_s
        if lost_s is None and f.fault == "slow_link":
            lost_s = self._link_lost(inc, f, ts)
        world = f.world or int(f.evidence.get("world_size") or 0)
        gpu_h = 0.0
        before = (ev.get("evidence") or {}).get("lost_s")
        if lost_s is not None and before is not None:
            # what the episode cost so far never shrinks, whichever rule prices it now
            lost_s = max(lost_s, float(before))
        if lost_s is not None:
            extra["lost_s"] = round(lost_s, 3)
            if world:
                gpu_h = extra["gpu_hours_lost"] = round(world * lost_s / 3600.0, 6)
        quiet = None
        if f.fault == "job_slowdown":
            quiet = "no single culprit: never paged"
        elif f.fault == "slow_link" and cause == "unknown":
            # A link seen slower only in collective timings, with no NIC counter behind
            # it, is a suspicion: paths differ and queueing varies.
            quiet = "link slower in collective timings only, no NIC counter: a suspicion"
        elif pct < cfg.open_min_pct or action == "ignore":
            quiet = f"job +{pct:.1f}%: the planner would not act"
        gap_now = max(f.own_pct, 0.0) / 100.0
        steady = self.steady_gap.get((job_id, key))
        if f.imbalance:
            gap_now = steady if steady is not None else gap_now
        p = Persistence(inc.steps, inc.seconds, gpu_h, pct, period_s,
                        float(f.evidence.get("sustained_s") or 0.0), in_step, steady, gap_now)
        policy = PagingPolicy(cfg)
        sev, reason = policy.decide(p, quiet)
        if SEVERITY_RANK[sev] < SEVERITY_RANK[ev["severity"]]:
            sev, reason = ev["severity"], f"{reason}; kept {ev['severity']} while open"
        elif sev != ev["severity"] and not f.imbalance:
            inc.rule = f.rule or inc.rule      # the signal that made it loud
        prev = last.get("slowdown_pct", pct)
        changed = (not last or sev != last.get("severity")
                   or ts - last.get("ts", -math.inf) >= cfg.min_update_s
                   and (cause != last.get("root_cause") or action != last.get("mitigation")
                        or abs(pct - prev) > max(0.5 * prev, cfg.update_pct_points)
                        or gpu_h > 0 and gpu_h >= cfg.cost_update_ratio * inc.cost_sent))
        inc.rule = inc.rule or f.rule or f.fault
        extra["rule"] = inc.rule
        extra["policy"] = reason
        extra["signals"] = sorted(inc.signals)
        ev.update(ts=ts, severity=sev, slowdown_pct=pct, root_cause=cause, mitigation=action,
                  evidence={**f.evidence, **extra})
        inc.where = (list(f.hosts), list(f.gpus), float(f.data_share))
        if "gpu_hours_lost" in extra:      # CONTRACT.md: top-level, current with every change
            ev["gpu_hours_lost"] = extra["gpu_hours_lost"]
        for name in ("host", "peer_host", "peer_rank"):
            value = getattr(f, name)
            if value is not None and f.fault == "slow_link":
                ev[name] = value
        if changed:
            inc.emitted = {"severity": sev, "root_cause": cause, "mitigation": action,
                           "slowdown_pct": pct, "ts": ts}
            inc.cost_sent = gpu_h
        return changed

    @staticmethod
    def _link_lost(inc: Incident, f: Finding, ts: float) -> float:
        """A slow link's job seconds lost so far, priced as a rank's are: from real elapsed
        time, each stretch of it (since the onset, then since the previous step the link
        was seen) slower by ``slowdown_pct``, so ``slowdown / (1 + slowdown)`` of it is
        extra (a step of ``(1 + s) x base`` seconds loses ``s x base``)."""
        since = inc.lost_ts
        if since is None:
            since = float(f.onset_ts)
        share = max(f.slowdown_pct, 0.0) / (100.0 + max(f.slowdown_pct, 0.0))
        inc.lost_s = inc.lost_s + max(ts - since, 0.0) * share
        inc.lost_ts = max(ts, since)
        return inc.lost_s
