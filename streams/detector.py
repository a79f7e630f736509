"""What the streams layer needs from a detector (issue 20): ``models.pipeline.Detector``
is the one in use, tests pass fakes. The streams layer imports models/ only to build the
default one (``JobPartition``'s factory), never to type its calls.

Optional counters, read with ``getattr(det, name, 0)`` and turned into metrics when
present: ``late_samples``, ``errors``, ``jobs_ended``, ``judged_rank_steps``. Optional
settings the worker's flags override after a restore: ``telemetry_delay_s``,
``job_idle_s``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

# counters a detector may keep (monotonic); JobPartition adds their increase to its counts
COUNTERS = (("late_samples", "late_samples"), ("errors", "detector_errors"),
            ("jobs_ended", "jobs_ended"), ("judged_rank_steps", "judged_rank_steps"))


@runtime_checkable
class StreamDetector(Protocol):
    """Events in (ordered by event time, de-duplicated), incident events out; its state
    is a picklable value that a restore function turns back into a detector."""

    def process_batch(self, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Take events in event-time order; return the incident events they cause."""
        ...

    def state_dict(self) -> Any:
        """The whole state, for a snapshot (``detector_restore`` reads it back)."""
        ...
