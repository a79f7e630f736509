"""Mitigation planner after FALCON's multi-level idea, escalated by a
ski-rental rule.

The levels, cheapest first: ignore; rebalance micro-batches away from a
compute straggler (data parallel); adjust the pipeline around a slow link;
migrate the node (live migration, TrainMover: ~20 s of downtime) for a
persistent hardware fault; checkpoint-restart as the last resort. The rule:
keep paying for the slowdown until what it has cost so far (fraction slower x
seconds elapsed, in job-seconds) reaches the one-off cost of the next level,
then buy that level (a ski-rental break-even, 2-competitive). Slowdowns below
``min_pct`` are ignored outright. Causes that a new machine does not fix
(congestion, input stalls, contention) never escalate past the first action.

>>> p = Planner()
>>> p.plan("slow_rank", "gpu_thermal", slowdown_pct=30.0, elapsed_s=10.0, step_s=1.0)[0]
'rebalance_microbatches'
>>> p.plan("slow_rank", "gpu_errors", slowdown_pct=30.0, elapsed_s=120.0, step_s=1.0)[0]
'migrate_node'
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
        (links), slowdown x elapsed time estimates it."""
        if fault == "job_slowdown":
            return "ignore", "whole job slower together (no culprit): information only"
        if slowdown_pct < self.min_pct:
            return "ignore", f"slowdown {slowdown_pct:.1f}% is below {self.min_pct:.0f}%"
        lost = lost_s if lost_s is not None else slowdown_pct / 100.0 * elapsed_s
        first = FIRST.get(fault, "rebalance_microbatches")
        steps = self.pipeline_steps if first == "adjust_pipeline" else self.rebalance_steps
        ladder = [(first, steps * step_s)]
        if root_cause in PERSISTENT:
            ladder += [("migrate_node", self.migrate_s), ("checkpoint_restart", self.restart_s)]
        choice, why = "ignore", f"lost {lost:.1f} s so far, less than the cheapest action"
        for action, cost in ladder:
            if lost >= cost:
                choice = action
                why = (f"lost {lost:.1f} s ({slowdown_pct:.0f}% for {elapsed_s:.0f} s) "
                       f">= {action} cost {cost:.1f} s")
        if choice != "ignore" and root_cause not in PERSISTENT:
            why += f"; {root_cause} is not fixed by new hardware"
        return choice, why

    def plan_imbalance(self, cost_pct: float, lost_s: float) -> tuple[str, str]:
        """A steady imbalance (the layout): rebalancing is the only sensible action."""
        return "rebalance_microbatches", (
            f"steady imbalance since the start: the job runs {cost_pct:.1f}% longer, "
            f"{lost_s:.1f} s so far; rebalance micro-batches / stages or move the rank")
