"""Real DDP jobs (gloo on CPU) instrumented by the training hook, for tests and benches.

``run_ddp`` spawns ``world`` ranks training an MLP of ~6 MB in several DDP buckets, so
the bucket all-reduces overlap each other and backward. One rank may do ``factor``
times the compute from step ``slow_from`` on: real extra matmuls inside forward and
backward (a chain of layers the size of the model's, on the activations). Each rank
writes its events with a FilePublisher (``grain``: ``both`` by default, so the raw
``collective`` events sit beside the ``comm`` windows); the result is every rank's step
events, plus, when raw events were published, ``comm_sum_s``: what the hook reported
before it counted time blocked (the sum of the durations of the collectives that ended
in the step, capped), for comparison. ``pad_s`` adds that much sleep to every step (a
bigger model's compute, to reach ~1 s steps), ``extra_ops`` small synchronous
all-reduces after the optimizer (a real job's op count); ``read_events`` gives every event.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from failslow.collectors.file_publisher import FilePublisher
from failslow.collectors.torch_hook import TrainingHook
from failslow.stack import free_port

DIMS = (512, 1024, 1024, 512)  # 2.1 M floats: 8.4 MB of gradients
BUCKET_MB = 2.0                # -> 4-5 buckets


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b)
                                          for a, b in zip(DIMS, DIMS[1:], strict=False))
        self.extra: list[torch.Tensor] = []  # the slow rank's extra work, not DDP's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x))
            if i == 1 and self.extra:
                y = x
                for w in self.extra:
                    y = torch.relu(y @ w)
                x = x + 0.0 * y  # the extra chain runs in backward too
        return x


def _extra_chain(copies: float) -> list[torch.Tensor]:
    """Weights whose forward+backward cost ``copies`` times the model's."""
    n = max(0, round(copies * (len(DIMS) - 1)))
    return [(torch.randn(DIMS[1], DIMS[1]) * 0.01).requires_grad_() for _ in range(n)]


def _rank_main(rank: int, world: int, port: int, out: str, steps: int, slow_rank: int,
               slow_from: int, factor: float, batch: int, grain: str, window_s: float,
               pad_s: float, bucket_mb: float, extra_ops: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pub = FilePublisher(Path(out) / f"rank{rank}.jsonl")
    hook = TrainingHook(pub, job_id="ddp", host=f"host{rank // 2}", dp_rank=rank,
                        grain=grain, window_s=window_s).install()
    net = _Net()
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
    hook.instrument_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(batch, DIMS[0], generator=g), torch.randn(batch, DIMS[-1], generator=g))
               for _ in range(4)]
    for i, (x, y) in enumerate(hook.wrap_loader(batches[i % 4] for i in range(steps))):
        if rank == slow_rank and i == slow_from:
            net.extra = _extra_chain(factor - 1.0)
        with hook.step(i):
            if pad_s:
                time.sleep(pad_s)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            for _ in range(extra_ops):
                dist.all_reduce(torch.ones(256))
    dist.barrier()
    hook.close()
    pub.close()
    dist.destroy_process_group()


def run_ddp(out: Path, world: int = 4, steps: int = 24, slow_rank: int = 2,
            slow_from: int = 12, factor: float = 1.0, batch: int = 32, grain: str = "both",
            window_s: float = 1.0, pad_s: float = 0.0, bucket_mb: float = BUCKET_MB,
            extra_ops: int = 0) -> dict[int, list[dict]]:
    """Run the job; every rank's step events in step order (with ``comm_sum_s`` when
    raw events were published)."""
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank_main, args=(world, free_port(), str(out), steps, slow_rank, slow_from,
                               factor, batch, grain, window_s, pad_s, bucket_mb, extra_ops),
             nprocs=world)
    result = {}
    for rank, evs in read_events(out, world).items():
        op_sum: dict[int, float] = defaultdict(float)
        raw = False
        for ev in evs:
            if ev["kind"] == "collective" and ev["step"] is not None:
                op_sum[ev["step"]] += ev["duration_s"]
                raw = True
        stepevs = sorted((e for e in evs if e["kind"] == "step"), key=lambda e: e["step"])
        for s in stepevs if raw else []:
            s["comm_sum_s"] = min(op_sum[s["step"]], s["duration_s"] - s["data_s"])
            s["compute_sum_s"] = s["duration_s"] - s["data_s"] - s["comm_sum_s"]
        result[rank] = stepevs
    return result


def read_events(out: Path, world: int) -> dict[int, list[dict]]:
    """Every event each rank wrote, in file order."""
    return {rank: [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
            for rank in range(world)}


def med(steps: list[dict], field: str, lo: int, hi: int) -> float:
    """Median of ``field`` over steps ``lo <= step < hi``."""
    return median(s[field] for s in steps if lo <= s["step"] < hi)


def spread(by_rank: dict[int, list[dict]], field: str, lo: int, hi: int) -> list[float]:
    """Per step, (max - min) / median of ``field`` across ranks: how unequal ranks look."""
    out = []
    for step in range(lo, hi):
        vals = sorted(s[field] for steps in by_rank.values() for s in steps if s["step"] == step)
        if vals and median(vals) > 0:
            out.append((vals[-1] - vals[0]) / median(vals))
    return out
