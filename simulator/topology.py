"""Rank placement and communicator groups of one job (Megatron order: TP fastest, then DP, then PP).

rank = pp * (dp_size * tp_size) + dp * tp_size + tp, so ``grid[p, d, t]`` is the
rank at pipeline stage p, data-parallel replica d, tensor-parallel slice t.
Ranks fill hosts in order (``gpus_per_host`` each): a TP group never leaves its
host, and with dp * tp a multiple of gpus_per_host each pipeline stage owns whole
hosts, so pipeline transfers cross hosts.

Group names: ``dp{k}`` (k = p * tp + t), ``tp{k}`` (k = p * dp + d), and for the
point-to-point channel between two pipeline neighbours ``pp{a}-{b}`` where a < b
are the two global ranks (one channel per rank pair, so ``seq`` aligns per pair).

>>> lay = Layout(world=16, tp=2, pp=2, gpus_per_host=8, host_offset=0)
>>> lay.dp, int(lay.grid[1, 0, 1]), lay.group_names[lay.tp_gid(1, 0)]
(4, 9, 'tp4')
"""

from __future__ import annotations

import numpy as np


class Layout:
    """Placement (host, local GPU) of every rank and the names of its groups."""

    def __init__(self, world: int, tp: int, pp: int, gpus_per_host: int, host_offset: int):
        self.world, self.tp, self.pp = world, tp, pp
        self.dp = world // (tp * pp)
        ranks = np.arange(world)
        self.grid = ranks.reshape(pp, self.dp, tp)
        self.host_index = host_offset + ranks // gpus_per_host  # global host index
        self.gpu = ranks % gpus_per_host
        self.pp_rank = ranks // (self.dp * tp)
        self.dp_rank = (ranks // tp) % self.dp
        self.tp_rank = ranks % tp
        self.n_dp_groups = pp * tp
        self.n_tp_groups = pp * self.dp
        names = [f"dp{k}" for k in range(self.n_dp_groups)]
        names += [f"tp{k}" for k in range(self.n_tp_groups)]
        lo = self.grid[:-1].ravel()
        hi = self.grid[1:].ravel()
        names += [f"pp{a}-{b}" for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
        self.group_names = names
        hosts_of = self.host_index[self.grid]
        # Whether a DP group (p, t) spans hosts: then its traffic goes over NICs.
        self.dp_cross = hosts_of.min(axis=1) != hosts_of.max(axis=1)  # (pp, tp)
        # Whether each pipeline neighbour pair (p, d, t)-(p+1, d, t) crosses hosts.
        self.pp_cross = hosts_of[:-1] != hosts_of[1:]  # (pp-1, dp, tp)

    def dp_gid(self, p: int, t: int) -> int:
        return p * self.tp + t

    def tp_gid(self, p: int, d: int) -> int:
        return self.n_dp_groups + p * self.dp + d

    def pp_gids(self, p: int) -> np.ndarray:
        """Group indices (dp, tp) of the channels between stage p and p + 1."""
        base = self.n_dp_groups + self.n_tp_groups + p * self.dp * self.tp
        return base + np.arange(self.dp * self.tp).reshape(self.dp, self.tp)
