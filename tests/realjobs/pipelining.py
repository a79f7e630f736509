"""Pipeline jobs on ``torch.distributed.pipelining``: kinds ``gpipe`` (``ScheduleGPipe``)
and ``1f1b`` (``Schedule1F1B``).

The same 4 stages as the hand-written ``pipeline`` kind (tests/realjobs/harness.py), one
rank each, the same MLP per stage and the same 128 samples per step, in ``MICRO``
micro-batches of ``MICRO_BATCH``; a ``PipelineStage`` per rank, its shapes inferred from
the first micro-batch, and the schedule doing the sends and receives (``isend`` /
``irecv`` on the ProcessGroup, or ``batch_isend_irecv``: the seams the hook patches, so
every transfer is seen in a ``p2p<lo>-<hi>`` group). The hook's layout is the same as the
hand-written pipeline's (``pp_rank`` = rank, ``dp_rank`` 0).

A stage's own work is what its ``forward_one_chunk`` and ``backward_one_chunk`` calls
take (the schedule waits for the transfers outside them); from the onset, the culprit
spends ``factor - 1`` times its median of that, split over its forward chunks, as the
hand-written pipeline does. A stage heavier by design (``heavy_stage``) is the last stage
with one extra layer from step 0.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from hook_jobs import DIMS
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from realjobs.harness import MICRO, MICRO_BATCH, WORLD, _Job, _Net, burn

SCHEDULES: dict[str, Any] = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class _TimedStage(PipelineStage):
    """A ``PipelineStage`` that sums its own compute (``own``, seconds) and spends
    ``extra`` seconds of real work before each forward chunk."""

    own = 0.0
    extra = 0.0

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        burn(self.extra)
        t0 = time.perf_counter()
        try:
            return super().forward_one_chunk(*args, **kwargs)
        finally:
            self.own += time.perf_counter() - t0

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().backward_one_chunk(*args, **kwargs)
        finally:
            self.own += time.perf_counter() - t0


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


def run_pipelined(kind: str, rank: int, scenario: str, out: str, steps: int, onset: int,
                  grain: str) -> None:
    """One rank of a ``kind`` (``gpipe`` | ``1f1b``) job: stage ``rank`` of ``WORLD``."""
    job = _Job(rank, kind, scenario, out, onset, grain, {"pp_rank": rank, "dp_rank": 0})
    dims = (DIMS[0], DIMS[1], DIMS[0])
    net = _Net(dims, extra=1 if job.sc.heavy_stage and rank == WORLD - 1 else 0)
    stage = _TimedStage(net, rank, WORLD, torch.device("cpu"))
    schedule = SCHEDULES[kind](stage, n_microbatches=MICRO, loss_fn=_loss)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(MICRO * MICRO_BATCH, DIMS[0], generator=g) for _ in range(4)]
    target = torch.zeros(MICRO * MICRO_BATCH, DIMS[0])
    for i, x in enumerate(job.hook.wrap_loader(job.loader(batches, steps))):
        with job.hook.step(i):
            stage.own, stage.extra = 0.0, job.extra_s() / MICRO
            opt.zero_grad()
            if rank == 0:
                schedule.step(x)
            elif rank == WORLD - 1:
                schedule.step(target=target)
            else:
                schedule.step()
            opt.step()
        job.timed(stage.own)
    job.close()
