"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[FailslowCallback()])`` traces
every rank.

Needs the optional extra ``failslow[hf]``. The callback arms the same hook as
``failslow run`` (``collectors.autohook``): collectives from torch.distributed, DDP's
gradient all-reduces (make the callback before the Trainer trains: it instruments the
DDP model the Trainer builds then), a trace per rank in
``<trace_dir>/<job id>/<run id>/``. A step is the Trainer's: ``on_step_begin`` to
``on_step_end``, one optimizer step over all its gradient-accumulation micro-batches.
Under ``failslow run`` the callback takes over the steps, and the trace stays the
launcher's.

>>> trainer = Trainer(model, args, train_dataset=ds,                  # doctest: +SKIP
...                   callbacks=[FailslowCallback("traces")])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from failslow.collectors.autohook import activate, start_if_up


class FailslowCallback(TrainerCallback):
    """trace_dir: traces' root [``FAILSLOW_TRACE_DIR``, ./failslow-traces]; job_id: the
    job's id [``collectors.runs.default_job_id``: FAILSLOW_JOB_ID, SLURM_JOB_ID, ...]."""

    def __init__(self, trace_dir: str | Path | None = None, job_id: str | None = None) -> None:
        self.auto = activate(trace_dir, job_id, steps_from="callback")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        start_if_up(say_why_not=True)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.auto.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.auto.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.auto.close()
