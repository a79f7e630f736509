"""What a simulation is made of: jobs, scenarios, and the faults injected into them.

A ``Scenario`` is a cluster (hosts x GPUs) running one or more ``JobSpec`` jobs,
plus a list of ``FaultSpec`` injections. Fault kinds come from the fault library
(``FAULT_KINDS``: they slow something down and are ground truth the detectors
must find) or are benign disturbances (``BENIGN_KINDS``: they must not be
reported). Times in a FaultSpec are seconds since the start of the trace.

>>> FaultSpec("gpu_thermal", start_s=30, end_s=90, intensity=0.3, rank=5).is_fault
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

from failslow.schema.errors import FailslowError


class SimulatorError(FailslowError):
    """A scenario, fault or schedule line is malformed; the message says which and why."""


# fault library kind -> (CONTRACT fault, CONTRACT root_cause, target type)
# target type: "rank" (one GPU/rank), "link" (a rank pair or a host NIC), "host".
FAULT_KINDS: dict[str, tuple[str, str, str]] = {
    "gpu_thermal": ("slow_rank", "gpu_thermal", "rank"),
    "gpu_power": ("slow_rank", "gpu_power", "rank"),
    "gpu_clock": ("slow_rank", "gpu_clock", "rank"),
    "pcie_degraded": ("slow_rank", "pcie_degraded", "rank"),
    "gpu_errors": ("slow_rank", "gpu_errors", "rank"),
    "slow_link": ("slow_link", "nic_congestion", "link"),
    "nic_errors": ("slow_link", "nic_errors", "link"),
    "cpu_contention": ("slow_host", "cpu_contention", "host"),
    "input_stall": ("slow_rank", "input_stall", "rank"),
}

# Benign disturbances. intensity means: checkpoint/restart -> unused (the pause
# lasts start..end); eval/long_seq -> job-wide compute slowdown fraction;
# gc_spike -> pause length as a fraction of a step; job_end -> unused;
# transient -> one rank's compute slowdown for start..end (a few steps: a heavy batch, a
# noisy neighbour, a page-cache miss; over before anyone could act); slow_sku -> a host's
# GPUs slower by that fraction from the start (another SKU or bin: the layout);
# heavy_stage -> a pipeline stage's compute heavier by that fraction from the start
# (more layers on it by design).
BENIGN_KINDS: tuple[str, ...] = ("checkpoint", "eval", "long_seq", "gc_spike", "restart",
                                 "job_end", "transient", "slow_sku", "heavy_stage")


def level(start_s: float, end_s: float | None, intensity: float, ramp_s: float,
          period_s: float, duty: float, t_rel: float) -> float:
    """An injection's slowdown at ``t_rel`` (``FaultSpec.level``; telemetry shares it)."""
    if t_rel < start_s or (end_s is not None and t_rel >= end_s):
        return 0.0
    since = t_rel - start_s
    if period_s > 0 and since % period_s >= duty * period_s:
        return 0.0
    return intensity * min(1.0, since / ramp_s) if ramp_s > 0 else intensity


