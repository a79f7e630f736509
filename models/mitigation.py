"""Mitigation planner after FALCON's multi-level idea, escalated by a
ski-rental rule.

The levels, cheapest first: ignore; rebalance micro-batches away from a
compute straggler (data parallel); adjust the pipeline around a slow link;
migrate the node (live migration, TrainMover: ~20 s of downtime) for a
persistent hardware fault; checkpoint-restart as the last resort.

``ignore`` means the slowdown is not worth any action: below ``min_pct``, or the
whole job slower together (no culprit). It is the only recommendation that never
pages (``models.incidents``), so it must not stand for "not yet".

The first action is recommended as soon as a culprit at ``min_pct`` or more is
confirmed: it costs a few steps (re-planning), and a fail-slow the evidence
confirmed over a window of steps lasts minutes to hours (FALCON's traces),
far longer than its break-even (``rebalance_steps / slowdown`` steps: 40 steps at
5 %, 4 at 50 %). Waiting for the measured loss to reach that cost first would
only delay the page by that many steps. The expensive levels (migration,
restart: tens of seconds to minutes of downtime) follow the ski-rental rule:
keep paying for the slowdown until what it has cost so far (measured job
seconds lost) reaches the one-off cost of the next level, then buy that level
(a break-even, 2-competitive). Causes that a new machine does not fix
(congestion, input stalls, contention) never escalate past the first action.

>>> p = Planner()
>>> p.plan("slow_rank", "gpu_thermal", slowdown_pct=30.0, elapsed_s=2.0, step_s=1.0)[0]
'rebalance_microbatches'
>>> p.plan("slow_rank", "gpu_errors", slowdown_pct=30.0, elapsed_s=120.0, step_s=1.0)[0]
'migrate_node'
>>> p.plan("slow_rank", "gpu_errors", slowdown_pct=3.0, elapsed_s=1e4, step_s=1.0)[0]
'ignore'
"""

from __future__ import annotations

PERSISTENT = ("gpu_errors", "pcie_degraded", "nic_errors", "gpu_thermal", "gpu_clock",
              "gpu_power", "unknown")
FIRST = {"slow_rank": "rebalance_microbatches", "slow_host": "rebalance_microbatches",
         "slow_link": "adjust_pipeline"}


class Planner:
    """Recommends one CONTRACT ``mitigation`` and says why.

    Costs are seconds of job downtime: ``rebalance_steps`` / ``pipeline_steps``
    are in step times (re-planning costs about that many steps),
    ``migrate_s`` and ``restart_s`` in seconds.
    """

    def __init__(self, min_pct: float = 5.0, rebalance_steps: float = 2.0,
                 pipeline_steps: float = 5.0, migrate_s: float = 20.0,
                 restart_s: float = 600.0) -> None:
        self.min_pct = min_pct
        self.rebalance_steps = rebalance_steps
        self.pipeline_steps = pipeline_steps
        self.migrate_s = migrate_s
        self.restart_s = restart_s

    def clone(self) -> Planner:
        return Planner(self.min_pct, self.rebalance_steps, self.pipeline_steps, self.migrate_s,
                       self.restart_s)

    def plan(self, fault: str, root_cause: str, slowdown_pct: float, elapsed_s: float,
             step_s: float, lost_s: float | None = None) -> tuple[str, str]:
        """Return ``(mitigation, reason)`` for an incident so far. ``lost_s``: the job's
        measured extra time since the onset (seconds, from step durations); without it
        (links), slowdown x elapsed time estimates it. ``step_s``: the job's step time
        (0.0 while not known: the reason then gives the cost in steps)."""
        if fault == "job_slowdown":
            return "ignore", "whole job slower together (no culprit): information only"
        if slowdown_pct < self.min_pct:
            return "ignore", f"slowdown {slowdown_pct:.1f}% is below {self.min_pct:.0f}%"
        lost = lost_s if lost_s is not None else slowdown_pct / 100.0 * elapsed_s
        first = FIRST.get(fault, "rebalance_microbatches")
        steps = self.pipeline_steps if first == "adjust_pipeline" else self.rebalance_steps
        # a step time not known yet (0.0) prices the action in steps
        price = f"{steps * step_s:.1f} s" if step_s > 0.0 else f"{steps:g} steps"
        # each step loses slowdown x the step time before it: repaid in steps / slowdown
        choice = first
        why = (f"{slowdown_pct:.0f}% slower, {lost:.1f} s lost so far; {first} costs "
               f"{price}, repaid in {100.0 * steps / slowdown_pct:.0f} steps")
        if root_cause in PERSISTENT:
            for action, cost in (("migrate_node", self.migrate_s),
                                 ("checkpoint_restart", self.restart_s)):
                if lost >= cost:
                    choice = action
                    why = (f"lost {lost:.1f} s ({slowdown_pct:.0f}% for {elapsed_s:.0f} s) "
                           f">= {action} cost {cost:.1f} s")
        if root_cause not in PERSISTENT:
            why += f"; {root_cause} is not fixed by new hardware"
        return choice, why

    def plan_imbalance(self, cost_pct: float, lost_s: float) -> tuple[str, str]:
        """A steady imbalance (the layout): rebalancing is the only sensible action."""
        return "rebalance_microbatches", (
            f"steady imbalance since the start: the job runs {cost_pct:.1f}% longer, "
            f"{lost_s:.1f} s so far; rebalance micro-batches / stages or move the rank")
