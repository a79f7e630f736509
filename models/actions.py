"""Closing the loop (issue 32): from a paged compute straggler to an ``action`` the job
applies, and back to equal shares when the culprit recovers.

Pure and synchronous, like the rest of ``models/``: the worker, ``bench/mitigate.py`` and
the tests feed it the same events.

* ``MitigationConfig``: who opted in. ``mode`` per job-id pattern (``off`` publishes
  nothing, ``suggest`` publishes dry runs only, ``auto`` applies), the floor on a rank's
  share, the action's lead and lifetime, the drain command or webhook. Loaded from the
  ``[mitigate]`` table of the detection config (``from_mapping``).
* ``plan_shares``: each data-parallel rank's fraction of the global batch from its
  measured time per sample, minimizing the slowest rank's share x time (shares in
  proportion to speed), no rank below ``floor`` x an equal share.
* ``whole_counts``: those fractions as whole samples (or micro-batches) of a global
  batch, the same on every rank (a pure function of its inputs).
* ``ActionPlanner``: incidents and step events in, ``action`` events out (one per
  incident at a time, refined on the new shares' own measurements; a rollback to equal
  shares when the incident resolves).

Why the rollback may follow the incident's resolve: the detector judges a rank's own
work per unit of its share (``models.job``: steps carry ``samples``), so a rebalance
that works does not make the culprit look like its peers; its incident stays open as
long as the fault does, and resolves when the rank is fast again per sample. (Judged
per step, it resolved 7 steps after the switch while the fault was still there, and a
rollback on that resolve brought the slowdown straight back: a flap.)

>>> plan_shares({0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0})
{0: 0.2857, 1: 0.2857, 2: 0.1429, 3: 0.2857}
>>> whole_counts({0: 0.2857, 1: 0.2857, 2: 0.1429, 3: 0.2857}, 64)
[19, 18, 9, 18]
"""

from __future__ import annotations

import fnmatch
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field, fields
from statistics import median, stdev
from typing import Any

from failslow.schema.errors import FailslowError

MODES = ("off", "suggest", "auto")
ACTION_TYPES = ("rebalance_microbatches", "drain_host")
ACTION_MODES = ("dry_run", "apply")
DRAIN_CAUSES = ("migrate_node", "checkpoint_restart")  # the ladder's rungs past rebalancing
PRUNE_EVERY = 4096  # rank-0 steps between two looks for ended jobs


class MitigationConfigError(FailslowError):
    """The ``[mitigate]`` table has an unknown key or a bad value (one line, names it)."""


