"""The training hook under FSDP2 and tensor parallel, in real gloo jobs on CPU.

FSDP2 (``fully_shard``) all-gathers parameters and reduce-scatters gradients through
``dist.all_gather_single`` / ``dist.reduce_scatter_single``; tensor parallel
(DTensor, ``parallelize_module`` with Colwise/RowwiseParallel) all-reduces through the
functional collectives. Both must show up in the ``comm`` windows (the default grain)
of steps, with ``comm_s > 0``, and the layout read from the DeviceMesh on every step
event."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

from failslow.collectors.file_publisher import FilePublisher  # noqa: E402
from failslow.collectors.torch_hook import TrainingHook  # noqa: E402
from failslow.schema import validate  # noqa: E402
from failslow.stack import free_port  # noqa: E402

pytestmark = pytest.mark.integration

STEPS = 5


def _start(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _fsdp_main(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    _start(rank, world, port)
    pub = FilePublisher(Path(out) / f"rank{rank}.jsonl")
    hook = TrainingHook(pub, job_id="fsdp").install()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    hook.set_layout_from_mesh(mesh)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(rank))
    for i in range(STEPS):
        with hook.step(i):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    dist.barrier()
    hook.close()
    pub.close()
    dist.destroy_process_group()


def _tp_main(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    _start(rank, world, port)
    pub = FilePublisher(Path(out) / f"rank{rank}.jsonl")
    hook = TrainingHook(pub, job_id="tp").install()
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    hook.set_layout_from_mesh(mesh)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    for i in range(STEPS):
        with hook.step(i):
            model(x.requires_grad_()).pow(2).mean().backward()
    dist.barrier()
    hook.close()
    pub.close()
    dist.destroy_process_group()


def _events(out: Path, world: int) -> dict[int, list[dict]]:
    result = {}
    for rank in range(world):
        evs = [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
        for ev in evs:
            validate(ev)
        result[rank] = evs
    return result


def test_fsdp2_all_gathers_and_reduce_scatters_are_seen(tmp_path):
    world = 2
    mp.spawn(_fsdp_main, args=(world, free_port(), str(tmp_path)), nprocs=world)
    for rank, evs in _events(tmp_path, world).items():
        steps = [e for e in evs if e["kind"] == "step"]
        assert [s["step"] for s in steps] == list(range(STEPS))
        in_steps: Counter[str] = Counter()
        for e in evs:
            if e["kind"] == "comm" and e["step"] is not None:  # the default grain
                for o in e["ops"]:
                    in_steps[o["op"]] += o["n"]
        # per step: an all-gather per layer (forward, again in backward unless kept) and
        # a reduce-scatter per layer
        assert in_steps["allgather"] >= 2 * STEPS and in_steps["reducescatter"] >= 2 * STEPS
        assert all(s["comm_s"] > 0 for s in steps)
        assert all(s["dp_rank"] == rank and s["tp_rank"] is None for s in steps)


def test_tensor_parallel_functional_collectives_are_seen(tmp_path):
    world = 2
    mp.spawn(_tp_main, args=(world, free_port(), str(tmp_path)), nprocs=world)
    groups = {}
    for rank, evs in _events(tmp_path, world).items():
        steps = [e for e in evs if e["kind"] == "step"]
        assert [s["step"] for s in steps] == list(range(STEPS))
        assert all((s["dp_rank"], s["tp_rank"]) == (0, rank) for s in steps)
        ars = [(e["step"], o) for e in evs if e["kind"] == "comm" and e["step"] is not None
               for o in e["ops"] if o["op"] == "allreduce" and o["group_size"] == 2]
        # RowwiseParallel's partial output, all-reduced in forward, and ColwiseParallel's
        # input gradient in backward: DTensor waits on a view of the result, which the
        # hook matches by storage (each op is seen, not only those waited on directly)
        assert sum(o["n"] for _, o in ars) >= 2 * STEPS
        assert {step for step, _ in ars} == set(range(STEPS))
        assert all(s["comm_s"] > 0 for s in steps)
        assert all(0 < o["blocked_s"] <= o["n"] * o["max_s"] + 1e-9 for _, o in ars)
        groups[rank] = {o["group"] for _, o in ars}
    # the tp group, named from the mesh, the same on both members
    assert groups[0] == groups[1] == {"tp0"}
