"""The step loop of one job: GPipe-style pipeline, TP collectives, DP gradient sync.

Vectorized over ranks: arrays are shaped (pp, dp, tp) like ``Layout.grid``; the
Python loops run over micro-batches and stages only. Every collective completes
when its slowest member arrives, plus its transfer time: early members wait (their
``duration_s`` grows), the late one does not. A send/recv transfer starts when
both sides have posted it. Nobody synchronizes globally, yet step times lock to
the critical path because every rank depends on its TP, PP and DP neighbours.

Noise: a persistent per-GPU speed spread, a slow job-wide drift and a per-replica
batch cost (data-dependent), per-step per-rank and per-chunk factors (all
lognormal), rare per-rank hiccups (GC, allocator), heavy-tailed collective
jitter, lognormal input wait with rare stalls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from failslow.simulator.effects import Effects, group_mult, pair_mult
from failslow.simulator.spec import JobSpec
from failslow.simulator.topology import Layout

NVLINK_BPS = 360e9   # effective intra-host bus bandwidth, bytes/s
NIC_BPS = 45e9       # effective per-GPU inter-host bandwidth (400 Gb/s rail), bytes/s
OPS = ("allreduce", "reducescatter", "allgather", "send", "recv")
OP_AR, OP_RS, OP_AG, OP_SEND, OP_RECV = range(5)


def _ring(n: int) -> float:
    """Bytes each member moves per byte of buffer in a ring all-reduce."""
    return 2.0 * (n - 1) / n


@dataclass
class StepOut:
    """One simulated step of one job: per-rank timings (flat, by rank) and collectives."""

    step: int
    t0: np.ndarray
    end: np.ndarray
    compute: np.ndarray
    comm: np.ndarray
    data: np.ndarray
    net_bytes: np.ndarray          # bytes each rank sent (= received) over its NIC
    coll: dict[str, np.ndarray]    # columns: rank start end gid seq bytes op peer
    pauses: list[tuple[str, float, float]] = field(default_factory=list)


class JobSim:
    """Simulates the steps of one job; ``next_step(effects)`` advances it by one."""

    def __init__(self, job: JobSpec, lay: Layout, rng: np.random.Generator, start_ts: float):
        self.job, self.lay, self.rng = job, lay, rng
        P, D, T, M = lay.pp, lay.dp, lay.tp, job.micro_batches
        self.shape = (P, D, T)
        s = job.step_s
        a_tp = 0.10 if T > 1 else 0.0
        a_pp = 0.06 if P > 1 else 0.0
        self.dp_s = job.comm_frac * s if D > 1 else 0.0
        self.opt_s = 0.02 * s
        self.data_s = 0.01 * s
        pipe = s - self.dp_s - self.opt_s - self.data_s
        self.f_s = pipe / ((M + P - 1) * 3.0 * (1.0 + a_tp + a_pp))
        self.tp_s = 3.0 * self.f_s * a_tp / 2  # one TP all-reduce after fwd, one after bwd
        self.pp_s = 3.0 * self.f_s * a_pp / 2
        self.tp_s /= job.tp_ops
        self.tp_bytes = int(self.tp_s * NVLINK_BPS / _ring(T)) if T > 1 else 0
        self.pp_bytes = int(self.pp_s * NIC_BPS)
        n_dp_ops = job.buckets if job.dp_op == "allreduce" else 2
        dp_bw = NIC_BPS if lay.dp_cross.any() else NVLINK_BPS
        per_op = self.dp_s / n_dp_ops
        self.dp_bytes = int(per_op * dp_bw / (_ring(D) / (2 if job.dp_op == "zero" else 1))) \
            if D > 1 else 0
        self.dp_time = np.where(lay.dp_cross, per_op, per_op * dp_bw / NVLINK_BPS)[:, None, :]
        self.pp_time = np.where(lay.pp_cross, self.pp_s, self.pp_bytes / NVLINK_BPS)
        self.speed = rng.lognormal(0.0, 0.008, self.shape)
        self.ready = start_ts + rng.uniform(0.0, 0.05, self.shape)
        self.step = 0
        self.warm = 0          # steps since (re)start, for warm-up slowness
        self.drift = 0.0       # log of the job-wide data-dependent cost factor
        self.dp_seq = np.zeros((P, 1, T), dtype=np.int64)
        self.tp_seq = np.zeros((P, D, 1), dtype=np.int64)
        self.pp_seq = np.zeros((max(P - 1, 1), D, T), dtype=np.int64)

    # -- one step -------------------------------------------------------------

    def next_step(self, eff: Effects, warmup_steps: int, spike_s: np.ndarray | None) -> StepOut:
        """Simulate one step under ``eff``; ``spike_s`` (world,) adds one-off pauses."""
        rng, lay, job = self.rng, self.lay, self.job
        P, D, T = self.shape
        W = lay.world
        self._cols: list[tuple] = []
        warm = 1.0 + 4.0 * 0.35 ** self.warm if self.warm < warmup_steps else 1.0
        # Data-dependent cost: the whole job drifts slowly (sequence mix), and each DP
        # replica (all its TP/PP ranks) sees its own batch.
        self.drift = 0.9 * self.drift + rng.normal(0.0, 0.004)
        batch = rng.lognormal(0.0, 0.01, (1, D, 1))
        cm = (eff.compute_mult.reshape(self.shape) * self.speed * warm * np.exp(self.drift)
              * batch * rng.lognormal(0.0, 0.01, self.shape))
        t0 = self.ready.copy()
        data = (self.data_s * rng.lognormal(0.0, 0.35, self.shape)
                * eff.data_mult.reshape(self.shape) + eff.data_extra_s.reshape(self.shape))
        stall = rng.random(self.shape) < 0.004
        data = data + stall * rng.uniform(0.05, 0.4, self.shape) * job.step_s
        hiccup = (rng.random(self.shape) < 0.003) * rng.uniform(0.03, 0.3, self.shape) * job.step_s
        if spike_s is not None:
            hiccup = hiccup + spike_s.reshape(self.shape)
        ready = t0 + data
        comp = np.zeros(self.shape)
        comm = np.zeros(self.shape)
        net = np.zeros(self.shape)
        pend = np.zeros(self.shape)
        f = self.f_s * cm
        pp_mult = None
        if P > 1:
            pp_mult = np.where(lay.pp_cross, pair_mult(eff, lay.grid[:-1], lay.grid[1:]), 1.0)
        M = job.micro_batches
        L = job.tp_ops
        for phase, stages, work in (("f", range(P), 1.0), ("b", range(P - 1, -1, -1), 2.0)):
            for m in range(M):
                for p in stages:
                    if phase == "f" and p > 0:
                        self._p2p(p - 1, p, p - 1, ready, pend, comm, net, pp_mult)
                    elif phase == "b" and p < P - 1:
                        self._p2p(p + 1, p, p, ready, pend, comm, net, pp_mult)
                    c = f[p] * work * rng.lognormal(0.0, 0.02, (D, T))
                    if phase == "f" and m == 0:
                        c = c + hiccup[p]
                    comp[p] += c
                    if T > 1 and L > 1:
                        # one TP all-reduce per layer: the work split between them
                        for k in range(L):
                            ck = (c - hiccup[p] if phase == "f" and m == 0 else c) / L
                            if k == 0 and phase == "f" and m == 0:
                                ck = ck + hiccup[p]
                            ready[p] = self._tp(p, ready[p] + ck, comm)
                        pend[p] = ready[p]
                        continue
                    arrive = ready[p] + c
                    ready[p] = self._tp(p, arrive, comm) if T > 1 else arrive
                    pend[p] = ready[p]
        ready = self._dp(ready, comp, comm, net, cm, eff)
        pauses: list[tuple[str, float, float]] = []
        self.ready = ready
        self.step += 1
        self.warm += 1
        return StepOut(self.step - 1, t0.ravel(), ready.ravel(), comp.ravel(), comm.ravel(),
                       data.ravel(), net.ravel()[:W], self._columns(), pauses)

    def pause(self, out: StepOut, kind: str, seconds: float) -> float:
        """All ranks stop together after ``out`` (checkpoint, restart); returns the resume ts.

        The pause counts in the step's duration (a hook timing step to step sees it),
        not in compute, comm or data."""
        begin = float(self.ready.max())
        resume = begin + seconds * float(self.rng.lognormal(0.0, 0.02))
        self.ready = resume + self.rng.uniform(0.0, 0.002, self.shape)
        out.end = self.ready.ravel().copy()
        out.pauses.append((kind, begin, resume))
        return resume

    def restart(self, to_step: int) -> None:
        """Resume at ``to_step`` (the step after the last checkpoint) with a new warm-up."""
        self.step = to_step
        self.warm = 0

    # -- communication ------------------------------------------------------------

    def _rec(self, op: int, ranks, start, end, gid, seq, nbytes: int, peer=None) -> None:
        # Copies: start/end/seq are views of arrays the loop keeps updating.
        n = np.size(ranks)
        self._cols.append((n, op, nbytes, np.ravel(ranks), np.ravel(start).copy(),
                           np.ravel(end).copy(), np.broadcast_to(gid, np.shape(ranks)).ravel(),
                           np.broadcast_to(seq, np.shape(ranks)).ravel().copy(),
                           None if peer is None else np.ravel(peer)))

    def _columns(self) -> dict[str, np.ndarray]:
        """The recorded collectives of this step as flat columns."""
        cols = self._cols
        if not cols:
            empty = np.zeros(0, dtype=np.int64)
            return {k: empty for k in ("rank", "start", "end", "gid", "seq", "bytes", "op",
                                       "peer")}
        sizes = np.array([c[0] for c in cols])
        cat = np.concatenate
        return {
            "rank": cat([c[3] for c in cols]), "start": cat([c[4] for c in cols]),
            "end": cat([c[5] for c in cols]), "gid": cat([c[6] for c in cols]),
            "seq": cat([c[7] for c in cols]),
            "bytes": np.repeat(np.array([c[2] for c in cols], dtype=np.int64), sizes),
            "op": np.repeat(np.array([c[1] for c in cols], dtype=np.int64), sizes),
            "peer": cat([np.full(c[0], -1) if c[8] is None else c[8] for c in cols]),
        }

    def _p2p(self, src: int, dst: int, lo: int, ready, pend, comm, net, pp_mult) -> None:
        """One micro-batch transfer from stage src to dst (channel between stages lo, lo+1)."""
        lay, rng = self.lay, self.rng
        dur = self.pp_time[lo] * pp_mult[lo] * rng.lognormal(0.0, 0.04, pp_mult[lo].shape)
        xs = np.maximum(pend[src], ready[dst])
        xe = xs + dur
        seq = self.pp_seq[lo].copy()
        self.pp_seq[lo] += 1
        gid = lay.pp_gids(lo)
        self._rec(OP_SEND, lay.grid[src], pend[src], xe, gid, seq, self.pp_bytes, lay.grid[dst])
        self._rec(OP_RECV, lay.grid[dst], ready[dst], xe, gid, seq, self.pp_bytes, lay.grid[src])
        comm[src] += xe - pend[src]
        comm[dst] += xe - ready[dst]
        cross = lay.pp_cross[lo] * self.pp_bytes
        net[src] += cross
        net[dst] += cross
        ready[src] = xe
        ready[dst] = xe

    def _tp(self, p: int, arrive, comm):
        """TP all-reduce inside stage p: everyone leaves when the last member's data is in."""
        lay, rng = self.lay, self.rng
        D, T = arrive.shape
        end = (arrive.max(axis=1, keepdims=True)
               + self.tp_s * rng.lognormal(0.0, 0.05, (D, 1))
               + rng.exponential(3e-6, (D, T)))
        gid = self.lay.n_dp_groups + p * D + np.arange(D)[:, None]
        self._rec(OP_AR, lay.grid[p], arrive, end, gid, self.tp_seq[p], self.tp_bytes)
        self.tp_seq[p] += 1
        comm[p] += end - arrive
        return end

    def _collective_dp(self, op: int, arrive, nbytes: int, t_op, comm):
        P, D, T = self.shape
        rng = self.rng
        jitter = rng.lognormal(0.0, 0.05, (P, 1, T))
        jitter *= np.where(rng.random((P, 1, T)) < 0.01, rng.uniform(1.5, 3.0, (P, 1, T)), 1.0)
        end = arrive.max(axis=1, keepdims=True) + t_op * jitter + rng.exponential(1e-5, self.shape)
        gid = np.arange(P)[:, None, None] * T + np.arange(T)[None, None, :]
        self._rec(op, self.lay.grid, arrive, end, gid, self.dp_seq, nbytes)
        self.dp_seq += 1
        comm += end - arrive
        return end

    def _dp(self, ready, comp, comm, net, cm, eff: Effects):
        """Gradient sync over each DP group, then the optimizer step."""
        lay, job, rng = self.lay, self.job, self.rng
        D = self.shape[1]
        opt = self.opt_s * cm * rng.lognormal(0.0, 0.02, self.shape)
        if D == 1:
            comp += opt
            return ready + opt
        mult = np.where(lay.dp_cross, group_mult(eff, lay.grid), 1.0)  # (P, T)
        t_op = self.dp_time * mult[:, None, :]
        moved = _ring(D) * self.dp_bytes * lay.dp_cross[:, None, :]
        if job.dp_op == "allreduce":
            for _ in range(job.buckets):
                ready = self._collective_dp(OP_AR, ready, self.dp_bytes, t_op, comm)
                net += moved
            comp += opt
            return ready + opt
        ready = self._collective_dp(OP_RS, ready, self.dp_bytes, t_op, comm)
        opt = opt / D  # ZeRO: each replica updates its shard only
        comp += opt
        ready = self._collective_dp(OP_AG, ready + opt, self.dp_bytes, t_op, comm)
        net += moved
        return ready