@dataclass
class MitigationConfig:
    """The ``[mitigate]`` section of the detection config.

    mode: ``off`` | ``suggest`` | ``auto`` for jobs no pattern matches (default
    ``suggest``: dry runs only). jobs: job-id glob pattern -> mode, first match wins (in
    the table's order). steady: also act on a steady imbalance (a rank slow since the
    start, an ``info`` incident), never by default. floor: the least share a rank gets,
    as a fraction of an equal share (0.25: a quarter). warm_steps: no action in a job's
    first steps (compilation and caches make them noisy). min_gain: the culprit's time per
    sample must be at least this much above its peers' (0.2: 20 %) to act. window_steps:
    steps of time per sample the plan reads. persist_steps: an ``info`` (not paged)
    compute straggler gets its rebalance once its incident has stayed open this many
    steps (a transient never does) and its time per sample is ``min_gain`` slower.
    refine: refinements per incident that take more from the culprit (those that give it
    back are not bounded: they only undo): after ``window_steps`` steps on the new shares
    the plan is made again from the time per sample measured on them, and sent when it
    moves the culprit's share by ``refine_gain`` (15 %) or more of it and by ``refine_z``
    (3) standard errors of the planned share, measured on the window cut in blocks of
    ``window_steps / refine_blocks`` steps (the spread of the blocks' medians: load on
    shared cores comes in episodes of several steps; one window's noise swung the share
    +-30 %).
    lead_steps: ``apply_at_step`` is this many steps after the newest step seen (time for
    the action to reach every rank). ttl_s: an action not applied by ``ts + ttl_s`` is
    dropped. hold_steps: a job's steps reach the planner once an incident at or after
    them came, or once the job is this many steps further (past the detector's
    ``lag_steps``, 3: no incident comes for an older step after that), so a rollback
    comes at most that many steps late; stale_s: a job whose newest held step is this
    many event seconds older than the newest event has ended or stalled, its held steps
    go to the planner (memory stays bounded). refine_gain: the least move of the
    culprit's share, as a fraction of it, that a refinement sends (with refine_z);
    forget_s: the planner forgets a job silent this many event seconds (ended);
    effect_steps: rank 0's latest step times kept per job, whose median since an action
    applied is its measured effect (``job step 0.41 s -> 0.27 s``). drain_command: a
    command run once per escalation of a persistent hardware
    fault, ``{host}``, ``{job_id}``, ``{incident_id}``, ``{reason}`` substituted (e.g.
    ``scontrol update nodename={host} state=drain reason={reason}``); drain_webhook: a
    URL POSTed the action instead or as well. Neither set: drains are dry runs.

    >>> MitigationConfig.from_mapping({"mode": "off", "jobs": {"llm-*": "auto"}}).mode_for("llm-7")
    'auto'
    """

    mode: str = "suggest"
    jobs: dict[str, str] = field(default_factory=dict)
    steady: bool = False
    floor: float = 0.25
    min_gain: float = 0.20
    window_steps: int = 8
    warm_steps: int = 20
    persist_steps: int = 16
    refine: int = 5
    refine_z: float = 3.0
    refine_blocks: int = 2
    lead_steps: int = 2
    ttl_s: float = 120.0
    hold_steps: int = 4
    stale_s: float = 600.0
    refine_gain: float = 0.15
    forget_s: float = 3600.0
    effect_steps: int = 64
    drain_command: str | None = None
    drain_webhook: str | None = None

    def __post_init__(self) -> None:
        for where, mode in (("mode", self.mode), *((f"jobs.{k!r}", v)
                                                   for k, v in self.jobs.items())):
            if mode not in MODES:
                raise MitigationConfigError(
                    f"mitigate.{where}: {mode!r} is not one of {', '.join(MODES)}")
        if not 0.0 < self.floor <= 1.0:
            raise MitigationConfigError(f"mitigate.floor: {self.floor!r} is not in (0, 1]")
        for name in ("min_gain", "ttl_s", "stale_s", "refine_gain", "forget_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise MitigationConfigError(f"mitigate.{name}: {v!r} is not a positive number")
        for name in ("window_steps", "lead_steps", "warm_steps", "persist_steps",
                     "refine_blocks", "hold_steps", "effect_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MitigationConfigError(f"mitigate.{name}: {v!r} is not an integer >= 1")
        if not isinstance(self.refine, int) or isinstance(self.refine, bool) or self.refine < 0:
            raise MitigationConfigError(f"mitigate.refine: {self.refine!r} is not an integer >= 0")
        if isinstance(self.refine_z, bool) or not isinstance(self.refine_z, int | float) \
                or not math.isfinite(self.refine_z) or self.refine_z < 0:
            raise MitigationConfigError(f"mitigate.refine_z: {self.refine_z!r} is not a number >= 0")

    @classmethod
    def from_mapping(cls, table: dict[str, Any]) -> MitigationConfig:
        """Build from a parsed TOML ``[mitigate]`` table; MitigationConfigError (one line)
        on an unknown key or a value of the wrong type."""
        if not isinstance(table, dict):
            raise MitigationConfigError(f"mitigate: expected a table, got {table!r}")
        known = {f.name: f for f in fields(cls)}
        for key, value in table.items():
            if key not in known:
                raise MitigationConfigError(
                    f"mitigate: unknown key {key!r} (known: {', '.join(known)})")
            want = {"mode": str, "jobs": dict, "steady": bool, "drain_command": str,
                    "drain_webhook": str}.get(key)
            if want is not None and not isinstance(value, want):
                raise MitigationConfigError(
                    f"mitigate.{key}: {value!r} is not a {want.__name__}")
            if key in ("floor", "min_gain", "ttl_s", "refine_z", "stale_s", "refine_gain",
                       "forget_s") and (
                    isinstance(value, bool) or not isinstance(value, int | float)):
                raise MitigationConfigError(f"mitigate.{key}: {value!r} is not a number")
        return cls(**table)

    def mode_for(self, job_id: str) -> str:
        for pattern, mode in self.jobs.items():
            if fnmatch.fnmatchcase(job_id, pattern):
                return mode
        return self.mode


def plan_shares(per_sample_s: dict[int, float],
                floor: float = MitigationConfig.floor) -> dict[int, float]:
    """Fractions of the global batch (sum 1, 4 decimals) that equalize share x time per
    sample, the minimum of the slowest rank's share x time; no share below ``floor`` /
    ranks. Ranks without a positive finite time keep an equal share's speed (the median)."""
    ranks = sorted(per_sample_s)
    good = [t for t in per_sample_s.values() if t > 0 and math.isfinite(t)]
    typical = median(good) if good else 1.0
    speed = {r: 1.0 / (t if t > 0 and math.isfinite(t) else typical)
             for r, t in per_sample_s.items()}
    least = floor / len(ranks)
    fixed: dict[int, float] = {}
    # a rank held at the floor gives up its time; the rest share what is left by speed
    while True:
        free = [r for r in ranks if r not in fixed]
        left = 1.0 - sum(fixed.values())
        total = sum(speed[r] for r in free)
        shares = {r: left * speed[r] / total for r in free}
        low = [r for r in free if shares[r] < least]
        if not low:
            break
        fixed.update((r, least) for r in low)
    shares.update(fixed)
    return {r: round(shares[r], 4) for r in ranks}


def whole_counts(shares: dict[int, float] | list[float], global_batch: int,
                 floor: float = MitigationConfig.floor) -> list[int]:
    """Whole units (samples or micro-batches) of ``global_batch`` per rank, in rank order,
    summing to ``global_batch``: each unit goes where it raises the largest load
    (count / share, time per sample being proportional to 1 / share) least, ties to the
    lower rank; at least ``floor`` of an equal share (and at least 1) each. Deterministic:
    every rank computes the same counts. Raises ValueError when the batch is smaller than
    the ranks."""
    fr = [shares[r] for r in sorted(shares)] if isinstance(shares, dict) else list(shares)
    n = len(fr)
    if global_batch < n:
        raise ValueError(f"global batch {global_batch} is smaller than the {n} ranks")
    total = sum(fr) or 1.0
    fr = [max(f / total, 1e-9) for f in fr]
    least = max(1, math.ceil(floor * global_batch / n - 1e-9))
    counts = [max(least, math.floor(global_batch * f)) for f in fr]
    while sum(counts) < global_batch:
        i = min(range(n), key=lambda k: ((counts[k] + 1) / fr[k], k))
        counts[i] += 1
    while sum(counts) > global_batch:  # the floor overshot: take from the most loaded
        above = [k for k in range(n) if counts[k] > least] or list(range(n))
        i = max(above, key=lambda k: (counts[k] / fr[k], -k))
        counts[i] -= 1
    return counts


@dataclass
class _Held:
    """The action in effect for one incident (its shares), until the rollback."""

    incident_id: str
    rank: int
    action: dict[str, Any]
    refined: int = 0


class ActionPlanner:
    """Incidents and step events of many jobs in, ``action`` events out.

    ``observe(step_event)`` keeps each rank's recent time per sample
    (``compute_s / samples``; ``samples`` absent: one, equal shares) and the job's newest
    step; ``on_incident(incident)`` returns the actions the incident causes: a
    ``rebalance_microbatches`` for a paged compute straggler, a rollback to equal shares
    when the incident it answers resolves, a ``drain_host`` on an escalation. ``observe``
    itself returns the actions the steps cause: the rebalance of an ``info`` straggler
    whose incident persisted ``persist_steps`` steps, and the refinements (up to
    ``refine``: after ``window_steps`` steps on the new shares, the plan made again from
    the time per sample measured on them, sent when it moves the culprit's share by
    ``refine_gain`` of it or more; on shared cores, where a rank's wall time blurs with
    its peers', the first plan undershoots and this converges on equal compute per
    step). Nothing is planned in a job's first ``warm_steps``. Nothing is published for
    a job whose mode is ``off``; ``suggest`` marks every action ``dry_run`` (the job
    ignores those). ``now`` is the event time (seconds) the actions are stamped with: the
    newest event's, so replays give the same actions.
    """

    def __init__(self, config: MitigationConfig | None = None) -> None:
        self.config = config or MitigationConfig()
        self._observed = 0
        # job -> rank -> recent (step, compute_s / samples)
        self._per_sample: dict[str, dict[int, deque[tuple[int, float]]]] = defaultdict(dict)
        self._first: dict[str, int] = {}           # job -> the first step seen
        self._step_s: dict[str, deque[tuple[int, float]]] = {}  # job -> rank 0's (step, s)
        self._newest: dict[str, tuple[int, float]] = {}
        self._world: dict[str, int] = {}
        self._held: dict[str, _Held] = {}          # job -> the action in effect
        # job -> an open info straggler's incident and the step it was first seen
        self._waiting: dict[str, tuple[dict[str, Any], float]] = {}
        self._drained: set[str] = set()            # incidents whose drain went out
        self._version: dict[str, int] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a planner pickled before persist_steps and refinements (a worker's snapshot)
        state.setdefault("_waiting", {})
        self.__dict__.update(state)

    # -- measurement ---------------------------------------------------------------------------

    def observe(self, ev: dict[str, Any]) -> list[dict[str, Any]]:
        job, rank = ev["job_id"], ev["rank"]
        compute = ev.get("compute_s")
        if compute is None:
            compute = ev["duration_s"] - (ev.get("comm_s") or 0.0) - (ev.get("data_s") or 0.0)
        samples = ev.get("samples") or 1
        step = ev["step"]
        # enough for the window, and for a window on new shares past their lead
        keep = 2 * self.config.window_steps + self.config.lead_steps
        per = self._per_sample[job].setdefault(rank, deque(maxlen=keep))
        per.append((step, max(compute, 0.0) / samples))
        self._world[job] = ev["world_size"]
        self._first.setdefault(job, step)
        old = self._newest.get(job)
        if old is None or step > old[0]:
            self._newest[job] = (step, ev["ts"])
        if rank == 0:
            self._step_s.setdefault(job, deque(maxlen=self.config.effect_steps)).append(
                (step, ev["duration_s"]))
            self._observed += 1
            if self._observed % PRUNE_EVERY == 0:
                self._prune(ev["ts"])
        held = self._held.get(job)
        if held is not None:
            return self._maybe_refine(job, held)
        waiting = self._waiting.get(job)
        if waiting is not None and rank == waiting[0]["rank"]:
            return self._maybe_persisted(job)
        return []

    def _prune(self, now: float) -> None:
        """Forget jobs silent for ``forget_s`` (ended): the planner's memory stays bounded."""
        for job in [j for j, (_, ts) in self._newest.items() if ts < now - self.config.forget_s]:
            for table in (self._per_sample, self._step_s, self._newest, self._world,
                          self._held, self._version, self._first, self._waiting):
                table.pop(job, None)

    def _window(self, job: str, since: int | None, n: int | None
                ) -> dict[int, list[float]]:
        """Each rank's time per sample (``compute_s / samples``) over its last ``n``
        (``window_steps``) steps (those from step ``since`` on, when given)."""
        out = {}
        for r, d in self._per_sample[job].items():
            vals = [v for s, v in d if since is None or s >= since]
            if vals:
                out[r] = vals[-(n or self.config.window_steps):]
        return out

    def per_sample(self, job: str, since: int | None = None, n: int | None = None
                   ) -> dict[int, float]:
        """Each rank's median time per sample over its last ``n`` (``window_steps``) steps
        (those from step ``since`` on, when given)."""
        return {r: median(v) for r, v in self._window(job, since, n).items()}

    def _share_se(self, job: str, rank: int, since: int, n: int) -> float:
        """The relative standard error of ``rank``'s planned share from the window: its
        median time per sample's and its peers' typical one's, combined."""
        se = {}
        k = max(1, self.config.window_steps // self.config.refine_blocks)
        for r, vals in self._window(job, since, n).items():
            m = median(vals)
            # the medians of blocks of k steps: load on shared cores comes in episodes of
            # several steps, which one step's spread does not see
            blocks = [median(vals[i:i + k]) for i in range(0, len(vals) - k + 1, k)]
            se[r] = stdev(blocks) / m / math.sqrt(len(blocks)) \
                if m > 0 and len(blocks) > 1 else 0.0
        peers = [v for r, v in se.items() if r != rank]
        return math.hypot(se.get(rank, 0.0), median(peers) if peers else 0.0)

    def _gain(self, job: str, rank: int, since: int | None = None) -> float | None:
        per = self.per_sample(job, since)
        peers = [t for r, t in per.items() if r != rank]
        if rank not in per or not peers or median(peers) <= 0:
            return None
        return per[rank] / median(peers) - 1.0

    # -- decisions ------------------------------------------------------------------------------

    def on_incident(self, inc: dict[str, Any]) -> list[dict[str, Any]]:
        job = inc["job_id"]
        mode = self.config.mode_for(job)
        if mode == "off":
            return []
        out = []
        if inc.get("mitigation") in DRAIN_CAUSES and inc["status"] == "open" \
                and inc.get("host") and inc["incident_id"] not in self._drained:
            self._drained.add(inc["incident_id"])
            out.append(self._drain(inc, mode))
        held = self._held.get(job)
        if held is not None and inc["status"] != "open" \
                and inc["incident_id"] == held.incident_id:
            out.append(self._rollback(job, held))
            return out
        waiting = self._waiting.get(job)
        if waiting is not None and waiting[0]["incident_id"] == inc["incident_id"]:
            if inc["status"] != "open":
                del self._waiting[job]
            else:
                self._waiting[job] = (inc, waiting[1])
        want = self._wants_rebalance(inc)
        if want == "persist" and held is None and job not in self._waiting:
            self._waiting[job] = (inc, self._newest.get(job, (0, 0.0))[0])
        if want == "now" and held is None:
            action = self._rebalance(inc, mode)
            if action is not None:
                out.append(action)
        return out

    def _wants_rebalance(self, inc: dict[str, Any]) -> str | None:
        """``now``: a paged compute straggler (the policy confirmed it persists); ``persist``:
        an ``info`` one, acted on once its incident stayed open ``persist_steps`` steps;
        None: nothing to rebalance (a transient that resolves first never gets one)."""
        if not (inc["status"] == "open" and inc.get("mitigation") == "rebalance_microbatches"
                and inc["fault"] == "slow_rank" and inc.get("rank") is not None):
            return None
        if (inc.get("evidence") or {}).get("imbalance"):
            # the layout, not a fault: only when opted into
            return "now" if self.config.steady else None
        return "now" if inc["severity"] in ("warning", "critical") else "persist"

    def _maybe_persisted(self, job: str) -> list[dict[str, Any]]:
        inc, since = self._waiting[job]
        if self._newest[job][0] - since < self.config.persist_steps:
            return []
        mode = self.config.mode_for(job)
        action = self._rebalance(inc, mode, f"open {self.config.persist_steps} steps")
        if action is None:
            return []  # not slower per sample (yet): looked at again next step
        if job in self._waiting:  # a dry run: one per incident, not one per persist_steps
            self._waiting[job] = (inc, math.inf)
        return [action]

    def _rebalance(self, inc: dict[str, Any], mode: str, why: str = "paged"
                   ) -> dict[str, Any] | None:
        job, rank = inc["job_id"], int(inc["rank"])
        newest = self._newest.get(job, (0, 0.0))[0]
        if newest - self._first.get(job, newest) < self.config.warm_steps:
            return None  # the job's first steps (compilation, caches) say nothing of speed
        if mode == "off":
            return None
        gain = self._gain(job, rank)
        if gain is None or gain < self.config.min_gain:
            return None  # the rank's own work is not slower per sample: nothing to move
        shares = plan_shares(self.per_sample(job), self.config.floor)
        equal = 1.0 / len(shares)
        less = 100.0 * (1.0 - shares[rank] / equal)
        reason = (f"rank {rank} takes {less:.0f}% less: {100 * gain:.0f}% slower per sample "
                  f"than its peers, {why} ({inc['incident_id']})")
        action = self._action(job, inc["incident_id"], "rebalance_microbatches",
                              "apply" if mode == "auto" else "dry_run", shares, reason)
        action["rank"] = rank
        recent = list(self._step_s.get(job, ()))[-self.config.window_steps:]
        if recent:
            action["step_s_before"] = round(median(s for _, s in recent), 4)
        if mode == "auto":
            self._held[job] = _Held(inc["incident_id"], rank, action)
            self._waiting.pop(job, None)
        return action

    def _maybe_refine(self, job: str, held: _Held) -> list[dict[str, Any]]:
        """The plan made again from the steps on the shares in force (at least
        ``window_steps`` of them, every rank, up to twice that: on shared cores one window
        swings): sent when it moves the culprit's share by ``refine_gain``."""
        if self.config.refine == 0:
            return []
        since = held.action["apply_at_step"]
        world = self._world[job]
        ranks = self._per_sample[job]
        if len(ranks) < world or any(
                sum(1 for s, _ in ranks[r] if s >= since) < self.config.window_steps
                for r in range(world) if r in ranks):
            return []
        n = 2 * self.config.window_steps
        per = self.per_sample(job, since, n)
        shares = plan_shares(per, self.config.floor)
        old = held.action["shares"]
        if len(shares) != len(old):
            return []
        # a move within the window's own noise is no news: on shared cores one window's
        # noise swung the culprit's share +-30 %
        band = max(self.config.refine_gain, self.config.refine_z * self._share_se(job, held.rank,
                                                                          since, n))
        if abs(shares[held.rank] - old[held.rank]) < band * old[held.rank]:
            return []
        # the bound holds for moves that take more from the culprit; one that gives it
        # back (it recovered, or the last move overshot) only undoes, so it always may
        if shares[held.rank] < old[held.rank] and held.refined >= self.config.refine:
            return []
        equal = 1.0 / len(shares)
        less = 100.0 * (1.0 - shares[held.rank] / equal)
        reason = (f"refined: rank {held.rank} takes {less:.0f}% less (was "
                  f"{100.0 * (1.0 - old[held.rank] / equal):.0f}%): time per sample on the "
                  f"new shares ({held.incident_id})")
        action = self._action(job, held.incident_id, "rebalance_microbatches", "apply",
                              shares, reason)
        action["rank"] = held.rank
        if "step_s_before" in held.action:
            action["step_s_before"] = held.action["step_s_before"]
        held.action, held.refined = action, held.refined + 1
        return [action]

    def _rollback(self, job: str, held: _Held) -> dict[str, Any]:
        effect = self.effect(job)  # what the rebalance did, said once more in the audit
        del self._held[job]
        world = self._world.get(job, len(held.action["shares"]))
        shares = {r: round(1.0 / world, 4) for r in range(world)}
        action = self._action(job, held.incident_id, "rebalance_microbatches", "apply", shares,
                              f"rollback: incident resolved, rank {held.rank} back among its "
                              f"peers; equal shares again; what it did: {effect}")
        action["rank"], action["rollback"] = held.rank, True
        return action

    def _drain(self, inc: dict[str, Any], mode: str) -> dict[str, Any]:
        configured = self.config.drain_command or self.config.drain_webhook
        act_mode = "apply" if mode == "auto" and configured else "dry_run"
        reason = (f"{inc.get('mitigation')}: {inc.get('root_cause') or 'unknown'} on "
                  f"{inc['host']} ({inc['incident_id']})")
        action = self._action(inc["job_id"], inc["incident_id"], "drain_host", act_mode, {},
                              reason)
        action["host"] = inc["host"]
        return action

    def _action(self, job: str, incident_id: str, kind: str, act_mode: str,
                shares: dict[int, float], reason: str) -> dict[str, Any]:
        step, ts = self._newest.get(job, (0, 0.0))
        # versions only grow per job: the ranks agree on the newest they all hold
        version = max(self._version.get(job, 0) + 1, int(ts * 1000))
        self._version[job] = version
        return {"v": 1, "kind": "action", "ts": ts, "action_id": f"{job}:{version}",
                "job_id": job, "incident_id": incident_id, "type": kind,
                "mode": act_mode,
                "apply_at_step": step + self.config.lead_steps,
                "expires_ts": ts + self.config.ttl_s, "version": version,
                "shares": [shares[r] for r in sorted(shares)], "reason": reason}

    def effect(self, job: str) -> str | None:
        """What the rebalance in effect did, for people: ``rebalanced: rank 2 takes 31%
        less; job step 0.41 s -> 0.27 s`` (rank 0's median step since ``apply_at_step``);
        None when none holds."""
        h = self._held.get(job)
        if h is None:
            return None
        a = h.action
        equal = 1.0 / len(a["shares"])
        text = f"rebalanced: rank {h.rank} takes {100 * (1 - a['shares'][h.rank] / equal):.0f}% less"
        after = [s for step, s in self._step_s.get(job, ()) if step >= a["apply_at_step"]]
        if a.get("step_s_before") is not None and after:
            text += f"; job step {a['step_s_before']:.2f} s -> {median(after):.2f} s"
        return text

    def held(self, job: str) -> dict[str, Any] | None:
        """The rebalance in effect for a job (None: equal shares)."""
        h = self._held.get(job)
        return h.action if h else None
