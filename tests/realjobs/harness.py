"""Launch real 4-rank jobs, inject a fail-slow with real extra work, write their traces.

``run_jobs([(kind, scenario, out_dir), ...])`` spawns 4 ranks once (torch.multiprocessing,
gloo on 127.0.0.1, one thread each) and runs the jobs one after another, each rank
instrumented as docs/collectors.md says: a ``TrainingHook`` (``grain=``) over a
``FilePublisher`` writing ``out_dir/rank{N}.jsonl``, 2 hosts (``host{rank // 2}``). Each
job's ``out_dir/truth.json``: kind, scenario, culprit rank (or None), onset step, root
cause, the job's MEASURED step-time increase (``measured_increase``, from the trace's
own step events) and every step's end (``step_end_ts``). ``run_job`` runs one.

Kinds: ``ddp`` (tests/hook_jobs.py's MLP sizes, 8.4 MB of gradients in 4-5 DDP buckets,
so all-reduces overlap backward), ``fsdp2`` (the same MLP, ``fully_shard`` per layer over
a DeviceMesh), ``pipeline`` (4 stages, one rank each, send/recv per micro-batch), ``gpipe``
and ``1f1b`` (the same 4 stages on torch.distributed.pipelining's ScheduleGPipe and
Schedule1F1B: tests/realjobs/pipelining.py), ``tp`` (tensor parallel over the 4 ranks:
DTensor Colwise/RowwiseParallel, functional all-reduces in forward and backward).

The injected work is proportional to what the culprit does anyway, so "2x" is 2x on
any machine and under any load: the culprit times its own forward+backward (a pipeline
stage: its forward and backward calls, sends and receives excluded) before the onset,
and from the onset on adds ``factor - 1`` times that median to every step (``burn``:
matmuls repeated until the time is spent, or with ``work="device"`` a sleep, the host
thread waiting on a slower accelerator). A loader stall sleeps that long before yielding
the batch; a busy backward spins inside a backward hook in the middle of the model,
after DDP launched the last layers' bucket. A stage heavier by design carries an extra
layer from the first step.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hook_jobs import BUCKET_MB, DIMS

from failslow.collectors.file_publisher import FilePublisher
from failslow.collectors.torch_hook import TrainingHook
from failslow.stack import free_port

WORLD = 4
CULPRIT = 2
MICRO = 4          # pipeline micro-batches per step
MICRO_BATCH = 32   # samples per micro-batch
BATCH = 128        # DDP/FSDP2 samples per rank-step: compute ~2/3 of a ~0.2 s step
STEPS = 40
# How extra compute is spent: "cpu" (matmuls on this rank's core, which on a host with
# fewer cores than ranks also slows its peers) or "device" (a sleep: the host thread
# waiting on a slower accelerator, what a GPU straggler looks like to its host).
WORK = {"kind": "cpu"}
ONSET = 16


@dataclass(frozen=True)
class Scenario:
    """factor: the culprit's compute from the onset (1 = none added); stall: its loader
    waits this many of its median steps; busy: its backward spins (factor - 1) x its
    median compute; heavy_stage: the last stage is ~1.5x heavier from step 0."""

    factor: float = 1.0
    stall: float = 0.0
    busy: bool = False
    heavy_stage: bool = False

    @property
    def culprit(self) -> int | None:
        return CULPRIT if self.factor > 1.0 or self.stall > 0 else None


SCENARIOS: dict[str, Scenario] = {
    "benign": Scenario(),
    "compute1.5x": Scenario(factor=1.5),
    "compute2x": Scenario(factor=2.0),
    "compute3x": Scenario(factor=3.0),
    "loader_stall": Scenario(stall=1.0),
    "busy_backward": Scenario(factor=2.0, busy=True),
    "heavy_stage": Scenario(heavy_stage=True),
}
KINDS: dict[str, tuple[str, ...]] = {
    "ddp": ("benign", "compute1.5x", "compute2x", "compute3x", "loader_stall", "busy_backward"),
    "fsdp2": ("benign", "compute2x"),
    "pipeline": ("benign", "heavy_stage", "compute2x"),
    "gpipe": ("benign", "heavy_stage", "compute2x"),
    "1f1b": ("benign", "heavy_stage", "compute2x"),
    "tp": ("benign", "compute2x"),
}


def burn(seconds: float) -> None:
    """Real compute for ``seconds``: small matmuls, repeated until the time is spent."""
    if seconds <= 0:
        return
    if WORK["kind"] == "device":
        time.sleep(seconds)
        return
    a = torch.randn(128, 128)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def spin(seconds: float) -> None:
    """A busy-wait holding the Python thread (a slow custom kernel, a host-side loop)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Job:
    """One rank: hook, recorder, and the scenario's switches."""

    def __init__(self, rank: int, kind: str, scenario: str, out: str, onset: int,
                 grain: str, layout: dict[str, int] | None = None) -> None:
        self.rank, self.onset = rank, onset
        self.sc = SCENARIOS[scenario]
        self.pub = FilePublisher(Path(out) / f"rank{rank}.jsonl")
        self.hook = TrainingHook(self.pub, job_id=f"{kind}-{scenario}", rank=rank,
                                 host=f"host{rank // 2}", grain=grain,
                                 **(layout or {})).install()
        self.step = 0
        self.own_s: list[float] = []   # forward+backward wall time of each step before the onset
        self._base: float | None = None

    @property
    def slow(self) -> bool:
        """This rank is the culprit and the fault has begun."""
        return self.rank == self.sc.culprit and self.step >= self.onset

    def timed(self, seconds: float) -> None:
        """Record one step's forward+backward wall time (before the onset)."""
        if self.step < self.onset:
            self.own_s.append(seconds)

    def base(self) -> float:
        """Median forward+backward wall time of this rank before the onset (from step 2)."""
        if self._base is None:
            self._base = median(self.own_s[2:] or self.own_s)
        return self._base

    def extra_s(self) -> float:
        """Seconds of extra work per step now: (factor - 1) x own forward+backward, once slow."""
        return (self.sc.factor - 1.0) * self.base() if self.slow and not self.sc.busy else 0.0

    def loader(self, batches: list, steps: int) -> Iterator:
        for i in range(steps):
            self.step = i
            if self.slow and self.sc.stall:
                time.sleep(self.sc.stall * self.base())
            yield batches[i % len(batches)]

    def close(self) -> None:
        dist.barrier()
        self.hook.close()
        self.pub.close()