@dataclass(frozen=True)
class FaultSpec:
    """One injection: a fault-library fail-slow or a benign disturbance.

    ``start_s``/``end_s`` are seconds since the trace start (``end_s`` None: to
    the end). ``intensity`` is the fractional slowdown of the target's own work
    (0.3 = 30 % slower, 2.0 = 3x). Targets: ``rank`` (a rank of ``job``),
    ``host`` (``"h3"``), ``peer_rank`` (the other end of a rank-pair link),
    ``nic`` (one NIC index of ``host``; None = all of the host's NICs), ``stage`` (a
    pipeline stage, ``heavy_stage``). Shape in time: ``ramp_s`` > 0 reaches
    ``intensity`` linearly over that many seconds (a GPU heating up steps its clocks down
    as it crosses its thermal limits); ``period_s`` > 0 flaps: in effect for the first
    ``duty`` share of every period (a fan failing on and off, a marginal link retraining).
    """

    kind: str
    start_s: float
    end_s: float | None = None
    intensity: float = 0.0
    rank: int | None = None
    host: str | None = None
    peer_rank: int | None = None
    nic: int | None = None
    job: str = "job0"
    stage: int | None = None
    ramp_s: float = 0.0
    period_s: float = 0.0
    duty: float = 0.5

    @property
    def is_fault(self) -> bool:
        return self.kind in FAULT_KINDS

    def active(self, t_rel: float) -> bool:
        """Whether the injection is in effect at ``t_rel`` seconds since the trace start."""
        return self.start_s <= t_rel and (self.end_s is None or t_rel < self.end_s)

    def level(self, t_rel: float) -> float:
        """The slowdown in effect at ``t_rel`` (0 outside it, or in a flap's off phase)."""
        return level(self.start_s, self.end_s, self.intensity, self.ramp_s, self.period_s,
                     self.duty, t_rel)

    def check(self) -> None:
        """Raise SimulatorError when the spec cannot be simulated as written."""
        if self.kind not in FAULT_KINDS and self.kind not in BENIGN_KINDS:
            known = ", ".join((*FAULT_KINDS, *BENIGN_KINDS))
            raise SimulatorError(f"unknown fault kind {self.kind!r} (known: {known})")
        if self.start_s < 0 or (self.end_s is not None and self.end_s <= self.start_s):
            raise SimulatorError(f"{self.kind}: needs 0 <= start < end "
                                 f"(got start={self.start_s}, end={self.end_s})")
        if self.intensity < 0:
            raise SimulatorError(f"{self.kind}: intensity must be >= 0, got {self.intensity}")
        if self.ramp_s < 0 or self.period_s < 0 or not 0 < self.duty <= 1:
            raise SimulatorError(f"{self.kind}: needs ramp_s >= 0, period_s >= 0, "
                                 f"0 < duty <= 1")
        need = {"transient": "rank", "slow_sku": "host", "heavy_stage": "stage"}.get(self.kind)
        if need is not None and getattr(self, need) is None:
            raise SimulatorError(f"{self.kind}: needs a target {need} ({need}=...)")
        if self.kind in FAULT_KINDS:
            target = FAULT_KINDS[self.kind][2]
            if target == "rank" and self.rank is None:
                raise SimulatorError(f"{self.kind}: needs a target rank (rank=N)")
            if target == "host" and self.host is None:
                raise SimulatorError(f"{self.kind}: needs a target host (host=hN)")
            if target == "link" and not ((self.rank is not None and self.peer_rank is not None)
                                         or self.host is not None):
                raise SimulatorError(f"{self.kind}: needs a rank pair (rank=A,peer=B) "
                                     "or a host NIC (host=hN[,nic=K])")


@dataclass(frozen=True)
class JobSpec:
    """One training job with hybrid parallelism: TP inside a host, PP across hosts,
    DP across replicas. world size = hosts * gpus_per_host; dp = world / (tp * pp).

    ``step_s`` is the target healthy step time (seconds); ``comm_frac`` the share
    of it spent in the DP gradient collectives; ``dp_op`` "allreduce" (DDP,
    ``buckets`` all-reduces per step) or "zero" (reduce-scatter + all-gather).
    ``steps`` None: runs as long as the scenario. ``tp_ops``: tensor-parallel
    all-reduces per micro-batch and direction (Megatron: per layer), the compute split
    evenly between them and their time and bytes too (1: one after the whole forward,
    one after the whole backward).
    """

    job_id: str = "job0"
    hosts: int = 2
    tp: int = 1
    pp: int = 1
    micro_batches: int = 4
    step_s: float = 1.0
    comm_frac: float = 0.12
    dp_op: str = "allreduce"
    buckets: int = 4
    steps: int | None = None
    tokens_per_step: int = 4096
    tp_ops: int = 1


@dataclass(frozen=True)
class Scenario:
    """A named, seeded simulation setup. ``large`` marks the ones too big for tests."""

    name: str
    description: str
    jobs: tuple[JobSpec, ...] = (JobSpec(),)
    faults: tuple[FaultSpec, ...] = ()
    steps: int = 120
    gpus_per_host: int = 8
    idle_hosts: int = 0
    sample_interval_s: float = 1.0
    warmup_steps: int = 3
    large: bool = False
    tags: tuple[str, ...] = field(default=())

    def check(self) -> None:
        """Raise SimulatorError when the topology or a fault cannot be simulated."""
        ids = [j.job_id for j in self.jobs]
        if not ids or len(set(ids)) != len(ids):
            raise SimulatorError(f"{self.name}: jobs need distinct ids, got {ids}")
        if self.steps < 1 or self.sample_interval_s <= 0:
            raise SimulatorError(f"{self.name}: steps >= 1 and sample_interval_s > 0 needed")
        for j in self.jobs:
            world = j.hosts * self.gpus_per_host
            if j.tp < 1 or j.pp < 1 or world % (j.tp * j.pp):
                raise SimulatorError(f"{j.job_id}: world {world} is not divisible by "
                                     f"tp*pp = {j.tp}*{j.pp}")
            if self.gpus_per_host % j.tp:
                raise SimulatorError(f"{j.job_id}: tp={j.tp} must divide gpus_per_host="
                                     f"{self.gpus_per_host} (TP stays inside a host)")
            if j.dp_op not in ("allreduce", "zero"):
                raise SimulatorError(f"{j.job_id}: dp_op must be allreduce or zero")
        for f in self.faults:
            f.check()
            if f.job not in ids:
                raise SimulatorError(f"{f.kind}: unknown job {f.job!r} (jobs: {', '.join(ids)})")
