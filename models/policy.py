"""The paging policy: how loud an open incident is, and why (``evidence.policy``).

Rules (``models.findings.RULES``) say *who* stands out and how strongly; this module
alone says what that is worth to an operator, from how long the slowdown has persisted
and what it has cost, never from the size of the first excess. docs/detection.md has
the table; every threshold is a field of ``PolicyConfig``.

>>> p = PagingPolicy(PolicyConfig())
>>> p.decide(Persistence(steps=2, seconds=2.0, gpu_hours=0.001, pct=80.0, period_s=1.0))
('info', 'persisted 2 of 4 steps, 0.001 GPU-h lost -> info')
>>> p.decide(Persistence(steps=5, seconds=5.0, gpu_hours=0.004, pct=30.0, period_s=1.0))[0]
'warning'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PolicyConfig:
    """Every threshold of the paging policy (units in the names; docs/detection.md).

    ``page_steps``: slowed steps before an incident may page (a transient of up to
    ``page_steps - 1`` steps stays ``info``); ``page_min_s``: and at least this many
    seconds of them (steps of ~50 ms add up to nothing an operator can act on);
    ``page_sustained_s``: in jobs whose steps last ``long_step_s`` or more, or inside
    one step (no step ended since the onset: the step is that long), evidence consistent
    across in-step windows spanning this long pages too (a 30 s step is not waited out); ``critical_gpu_hours``: GPU-hours lost that wake someone;
    ``critical_pct`` with ``critical_after_s``: or a job slowdown this large that
    lasted this long (rate of loss x duration); ``open_min_pct``: a culprit less
    than this much slower than its reference opens nothing, and its step counts as
    slowed only above it; ``back_pct``: a step below this counts toward resolving;
    ``resolve_steps``: such steps in a row that resolve; ``flap_steps``: a culprit that came
    back after being away waits this many steps beyond its longest absence (at least
    ``resolve_steps``, up to ``resolve_max_steps``); ``present_z``: a step whose
    signal stands out by fewer noise sigmas than this (its rule's own score of that very
    step, where the rule keeps one: a link's transfer cost) counts toward resolving an open
    incident, whatever the rule's memory of the episode still confirms, when its excess
    that step is also under ``fade_ratio`` of the incident's mean excess over its slowed
    steps, once it has ``page_steps`` of them (a marginal culprit stays near its level: it is not fading), or
    when the job's slowdown for it that step is under ``fade_ratio`` of the incident's mean
    slowdown per slowed step (the job no longer waits for it); a rule's memory of an
    episode resolved so (an onset before the resolve) reopens nothing on such a step; ``imbalance_ratio`` and
    ``imbalance_points``: a culprit recorded as steady imbalance pages only once its
    gap is both this many times and this many points (fraction) above the recorded
    one; ``cost_update_ratio``: an open incident's cost is re-sent once it grew by this
    factor (at most once per ``min_update_s``), never as a page; ``update_pct_points``:
    and its slowdown once it moved by half its value and at least this many points;
    ``lag_max``: the largest share of a step charged to a culprit its group waits for
    when grading (an excess of lag / (1 - lag): 9x at most; ``[rules.evidence]
    wait_share_max`` when judging); ``onset_margin``: at open, step ends later than this
    share of a step after the onset count as slowed (an onset estimated a little early
    adds no step), ``open_steps_max`` of them at most (a confirmation needs two steps of
    evidence: an onset estimated early must not make a transient look persistent);
    ``period_steps``: the step gaps whose median is a job's step period
    (the unit of "steps" above); ``recheck_s``: a culprit's cause still unknown is looked
    at again this many seconds of sample time after a late sample (one collector sample
    period).
    """

    page_steps: int = 4
    page_min_s: float = 0.5
    page_sustained_s: float = 3.0
    long_step_s: float = 2.0
    critical_gpu_hours: float = 0.5
    critical_pct: float = 20.0
    critical_after_s: float = 30.0
    open_min_pct: float = 5.0
    back_pct: float = 2.5
    resolve_steps: int = 5
    flap_steps: int = 2
    resolve_max_steps: int = 8
    present_z: float = 4.0
    fade_ratio: float = 0.25
    imbalance_ratio: float = 1.5
    imbalance_points: float = 0.10
    cost_update_ratio: float = 1.5
    min_update_s: float = 5.0
    update_pct_points: float = 5.0
    lag_max: float = 0.9
    onset_margin: float = 0.25
    open_steps_max: int = 2
    period_steps: int = 5
    recheck_s: float = 1.0

    def check(self) -> None:
        """Raise ValueError (one line) on a value no policy can work with."""
        for name in ("page_steps", "resolve_steps", "resolve_max_steps", "period_steps",
                     "open_steps_max"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"policy.{name} must be >= 1")
        for name in ("page_min_s", "page_sustained_s", "long_step_s", "critical_gpu_hours",
                     "critical_pct", "critical_after_s", "open_min_pct", "back_pct",
                     "imbalance_points", "min_update_s", "flap_steps", "update_pct_points",
                     "onset_margin", "recheck_s", "present_z", "fade_ratio"):
            if float(getattr(self, name)) < 0:
                raise ValueError(f"policy.{name} must be >= 0")
        if self.cost_update_ratio <= 1.0 or self.imbalance_ratio < 1.0:
            raise ValueError("policy.cost_update_ratio must be > 1 and imbalance_ratio >= 1")
        if not 0.0 <= self.lag_max < 1.0:
            raise ValueError("policy.lag_max must be >= 0 and < 1")
        if self.resolve_max_steps < self.resolve_steps:
            raise ValueError("policy.resolve_max_steps must be >= resolve_steps")


@dataclass
class Persistence:
    """What the policy weighs: slowed steps and their seconds so far, GPU-hours lost,
    the job slowdown now (percent), the job's step period (s), the longest in-step
    evidence span (s), whether all of it lies inside one step, and the steady gap recorded for the culprit (fraction; None
    when none) beside its gap now."""

    steps: int
    seconds: float
    gpu_hours: float
    pct: float
    period_s: float
    sustained_s: float = 0.0
    in_step: bool = False
    steady_gap: float | None = None
    gap: float = 0.0


class PagingPolicy:
    """Severity from persistence and cost; ``decide`` returns it with its reason."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    def persisted(self, p: Persistence) -> tuple[bool, str]:
        cfg = self.cfg
        if p.sustained_s >= cfg.page_sustained_s and (p.period_s >= cfg.long_step_s
                                                       or p.in_step):
            return True, f"sustained {p.sustained_s:.1f} s in-step"
        if p.steps >= cfg.page_steps and p.seconds >= cfg.page_min_s:
            return True, f"persisted {p.steps} steps ({p.seconds:.1f} s)"
        if p.steps >= cfg.page_steps:
            return False, f"persisted {p.steps} steps, {p.seconds:.2f} of {cfg.page_min_s} s"
        return False, f"persisted {p.steps} of {cfg.page_steps} steps"

    def decide(self, p: Persistence, quiet_reason: str | None = None) -> tuple[str, str]:
        """(severity, policy text). ``quiet_reason``: why the incident cannot page at all
        (a suspicion, a slowdown the planner ignores), said instead of a severity rule."""
        cfg = self.cfg
        lasted, why = self.persisted(p)
        cost = f"{p.gpu_hours:.3g} GPU-h lost"
        if quiet_reason:
            return "info", f"{why}, {cost}; {quiet_reason} -> info"
        if p.steady_gap is not None:
            need = self.need(p.steady_gap)
            if p.gap < need:
                return "info", (f"steady imbalance since the start, gap {100 * p.gap:.0f}% "
                                f"(pages above {100 * need:.0f}%), {cost} -> info")
            why = f"imbalance grew {100 * p.steady_gap:.0f}% -> {100 * p.gap:.0f}%, {why}"
        if not lasted:
            return "info", f"{why}, {cost} -> info"
        if p.gpu_hours >= cfg.critical_gpu_hours:
            return "critical", f"{why}, {cost} >= {cfg.critical_gpu_hours:g} -> critical"
        if p.pct >= cfg.critical_pct and p.seconds >= cfg.critical_after_s:
            return "critical", (f"{why}, job +{p.pct:.0f}% for {p.seconds:.0f} s "
                                f"(>= {cfg.critical_pct:g}% for {cfg.critical_after_s:g} s), "
                                f"{cost} -> critical")
        return "warning", f"{why}, {cost} -> warning"

    def need(self, steady_gap: float) -> float:
        """The gap (fraction) a culprit known as steady imbalance must reach to page."""
        cfg = self.cfg
        return max(steady_gap * cfg.imbalance_ratio, steady_gap + cfg.imbalance_points)