class _Net(torch.nn.Module):
    """An MLP; ``extra`` layers after the first (a stage heavier by design)."""

    def __init__(self, dims: tuple[int, ...], extra: int = 0) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b)
                                          for a, b in zip(dims, dims[1:], strict=False))
        self.extra = torch.nn.ModuleList(torch.nn.Linear(dims[1], dims[1]) for _ in range(extra))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x))
            if i == 0:
                for e in self.extra:
                    x = torch.relu(e(x))
        return x


def _batches(rank: int, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(BATCH, DIMS[0], generator=g), torch.randn(BATCH, DIMS[-1], generator=g))
            for _ in range(n)]


def _train(job: _Job, net: _Net, model: Any, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    if job.sc.busy:
        def busy_backward(*_: Any) -> None:
            if job.slow:
                spin((job.sc.factor - 1.0) * job.base())
        net.layers[1].register_full_backward_hook(busy_backward)
    for i, (x, y) in enumerate(job.hook.wrap_loader(job.loader(_batches(job.rank), steps))):
        with job.hook.step(i):
            burn(job.extra_s())
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            job.timed(time.perf_counter() - t0)
            opt.step()
    job.close()


def _ddp(rank: int, scenario: str, out: str, steps: int, onset: int, grain: str) -> None:
    job = _Job(rank, "ddp", scenario, out, onset, grain, {"dp_rank": rank})
    net = _Net(DIMS)
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=BUCKET_MB)
    job.hook.instrument_ddp(model)
    _train(job, net, model, steps)


