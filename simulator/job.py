"""The state of one job while a scenario runs (``simulator.trace``), read back for the
ground truth (``simulator.truth``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from failslow.simulator.emit import JobEvents
from failslow.simulator.physics import JobSim
from failslow.simulator.spec import FaultSpec, JobSpec
from failslow.simulator.topology import Layout


@dataclass
class JobRun:
    """One job of a simulated run: its spec, layout and physics, and how far it got."""

    spec: JobSpec
    lay: Layout
    sim: JobSim
    faults: list[FaultSpec]
    gpus: np.ndarray                    # global GPU index of each rank
    limit: int
    done: int = 0
    fired: set[int] = field(default_factory=set)
    last_ckpt: int | None = None
    onset: dict[int, int] = field(default_factory=dict)   # fault index -> first step
    series: list[tuple[float, float, bool]] = field(default_factory=list)  # t_rel, step_s, clean
    ended_ts: float | None = None
    emit: JobEvents | None = None
