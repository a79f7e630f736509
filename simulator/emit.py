"""Turn a job's simulated steps into CONTRACT.md v1 event tables (see ``simulator.jsonl``):
step, collective and comm events; device samples are tabled in ``simulator.telemetry``.

Columns are rounded in numpy (µs for times) and stay arrays: ``Table.dicts()``
zips them into event dicts, ``Table.lines()`` formats them into JSON Lines
without building a dict. Field order is the CONTRACT.md order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from failslow.simulator.comm import DEFAULT_WINDOW_S, comm_table
from failslow.simulator.jsonl import Choices, Const, Num, Pick, Table

if TYPE_CHECKING:
    from failslow.simulator.physics import StepOut
    from failslow.simulator.topology import Layout

OP_NAMES = Choices(["allreduce", "reducescatter", "allgather", "send", "recv"])


def nullable(n: int) -> Choices:
    """null, 0, 1, ..., n - 1, picked by ``value + 1`` (-1 stands for null)."""
    return Choices([None, *range(n)])


class JobEvents:
    """Step and collective tables of one job (the per-rank and per-group text is cached)."""

    def __init__(self, job_id: str, lay: Layout, hosts: list[str], tokens: int,
                 grain: str = "comm", window_s: float = DEFAULT_WINDOW_S):
        self.job_id, self.lay, self.tokens = job_id, lay, tokens
        self.grain, self.window_s = grain, window_s
        self.host = Choices([hosts[h] for h in lay.host_index.tolist()])  # by rank
        n_dp, n_tp = lay.n_dp_groups, lay.n_tp_groups
        self.group = Choices(lay.group_names)
        self.group_size = Choices([lay.dp if g < n_dp else lay.tp if g < n_dp + n_tp else 2
                                   for g in range(len(lay.group_names))])
        self.peer = nullable(lay.world)
        self.ranks = np.arange(lay.world)

    def tables(self, out: StepOut, skew: np.ndarray) -> tuple[Table, Table]:
        """Collective-timing (``comm`` or ``collective``, by the grain) and step events of
        one step, each with its ts (not sorted).

        ``skew`` (per rank, seconds) is the offset of the rank's host clock: every host
        stamps its own events, and host clocks disagree by about a millisecond."""
        lay, job = self.lay, Const(self.job_id)
        end = np.round(out.end + skew, 6)
        steps = Table([
            ("v", Const(1)), ("kind", Const("step")), ("ts", Num(end, 6)), ("job_id", job),
            ("rank", Num(self.ranks)), ("world_size", Const(lay.world)),
            ("host", Pick(self.ranks, self.host)), ("step", Const(out.step)),
            ("duration_s", Num(np.round(out.end - out.t0, 7), 7)), ("gpu", Num(lay.gpu)),
            ("compute_s", Num(np.round(out.compute, 7), 7)),
            ("comm_s", Num(np.round(out.comm, 7), 7)), ("data_s", Num(np.round(out.data, 7), 7)),
            ("tokens", Const(self.tokens)), ("dp_rank", Num(lay.dp_rank)),
            ("pp_rank", Num(lay.pp_rank)), ("tp_rank", Num(lay.tp_rank))], end)
        if self.grain == "comm":
            comm = comm_table(out, skew, self.window_s, job=job, host=self.host,
                              world=lay.world, gpu=lay.gpu, group=self.group.values,
                              group_size=self.group_size.values, op_names=OP_NAMES.values)
            return comm, steps
        col = out.coll
        ranks, gids = col["rank"], col["gid"]
        cskew = skew[ranks]
        cend = np.round(col["end"] + cskew, 6)
        start = np.round(col["start"] + cskew, 6)
        colls = Table([
            ("v", Const(1)), ("kind", Const("collective")), ("ts", Num(cend, 6)),
            ("job_id", job), ("rank", Num(ranks)), ("host", Pick(ranks, self.host)),
            ("group", Pick(gids, self.group)), ("group_size", Pick(gids, self.group_size)),
            ("op", Pick(col["op"], OP_NAMES)), ("seq", Num(col["seq"])),
            ("start_ts", Num(start, 6)), ("duration_s", Num(np.round(cend - start, 7), 7)),
            ("bytes", Num(col["bytes"])), ("step", Const(out.step)),
            ("peer", Pick(col["peer"] + 1, self.peer)), ("gpu", Num(lay.gpu[ranks]))], cend)
        return colls, steps

