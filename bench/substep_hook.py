"""The pipeline hook that issue 15 needs, for the benches, until ``models/pipeline.py``
has it: ``JobState.add_comm`` returns the sub-step judgements a ``comm`` window completes
(``models.substep``), and ``Detector.process_batch`` must hand them to ``_judge`` as it
does the judged steps ``add_step`` returns:

    if kind == "comm":
        for _, findings, ts in job.add_comm(ev):
            out.extend(self._judge(job, findings, ts))

``hooked()`` is a Detector doing exactly that (events taken one at a time, the
judgements of a comm window right after it), so the benches measure what the stream and
``failslow detect`` will decide once the pipeline forwards them.
"""

from __future__ import annotations

import inspect
from typing import Any

import failslow.models.pipeline as pipeline
from failslow.models.job import JobState


def forwards_substep() -> bool:
    """Whether ``models.pipeline`` already hands ``add_comm``'s judgements on."""
    return "in job.add_comm(" in inspect.getsource(pipeline.Detector.process_batch)


class _Job(JobState):
    def add_comm(self, ev: dict[str, Any]) -> list:
        out = super().add_comm(ev)
        self._sub_out = out
        return out


class HookedDetector(pipeline.Detector):
    """A Detector that judges the sub-step findings of each ``comm`` window."""

    def process_batch(self, events) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            out.extend(super().process_batch((ev,)))
            if ev.get("kind") == "comm":
                job = self.jobs.get(ev.get("job_id"))
                sub = getattr(job, "_sub_out", None)
                if job is not None and sub:
                    job._sub_out = []
                    with_step = "s" in inspect.signature(self._judge).parameters
                    for s, findings, ts in sub:
                        out.extend(self._judge(job, s, findings, ts) if with_step
                                   else self._judge(job, findings, ts))
        return out


def hooked() -> pipeline.Detector:
    """A Detector whose jobs' comm judgements reach the incident tracker."""
    if forwards_substep():
        return pipeline.Detector()
    pipeline.JobState = _Job      # type: ignore[misc]  # bench only: jobs it creates
    return HookedDetector()
