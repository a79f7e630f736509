"""PyTorch Lightning: ``Trainer(callbacks=[FailslowCallback()])`` traces every rank.

Needs the optional extra ``failslow[lightning]``. The callback arms the same hook as
``failslow run`` (``collectors.autohook``): collectives from torch.distributed, DDP's
gradient all-reduces, a trace per rank in ``<trace_dir>/<job id>/<run id>/``. A step is
one training batch, from ``on_train_batch_start`` to ``on_train_batch_end`` (with
gradient accumulation, one micro-batch); validation and checkpointing between batches
are outside every step. Under ``failslow run`` the callback takes over the steps, and
the trace stays the launcher's.

>>> trainer = L.Trainer(strategy="ddp", callbacks=[FailslowCallback("traces")])  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from failslow.collectors.autohook import activate, start_if_up


class FailslowCallback(Callback):
    """trace_dir: traces' root [``FAILSLOW_TRACE_DIR``, ./failslow-traces]; job_id: the
    job's id [``collectors.runs.default_job_id``: FAILSLOW_JOB_ID, SLURM_JOB_ID, ...]."""

    def __init__(self, trace_dir: str | Path | None = None, job_id: str | None = None) -> None:
        self.auto = activate(trace_dir, job_id, steps_from="callback")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        start_if_up(say_why_not=True)  # Lightning starts the process group before setup

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        self.auto.begin_step()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.auto.end_step()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.auto.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.auto.close()
