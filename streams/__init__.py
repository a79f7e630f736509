"""Stream processors (faust): route input topics to each job's home partition, order and
de-duplicate there, run models/ and emit incidents; state recovers from snapshots.

Entry points: ``streams.app.WorkerConfig`` + ``streams.app.build_app`` (used by
``failslow worker``); the per-partition logic is ``streams.partition.JobPartition``.
"""

from failslow.schema.errors import FailslowError


class StreamsError(FailslowError):
    """The stream processors cannot start (missing topics, unreachable broker)."""


__all__ = ["StreamsError"]
