"""Where one job's events go when it is spread over shards (issue 16; not wired yet,
see docs/streams.md "One job across many workers").

A job keeps its *home partition* (``routing.home_partition``): the job stage there combines
what needs the whole job. Its ranks are cut into ``shards`` shards by pipeline stage (peer
comparison is within a stage, ``models.job``: ``groups = pp_rank``), or by blocks of
consecutive ranks for a job without pipeline stages; shard ``k`` lives on partition
``home + k * N // shards`` (mod N), so a job's shards are as far apart as the partitions
allow and faust's assignment gives them to different workers. A host's telemetry goes to
the shards that hold its ranks (with tensor parallelism inside a host, one shard).

>>> plan = ShardPlan(partitions=8, shards=2)
>>> plan.shard(rank=5, world=16, pp_rank=1, pp=4), plan.shard(rank=12, world=16, pp_rank=3, pp=4)
(0, 1)
>>> plan.partition("job0", 1) == (plan.partition("job0", 0) + 4) % 8
True
"""

from __future__ import annotations

from streams.routing import home_partition


class ShardPlan:
    """``shards`` shards per job over ``partitions`` partitions (``shards`` <= partitions;
    1: today's layout, everything on the home partition)."""

    def __init__(self, partitions: int, shards: int = 1) -> None:
        if not 1 <= shards <= partitions:
            raise ValueError(f"shards must be between 1 and the {partitions} partitions")
        self.partitions = partitions
        self.shards = shards
        self._hosts: dict[tuple[str, str], set[int]] = {}  # (job, host) -> its shards

    def shard(self, rank: int, world: int, pp_rank: int | None = None,
              pp: int | None = None) -> int:
        """The shard of a rank: by pipeline stage when the job has at least as many stages
        as shards (a stage never spans two shards), else by block of consecutive ranks."""
        k = self.shards
        if pp_rank is not None and pp and pp >= k:
            return pp_rank * k // pp
        return min(rank * k // max(world, 1), k - 1)

    def partition(self, job_id: str, shard: int) -> int:
        """The partition of the job topic that holds ``shard`` of ``job_id``."""
        n = self.partitions
        return (home_partition(job_id, n) + shard * n // self.shards) % n

    def place(self, job_id: str, host: str, rank: int, world: int,
              pp_rank: int | None = None, pp: int | None = None) -> int:
        """The partition of a rank's step and comm events; remembers that ``host``'s
        telemetry is needed there (``host_partitions``)."""
        p = self.partition(job_id, self.shard(rank, world, pp_rank, pp))
        self._hosts.setdefault((job_id, host), set()).add(p)
        return p

    def host_partitions(self, job_id: str, host: str) -> set[int]:
        """The partitions holding ranks of ``job_id`` on ``host`` (empty before its first
        step event is placed)."""
        return self._hosts.get((job_id, host), set())
