"""A detector that also plans actions (issue 32): the stream worker's detector, wrapped.

``ActingDetector`` hands every batch to the detector it wraps and the step events and
the incidents that come out to a ``models.actions.ActionPlanner``; it returns the incident
events followed by the ``action`` events (the worker sends each kind to its own topic).
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
from typing import Any

from failslow.models.actions import ActionPlanner, MitigationConfig

# settings the worker sets on its detector after a restore (streams/detector.py)
_FORWARDED = ("telemetry_delay_s", "job_idle_s")


class ActingDetector:
    """``inner``: any stream detector (``process_batch``, ``state_dict``); ``planner``: the
    ActionPlanner its incidents feed."""

    def __init__(self, inner: Any, planner: ActionPlanner) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "planner", planner)

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
        actions: list[dict[str, Any]] = []
        planner = self.planner
        for ev in events:
            if ev.get("kind") == "step":
                actions += planner.observe(ev)
        for inc in incidents:
            new = planner.on_incident(inc)
            actions += new
            self._annotate(inc, new)
        return [*incidents, *actions]

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
                "planner": base64.b64encode(blob).decode("ascii")}

    @classmethod
    def restore(cls, state: Any, inner_restore: Callable[[Any], Any],
                config: MitigationConfig) -> ActingDetector:
        """From ``state_dict()``, or from a bare detector state (a snapshot taken before
        the worker acted: a fresh planner). The planner takes ``config``, the current one."""
        if isinstance(state, dict) and state.get("acting") == 1:
            planner = pickle.loads(base64.b64decode(state["planner"]))
            planner.config = config
            return cls(inner_restore(state["inner"]), planner)
        return cls(inner_restore(state), ActionPlanner(config))


def acting_hooks(hooks: dict[str, Callable], config: MitigationConfig) -> dict[str, Callable]:
    """A worker's ``detector_factory`` / ``detector_restore`` pair, wrapped to act."""
    factory, restore = hooks["detector_factory"], hooks["detector_restore"]
    return {"detector_factory": lambda: ActingDetector(factory(), ActionPlanner(config)),
            "detector_restore": lambda s: ActingDetector.restore(s, restore, config)}
