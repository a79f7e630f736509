"""Turn simulated arrays into CONTRACT.md v1 event tables (see ``simulator.jsonl``).

Columns are rounded in numpy (µs for times) and stay arrays: ``Table.dicts()``
zips them into event dicts, ``Table.lines()`` formats them into JSON Lines
without building a dict. Field order is the CONTRACT.md order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.comm import DEFAULT_WINDOW_S, comm_table
from simulator.jsonl import Choices, Const, Num, Pick, Table

if TYPE_CHECKING:
    from simulator.physics import StepOut
    from simulator.telemetry import Telemetry
    from simulator.topology import Layout

OP_NAMES = Choices(["allreduce", "reducescatter", "allgather", "send", "recv"])
CORES_LOAD = 128.0  # host cores: load1 under full contention is about this many
_NIC_STATE = Choices(["up", "down"])
_NO_XID = Choices([[]])


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


def gpu_table(tel: Telemetry, base: float, sm, util, fc, power, limit, reasons, width, gen,
              tx, rx, xid: dict[int, list[int]]) -> Table:
    n = len(sm)
    rng = tel.rng
    ts = np.round(base + tel.phase[tel.host_of] + 0.0004 * tel.local, 6)
    mem_util = np.clip(np.round(fc * 38.0 + rng.normal(0, 1.0, n)), 0, 100)
    mem_used = np.where(tel.active, 6.2e10 + tel.local * 1.3e8, 5.1e8).astype(np.int64)
    xids, which = _NO_XID, np.zeros(n, dtype=np.int64)
    if xid:
        xids = Choices([[], *xid.values()])
        which[list(xid)] = np.arange(1, len(xid) + 1)
    return Table([
        ("v", Const(1)), ("kind", Const("gpu")), ("ts", Num(ts, 6)),
        ("host", Pick(tel.host_of, tel.host_names)), ("gpu", Num(tel.local)),
        ("uuid", Pick(tel.index, tel.uuids)), ("sm_clock_mhz", Num(sm, 0)),
        ("max_sm_clock_mhz", Const(1980.0)), ("mem_clock_mhz", Const(2619.0)),
        ("util_pct", Num(util.astype(np.int64))), ("mem_util_pct", Num(mem_util, 0)),
        ("power_w", Num(np.round(power, 1), 1)), ("power_limit_w", Num(np.round(limit, 1), 1)),
        ("temp_c", Num(np.round(tel.temp, 1), 1)),
        ("clocks_event_reasons", Num(reasons.astype(np.int64))), ("pcie_gen", Num(gen)),
        ("pcie_width", Num(width)), ("pcie_max_gen", Const(5)), ("pcie_max_width", Const(16)),
        ("pcie_tx_bytes_s", Num(np.round(tx), 0)), ("pcie_rx_bytes_s", Num(np.round(rx), 0)),
        ("pcie_replay_total", Num(tel.pcie_replay.copy())),
        ("ecc_sbe_total", Num(tel.ecc_sbe.astype(np.int64))),
        ("ecc_dbe_total", Num(tel.ecc_dbe.copy())), ("xid", Pick(which, xids)),
        ("nvlink_crc_errors_total", Const(0)), ("mem_used_bytes", Num(mem_used)),
        ("job_id", Pick(tel.job + 1, tel.job_names)),
        ("rank", Pick(tel.rank + 1, tel.rank_names))], ts)


def nic_table(tel: Telemetry, base: float, down: np.ndarray) -> Table:
    c = tel.nic
    ts = np.round(base + tel.phase[tel.host_of] + 0.0002, 6)
    tx, rx = c["tx"].copy(), c["rx"].copy()
    fields: list = [
        ("v", Const(1)), ("kind", Const("nic")), ("ts", Num(ts, 6)),
        ("host", Pick(tel.host_of, tel.host_names)), ("nic", Pick(tel.local, tel.nic_names)),
        ("port", Const(1)), ("tx_bytes_total", Num(tx)), ("rx_bytes_total", Num(rx)),
        ("state", Pick(down.astype(np.int64), _NIC_STATE)), ("speed_gbps", Const(400.0)),
        ("tx_packets_total", Num(tx >> 12)), ("rx_packets_total", Num(rx >> 12))]
    fields += [(name, Const(0) if key is None else Num(c[key].astype(np.int64))) for name, key in (
        ("rx_errors_total", "rx_err"), ("tx_errors_total", None), ("rx_drops_total", "drops"),
        ("tx_pause_total", "pause_tx"), ("rx_pause_total", "pause_rx"),
        ("cnp_sent_total", "cnp_sent"), ("cnp_handled_total", "cnp_handled"),
        ("ecn_marked_total", "ecn"), ("out_of_sequence_total", "oos"),
        ("link_downed_total", "down"), ("symbol_errors_total", "sym"),
        ("xmit_wait_total", "xmit_wait"))]
    return Table(fields, ts)


def host_table(tel: Telemetry, base: float, cpu_busy, iowait, ckpt) -> Table:
    rng, H = tel.rng, tel.H
    ckpt_host = ckpt.reshape(H, tel.G).any(axis=1)
    running = tel.active.reshape(H, tel.G).sum(axis=1)
    base_util = 3.0 + 2.6 * running + rng.normal(0, 1.5, H) + 15.0 * ckpt_host
    util = np.clip(np.maximum(base_util, 100.0 * cpu_busy + rng.normal(0, 1.0, H)), 0, 100)
    wait = np.clip(0.4 + iowait + 6.0 * ckpt_host + rng.gamma(2.0, 0.2, H), 0, 100)
    load = np.maximum(0.0, util / 100.0 * CORES_LOAD + rng.normal(0, 1.0, H))
    load = np.where(cpu_busy > 0, CORES_LOAD * (1.0 + cpu_busy), load)
    procs = np.maximum(1, np.round(load * 0.8)).astype(np.int64)
    mem = (1.9e12 - running * 2.4e10 + rng.normal(0, 2e9, H)).astype(np.int64)
    ts = np.round(base + tel.phase + 0.0001, 6)
    return Table([
        ("v", Const(1)), ("kind", Const("host")), ("ts", Num(ts, 6)),
        ("host", Pick(np.arange(H), tel.host_names)),
        ("cpu_util_pct", Num(np.round(util, 1), 1)), ("cpu_iowait_pct", Num(np.round(wait, 2), 2)),
        ("cpu_steal_pct", Const(0.0)), ("load1", Num(np.round(load, 2), 2)),
        ("mem_available_bytes", Num(mem)), ("procs_running", Num(procs))], ts)
