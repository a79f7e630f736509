"""What one evaluated step says: the located culprits (``Finding``) that the
incident tracker opens, keeps alive or lets resolve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The signals a finding can come from (``Finding.rule``; docs/detection.md says what each
# sees): a rank's step evidence (against its peers, or its own past), its group waiting for it, windows inside a long step, a host's ranks
# together, collective groups of a link, pipeline pairs per step or per window, a steady
# imbalance (the layout), the job's own change point.
RULES = ("step-peers", "step-own-past", "step-waited", "substep-windows",
         "host-ranks", "link-groups", "p2p-steps", "p2p-windows", "imbalance",
         "job-changepoint")


@dataclass
class Finding:
    """One located fail-slow as seen at one step.

    ``key`` identifies the culprit across steps (fault + where); ``confirmed``
    means it has stood out long enough to open an incident (a finding that is
    only still weakly present keeps an open incident alive but opens none).
    Times are epoch seconds; ``slowdown_pct`` is the job step-time increase
    attributed to it; ``own_pct`` how much slower the culprit itself is than
    its reference (its work vs peers / own past, a link's transfer time vs its
    past), percent; ``lost_s`` the job's extra elapsed time attributed to it so far
    (seconds, from measured step durations; None where not tracked), so
    ``world * lost_s / 3600`` is the GPU-hours lost; ``step_z`` how many noise sigmas the
    culprit stands out at this very step (None: the rule keeps no per-step score; a
    confirmation's memory can outlast the fault by a few steps, this cannot) and
    ``step_rel`` its excess at this step (fraction); ``imbalance`` marks a steady
    offset from the start (the layout: recorded, never paged); ``rule`` names the signal
    that produced it (the incident carries it as ``evidence.rule``: ``RULES``).
    """

    key: str
    fault: str
    confirmed: bool
    onset_ts: float
    onset_step: int
    slowdown_pct: float
    own_pct: float = 0.0
    rank: int | None = None
    host: str | None = None
    gpu: int | None = None
    peer_rank: int | None = None
    peer_host: str | None = None
    hosts: list[str] = field(default_factory=list)          # hosts whose devices to inspect
    gpus: list[tuple[str, int]] = field(default_factory=list)
    data_share: float = 0.0
    lost_s: float | None = None
    world: int = 0
    step_z: float | None = None
    step_rel: float | None = None
    imbalance: bool = False
    rule: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def job_pct(excess_s: float, job_s: float) -> float:
    """Job step-time increase caused by ``excess_s`` extra seconds on the critical path."""
    base = job_s - excess_s
    return 100.0 * excess_s / base if base > 0 and excess_s > 0 else 0.0
