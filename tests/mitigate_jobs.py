"""Tiny real DDP jobs (gloo on CPU) that take their batch shares from actions (issue 32).

``run_job`` spawns ``world`` ranks training a small MLP for ``steps`` steps on the same
global batches (a seeded ``global_batch`` x 8 tensor per step, identical on every rank);
each rank takes ``hook.batch_share(global_batch)`` of it and scales its loss by
``hook.loss_scale()``. ``deliver`` says, per rank, which actions its source hands over at
which call of ``batch_share`` (a rank absent from it receives nothing): delivery late to
one rank, or never, is the test. Each rank writes its final parameters, the switches it
applied and the counts it used; a job that does not finish within ``timeout_s`` is killed
and reported as hung.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from failslow.collectors.file_publisher import FilePublisher
from failslow.collectors.torch_hook import TrainingHook
from failslow.stack import free_port

DIM_IN = 8


class ScriptedSource:
    """Hands over each action at a given call of ``batch_share`` (a rank's view of a
    delivery that took that long)."""

    def __init__(self, schedule: list[tuple[int, dict[str, Any]]]) -> None:
        self.schedule = sorted(schedule, key=lambda x: x[0])
        self.calls = 0

    def poll(self) -> list[dict[str, Any]]:
        due = [a for at, a in self.schedule if at == self.calls]
        self.calls += 1
        return due


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM_IN, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1))


def batches(steps: int, global_batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(global_batch, DIM_IN, generator=g),
             torch.randn(global_batch, 1, generator=g)) for _ in range(steps)]


def reference(steps: int, global_batch: int, lr: float = 0.1) -> list[torch.Tensor]:
    """One process, the whole global batch each step: what every DDP rank must end with."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches(steps, global_batch):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _rank_main(rank: int, world: int, port: int, out: str, steps: int, global_batch: int,
               deliver: dict[int, list[tuple[int, dict]]], lr: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pub = FilePublisher(Path(out) / f"rank{rank}.jsonl")
    hook = TrainingHook(pub, job_id="mjob", host=f"h{rank}", dp_rank=rank,
                        grain="comm").install()
    mit = hook.enable_actions(ScriptedSource(deliver.get(rank, [])))
    model = torch.nn.parallel.DistributedDataParallel(net())
    hook.instrument_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    counts = []
    for i, (x, y) in enumerate(batches(steps, global_batch)):
        part = hook.batch_share(global_batch)
        with hook.step(i):
            loss = torch.nn.functional.mse_loss(model(x[part]), y[part]) * hook.loss_scale()
            opt.zero_grad()
            loss.backward()
            opt.step()
        counts.append(mit.counts(global_batch))
    dist.barrier()
    hook.close()
    pub.close()
    torch.save([p.detach() for p in model.parameters()], Path(out) / f"params{rank}.pt")
    (Path(out) / f"result{rank}.json").write_text(json.dumps(
        {"switches": mit.switches, "counts": counts, "stats": mit.stats}))
    dist.destroy_process_group()


def run_job(out: Path, world: int = 4, steps: int = 8, global_batch: int = 24,
            deliver: dict[int, list[tuple[int, dict]]] | None = None, lr: float = 0.1,
            timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the job; ``{"hung": bool, "ranks": {rank: result}, "params": {rank: [...]}}``."""
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.start_processes(_rank_main, args=(world, free_port(), str(out), steps,
                                               global_batch, deliver or {}, lr),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            return {"hung": True, "ranks": {}, "params": {}}
    return {"hung": False,
            "ranks": {r: json.loads((out / f"result{r}.json").read_text()) for r in range(world)},
            "params": {r: torch.load(out / f"params{r}.pt") for r in range(world)},
            "events": {r: [json.loads(line) for line in
                           (out / f"rank{r}.jsonl").read_text().splitlines()]
                       for r in range(world)}}


def action(shares: list[float], version: int = 1, apply_at_step: int = 2,
           mode: str = "apply", expires_ts: float = 4e9) -> dict[str, Any]:
    return {"v": 1, "kind": "action", "ts": 1.0, "action_id": f"mjob:{version}",
            "job_id": "mjob", "incident_id": "mjob:slow_rank:2:0", "type":
            "rebalance_microbatches", "mode": mode, "apply_at_step": apply_at_step,
            "expires_ts": expires_ts, "version": version, "shares": shares,
            "reason": "test"}