def _fsdp2(rank: int, scenario: str, out: str, steps: int, onset: int, grain: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    job = _Job(rank, "fsdp2", scenario, out, onset, grain)
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    job.hook.set_layout_from_mesh(mesh)
    net = _Net(DIMS)
    for layer in net.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    _train(job, net, net, steps)


def _pipeline(rank: int, scenario: str, out: str, steps: int, onset: int, grain: str) -> None:
    job = _Job(rank, "pipeline", scenario, out, onset, grain, {"pp_rank": rank, "dp_rank": 0})
    dims = (DIMS[0], DIMS[1], DIMS[0])
    # one extra 1024 x 1024 layer on 2 x 512 x 1024: the last stage ~1.5x by design
    stage = _Net(dims, extra=1 if job.sc.heavy_stage and rank == WORLD - 1 else 0)
    opt = torch.optim.SGD(stage.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(MICRO, MICRO_BATCH, DIMS[0], generator=g) for _ in range(4)]
    for i, xs in enumerate(job.hook.wrap_loader(job.loader(batches, steps))):
        with job.hook.step(i):
            extra = job.extra_s() / MICRO
            outs: list[torch.Tensor] = []
            ins: list[torch.Tensor] = []
            own = 0.0   # this stage's own forward+backward, sends and receives excluded
            for m in range(MICRO):   # forward: receive, compute, send on
                if rank == 0:
                    x = xs[m]
                else:
                    x = torch.empty(MICRO_BATCH, DIMS[0])
                    dist.recv(x, rank - 1)
                x.requires_grad_(rank > 0)
                burn(extra)
                t0 = time.perf_counter()
                y = stage(x)
                own += time.perf_counter() - t0
                if rank < WORLD - 1:
                    dist.send(y.detach(), rank + 1)
                ins.append(x)
                outs.append(y)
            opt.zero_grad()
            for m in reversed(range(MICRO)):   # backward: gradients flow back
                if rank == WORLD - 1:
                    t0 = time.perf_counter()
                    outs[m].pow(2).mean().backward()
                else:
                    grad = torch.empty(MICRO_BATCH, DIMS[0])
                    dist.recv(grad, rank + 1)
                    t0 = time.perf_counter()
                    outs[m].backward(grad)
                own += time.perf_counter() - t0
                if rank > 0:
                    grad_in = ins[m].grad
                    assert grad_in is not None
                    dist.send(grad_in, rank - 1)
            opt.step()
        job.timed(own)
    job.close()


def _tp(rank: int, scenario: str, out: str, steps: int, onset: int, grain: str) -> None:
    """Tensor parallel over the 4 ranks (DTensor ``parallelize_module``): two MLP blocks,
    each a ColwiseParallel then a RowwiseParallel linear, so every forward all-reduces the
    partial outputs (functional collectives) and every backward the input gradients. All
    ranks see the same batch; each computes its quarter of every block."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    job = _Job(rank, "tp", scenario, out, onset, grain)
    mesh = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("dp", "tp"))
    job.hook.set_layout_from_mesh(mesh)
    width, hidden = DIMS[0], 4 * DIMS[0]
    layers: list[torch.nn.Module] = []
    plan: dict[str, Any] = {}
    for b in range(2):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU(),
                   torch.nn.Linear(hidden, width)]
        plan[str(3 * b)], plan[str(3 * b + 2)] = ColwiseParallel(), RowwiseParallel()
    model = torch.nn.Sequential(*layers)
    parallelize_module(model, mesh["tp"], plan)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(BATCH // 2, width, generator=g) for _ in range(4)]
    for i, x in enumerate(job.hook.wrap_loader(job.loader(batches, steps))):
        with job.hook.step(i):
            burn(job.extra_s())
            t0 = time.perf_counter()
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            job.timed(time.perf_counter() - t0)
            opt.step()
    job.close()


def _gpipe(rank: int, scenario: str, out: str, steps: int, onset: int, grain: str) -> None:
    from realjobs.pipelining import run_pipelined  # it imports this module
    run_pipelined("gpipe", rank, scenario, out, steps, onset, grain)


def _1f1b(rank: int, scenario: str, out: str, steps: int, onset: int, grain: str) -> None:
    from realjobs.pipelining import run_pipelined
    run_pipelined("1f1b", rank, scenario, out, steps, onset, grain)


_RUN = {"ddp": _ddp, "fsdp2": _fsdp2, "pipeline": _pipeline, "gpipe": _gpipe, "1f1b": _1f1b,
        "tp": _tp}


def _rank_main(rank: int, port: int, jobs: list[tuple[str, str, str]], steps: int,
               onset: int, seed: int, grain: str, work: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    WORK["kind"] = work
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for kind, scenario, out in jobs:   # one start (imports, rendezvous) for them all
            torch.manual_seed(seed)
            _RUN[kind](rank, scenario, out, steps, onset, grain)
    finally:
        dist.destroy_process_group()


def job_steps(out_dir: Path) -> dict[int, tuple[float, float]]:
    """Per step of the job: (the slowest rank's ``duration_s``, the last rank's end ts)."""
    per_step: dict[int, tuple[float, float]] = {}
    for f in sorted(Path(out_dir).glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("kind") == "step":
                d, ts = per_step.get(ev["step"], (0.0, 0.0))
                per_step[ev["step"]] = (max(d, ev["duration_s"]), max(ts, ev["ts"]))
    return per_step


def measured_increase(out_dir: Path, onset: int) -> float | None:
    """Job step time after ``onset`` (mean) over before (median of steps 2..onset), minus 1:
    what ``slowdown_pct`` means (docs/detection.md)."""
    per_step = job_steps(out_dir)
    before = [d for s, (d, _) in per_step.items() if 2 <= s < onset]
    after = [d for s, (d, _) in per_step.items() if s >= onset]
    if not before or not after:
        return None
    return (sum(after) / len(after)) / median(before) - 1.0


def run_job(kind: str, scenario: str, out_dir: Path | str, steps: int = STEPS,
            onset: int = ONSET, seed: int = 0, grain: str = "collective",
            work: str = "cpu") -> dict[str, Any]:
    """Run one job, write ``out_dir/rank*.jsonl`` and ``out_dir/truth.json``; return truth.

    grain: what the hook publishes besides steps (``comm`` | ``collective`` | ``both``)."""
    return run_jobs([(kind, scenario, out_dir)], steps, onset, seed, grain, work)[0]


def run_jobs(jobs: Sequence[tuple[str, str, Path | str]], steps: int = STEPS, onset: int = ONSET,
             seed: int = 0, grain: str = "collective", work: str = "cpu") -> list[dict[str, Any]]:
    """``run_job`` for each (kind, scenario, out_dir), one after another in the same 4
    processes (starting them, mostly importing torch, is ~10 s on a loaded 2-core VM)."""
    for kind, scenario, _ in jobs:
        if scenario not in KINDS.get(kind, ()):
            raise ValueError(f"unknown job {kind}/{scenario}")
    outs = [Path(out) for _, _, out in jobs]
    for out in outs:
        out.mkdir(parents=True, exist_ok=True)
        for f in out.glob("rank*.jsonl"):
            f.unlink()
    t0 = time.monotonic()
    plan = [(kind, scenario, str(out)) for (kind, scenario, _), out in zip(jobs, outs, strict=True)]
    if work not in ("cpu", "device"):
        raise ValueError(f"work must be cpu or device, not {work!r}")
    mp.spawn(_rank_main, args=(free_port(), plan, steps, onset, seed, grain, work),
             nprocs=WORLD)
    wall = round((time.monotonic() - t0) / len(jobs), 2)
    return [_truth(kind, scenario, out, steps, onset, seed, grain, work, wall)
            for (kind, scenario, _), out in zip(jobs, outs, strict=True)]


def _truth(kind: str, scenario: str, out: Path, steps: int, onset: int, seed: int, grain: str,
           work: str, wall_s: float) -> dict[str, Any]:
    sc = SCENARIOS[scenario]
    inc = measured_increase(out, onset)
    truth = {
        "kind": kind, "scenario": scenario, "steps": steps, "seed": seed, "grain": grain,
        "work": work,
        "culprit": sc.culprit, "onset_step": onset if sc.culprit is not None else None,
        "heavy_stage": WORLD - 1 if sc.heavy_stage else None,
        "root_cause": "input_stall" if sc.stall else None,
        "measured_increase_pct": None if inc is None else round(100.0 * inc, 1),
        "wall_s": wall_s, "out_dir": str(out),
        "step_end_ts": [ts for _, (_, ts) in sorted(job_steps(out).items())],
    }
    (out / "truth.json").write_text(json.dumps(truth) + "\n")
    return truth
