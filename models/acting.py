"""A detector that also plans actions (issue 32): the stream worker's detector, wrapped.

``ActingDetector`` hands every batch to the detector it wraps and the step events and
the incidents that come out to a ``models.actions.ActionPlanner`` (each incident after
the steps up to its ts only, whatever the batches); it returns the incident events
followed by the ``action`` events (the worker sends each kind to its own topic).
Each incident event says what was done about it in ``evidence.action`` (the action it
caused, or the measured effect of the rebalance in force: "rebalanced: rank 2 takes 31%
less; job step 0.41 s -> 0.27 s"), which the Slack / PagerDuty text and the report page
show. Everything else (counters, settings, ``flush``, ``end_jobs``) is the wrapped detector's,
and its state is the wrapped detector's state plus the planner's, so a restored worker
still knows which actions hold and rolls them back. Pure, no I/O.

>>> from failslow.models.pipeline import Detector
>>> det = ActingDetector(Detector(), ActionPlanner(MitigationConfig(mode="auto")))
>>> det.process_batch([])
[]
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable, Iterable
from typing import Any, cast

from failslow.models.actions import ActionPlanner, MitigationConfig
from failslow.schema.batches import rows_fields

# settings the worker sets on its detector after a restore (streams/detector.py)
_FORWARDED = ("telemetry_delay_s", "job_idle_s")
# The planner reads a job's steps only up to the incident it answers (by ts), so what it
# plans does not depend on how the events were batched: `failslow detect` (one file) and
# the worker (one Kafka message at a time) annotate the same incident the same way (see
# the [mitigate] hold_steps and stale_s, ``MitigationConfig``).
_STEP_FIELDS = ("kind", "ts", "job_id", "rank", "world_size", "step", "duration_s",
                "compute_s", "comm_s", "data_s", "samples")


def _order(ev: dict[str, Any]) -> tuple[float, int]:
    return ev["ts"], ev["rank"]


def _newest(ts: Any) -> float:
    """An event's ts; a batch's (one ts per row) newest."""
    return max(ts) if type(ts) is list else ts


class ActingDetector:
    """``inner``: any stream detector (``process_batch``, ``state_dict``); ``planner``: the
    ActionPlanner its incidents feed; ``held``: steps not yet planned on (a snapshot's).

    A step is held until an incident of its job at or after its ts, or until its job is
    ``hold_steps`` steps further (past the detector's ``lag_steps``, 3: no incident comes
    for an older step after that), so a rollback comes at most that many steps late. A
    job whose newest held step is ``stale_s`` (event s) older than the newest event has
    ended or stalled: its held steps go to the planner, memory stays bounded. Both are
    the planner's ``[mitigate]`` settings (``MitigationConfig``)."""

    def __init__(self, inner: Any, planner: ActionPlanner,
                 held: dict[str, list[dict[str, Any]]] | None = None) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "planner", planner)
        object.__setattr__(self, "hold_steps", planner.config.hold_steps)
        object.__setattr__(self, "stale_s", planner.config.stale_s)
        # step events not yet handed to the planner, per job (see hold_steps)
        object.__setattr__(self, "held", held or {})
        object.__setattr__(self, "_newest", {j: max(ev["step"] for ev in evs)
                                              for j, evs in self.held.items() if evs})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FORWARDED:
            setattr(self.inner, name, value)
        else:
            object.__setattr__(self, name, value)

    def process_batch(self, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        events = list(events)
        incidents = self.inner.process_batch(events)
        # A job cut into shards is judged on several partitions, each seeing its own
        # ranks' steps: no partition can plan the job's shares, so none does (nor detect)
        shard = getattr(self.inner, "shard_ranks", None)
        for ev in events:
            kind = ev.get("kind")
            if kind == "step" and (shard is None or ev["world_size"] <= shard):
                self._hold(ev)
            elif kind == "step_batch":      # a host's steps: its rows, from the columns
                for row in rows_fields(ev, _STEP_FIELDS):
                    if shard is None or row["world_size"] <= shard:
                        self._hold(row)
        actions = self._on_incidents(incidents)
        now = max((_newest(ev["ts"]) for ev in events if "ts" in ev), default=None)
        for job in list(self.held):
            stale = now is not None and self.held[job][-1]["ts"] < now - self.stale_s
            hold = 0 if stale else self.hold_steps
            actions += self._release(job, step=self._newest[job] - hold)
        return [*incidents, *actions]

    def flush(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        incidents = self.inner.flush(*args, **kwargs)
        return [*incidents, *self._on_incidents(incidents)]

    def end_jobs(self) -> list[dict[str, Any]]:
        incidents = self.inner.end_jobs()
        return [*incidents, *self._on_incidents(incidents)]

    def _hold(self, ev: dict[str, Any]) -> None:
        job, step = ev["job_id"], ev["step"]
        self.held.setdefault(job, []).append({k: ev[k] for k in _STEP_FIELDS if k in ev})
        if step > self._newest.get(job, -1):
            self._newest[job] = step

    def _on_incidents(self, incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each incident planned on the steps up to its own time, whatever the batches."""
        actions: list[dict[str, Any]] = []
        for inc in incidents:
            if inc.get("kind", "incident") != "incident":
                continue
            actions += self._release(inc["job_id"], ts=inc["ts"])
            new = self.planner.on_incident(inc)
            actions += new
            self._annotate(inc, new)
        return actions

    def _release(self, job: str, ts: float | None = None, step: int | None = None
                 ) -> list[dict[str, Any]]:
        """Hand the planner the held steps of ``job`` up to ``ts`` or ``step``, in (ts,
        rank) order; returns the actions (rollbacks) they cause."""
        held = self.held.get(job)
        if not held:
            return []
        go: list[dict[str, Any]] = []
        keep: list[dict[str, Any]] = []
        for ev in held:
            due = ev["ts"] <= ts if ts is not None else ev["step"] <= cast(int, step)
            (go if due else keep).append(ev)
        if not go:
            return []
        if keep:
            self.held[job] = keep
        else:
            del self.held[job]
            del self._newest[job]
        actions: list[dict[str, Any]] = []
        for ev in sorted(go, key=_order):
            actions += self.planner.observe(ev)
        return actions

    def _annotate(self, inc: dict[str, Any], new: list[dict[str, Any]]) -> None:
        """The incident says what was done about it (``evidence.action``): the action it
        caused now, or the effect of the rebalance that holds for it."""
        done = next((f"{a['mode']} {a['type']}: {a['reason']}" for a in new), None)
        if done is None:
            held = self.planner.held(inc["job_id"])
            if held is not None and held["incident_id"] == inc["incident_id"]:
                done = self.planner.effect(inc["job_id"])
        if done is not None:
            inc["evidence"] = {**(inc.get("evidence") or {}), "action": done}

    def state_dict(self) -> dict[str, Any]:
        """JSON-able, like the wrapped detector's: the planner pickled, base64."""
        blob = pickle.dumps(self.planner, protocol=pickle.HIGHEST_PROTOCOL)
        return {"acting": 1, "inner": self.inner.state_dict(),
                "planner": base64.b64encode(blob).decode("ascii"), "held": self.held}

    @classmethod
    def restore(cls, state: Any, inner_restore: Callable[[Any], Any],
                config: MitigationConfig) -> ActingDetector:
        """From ``state_dict()``, or from a bare detector state (a snapshot taken before
        the worker acted: a fresh planner). The planner takes ``config``, the current one."""
        if isinstance(state, dict) and state.get("acting") == 1:
            planner = pickle.loads(base64.b64decode(state["planner"]))
            planner.config = config
            return cls(inner_restore(state["inner"]), planner, state.get("held"))
        return cls(inner_restore(state), ActionPlanner(config))


def acting_hooks(hooks: dict[str, Callable], config: MitigationConfig) -> dict[str, Callable]:
    """A worker's ``detector_factory`` / ``detector_restore`` pair, wrapped to act."""
    factory, restore = hooks["detector_factory"], hooks["detector_restore"]
    return {"detector_factory": lambda: ActingDetector(factory(), ActionPlanner(config)),
            "detector_restore": lambda s: ActingDetector.restore(s, restore, config)}
