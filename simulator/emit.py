"""Turn simulated arrays into CONTRACT.md v1 event dicts, fast.

Columns are rounded in numpy (µs for times), converted once with ``tolist()``
and zipped into dict literals: no per-event numpy scalars, no per-field calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simulator.physics import StepOut
    from simulator.telemetry import Telemetry
    from simulator.topology import Layout

OP_NAMES = ("allreduce", "reducescatter", "allgather", "send", "recv")
CORES_LOAD = 128.0  # host cores: load1 under full contention is about this many


def step_and_collective_events(job_id: str, lay: Layout, hosts: list[str], out: StepOut,
                               tokens: int, skew: np.ndarray) -> tuple[list[dict], np.ndarray]:
    """All step and collective events of one step of one job in ts order, and their ts.

    ``skew`` (per rank, seconds) is the offset of the rank's host clock: every host
    stamps its own events, and host clocks disagree by about a millisecond."""
    W = lay.world
    end = np.round(out.end + skew, 6)
    dur = np.round(out.end - out.t0, 7).tolist()
    comp = np.round(out.compute, 7).tolist()
    comm = np.round(out.comm, 7).tolist()
    data = np.round(out.data, 7).tolist()
    rank_host = [hosts[h] for h in lay.host_index.tolist()]
    gpu = lay.gpu.tolist()
    step = out.step
    steps = [
        {"v": 1, "kind": "step", "ts": ts, "job_id": job_id, "rank": r, "world_size": W,
         "host": h, "step": step, "duration_s": d, "gpu": g, "compute_s": c, "comm_s": m,
         "data_s": x, "tokens": tokens, "dp_rank": dr, "pp_rank": pr, "tp_rank": tr}
        for r, ts, h, d, g, c, m, x, dr, pr, tr in zip(
            range(W), end.tolist(), rank_host, dur, gpu, comp, comm, data,
            lay.dp_rank.tolist(), lay.pp_rank.tolist(), lay.tp_rank.tolist(), strict=True)]
    col = out.coll
    if not len(col["rank"]):
        order = np.argsort(end, kind="stable")
        return [steps[i] for i in order.tolist()], end[order]
    cskew = skew[col["rank"]]
    cend = np.round(col["end"] + cskew, 6)
    order = np.argsort(cend, kind="stable")
    ranks = col["rank"][order]
    start = np.round(col["start"][order] + cskew[order], 6)
    cend = cend[order]
    cdur = np.round(cend - start, 7).tolist()
    gids = col["gid"][order].tolist()
    names = lay.group_names
    n_dp, n_tp = lay.n_dp_groups, lay.n_tp_groups
    sizes = [lay.dp if g < n_dp else lay.tp if g < n_dp + n_tp else 2 for g in range(len(names))]
    peers = col["peer"][order].tolist()
    colls = [
        {"v": 1, "kind": "collective", "ts": ts, "job_id": job_id, "rank": r,
         "host": rank_host[r], "group": names[gi], "group_size": sizes[gi], "op": OP_NAMES[op],
         "seq": sq, "start_ts": st, "duration_s": d, "bytes": b, "step": step,
         "peer": None if pe < 0 else pe, "gpu": gpu[r]}
        for ts, r, gi, op, sq, st, d, b, pe in zip(
            cend.tolist(), ranks.tolist(), gids, col["op"][order].tolist(),
            col["seq"][order].tolist(), start.tolist(), cdur, col["bytes"][order].tolist(),
            peers, strict=True)]
    both = colls + steps
    ts_all = np.concatenate([cend, end])
    order = np.argsort(ts_all, kind="stable")
    return [both[i] for i in order.tolist()], ts_all[order]


def gpu_events(tel: Telemetry, base: float, sm, util, fc, power, limit, reasons, width, gen,
               tx, rx, xid: dict[int, list[int]]) -> list[dict]:
    n = len(sm)
    rng = tel.rng
    ts = np.round(base + tel.phase[tel.host_of] + 0.0004 * tel.local, 6).tolist()
    mem_util = np.clip(np.round(fc * 38.0 + rng.normal(0, 1.0, n)), 0, 100).tolist()
    mem_used = np.where(tel.active, 6.2e10 + tel.local * 1.3e8, 5.1e8).astype(np.int64).tolist()
    hosts = tel.hosts
    empty: list[int] = []
    return [
        {"v": 1, "kind": "gpu", "ts": t, "host": hosts[h], "gpu": g, "uuid": u,
         "sm_clock_mhz": s, "max_sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0,
         "util_pct": ut, "mem_util_pct": mu, "power_w": p, "power_limit_w": lim,
         "temp_c": tc, "clocks_event_reasons": rs, "pcie_gen": ge, "pcie_width": wd,
         "pcie_max_gen": 5, "pcie_max_width": 16, "pcie_tx_bytes_s": tb, "pcie_rx_bytes_s": rb,
         "pcie_replay_total": pr, "ecc_sbe_total": sb, "ecc_dbe_total": db,
         "xid": xid.get(i, empty), "nvlink_crc_errors_total": 0, "mem_used_bytes": mem,
         "job_id": j, "rank": r}
        for i, t, h, g, u, s, ut, mu, p, lim, tc, rs, ge, wd, tb, rb, pr, sb, db, mem, j, r
        in zip(range(n), ts, tel.host_of.tolist(), tel.local.tolist(), tel.uuids, sm.tolist(),
               util.astype(np.int64).tolist(), mem_util, np.round(power, 1).tolist(),
               np.round(limit, 1).tolist(), np.round(tel.temp, 1).tolist(),
               reasons.astype(np.int64).tolist(), gen.tolist(), width.tolist(),
               np.round(tx).tolist(), np.round(rx).tolist(), tel.pcie_replay.tolist(),
               tel.ecc_sbe.astype(np.int64).tolist(), tel.ecc_dbe.tolist(), mem_used, tel.job,
               tel.rank, strict=True)]


def nic_events(tel: Telemetry, base: float, down: np.ndarray) -> list[dict]:
    c = tel.nic
    ts = np.round(base + tel.phase[tel.host_of] + 0.0002, 6).tolist()
    hosts = tel.hosts
    names = [f"mlx5_{k}" for k in range(tel.G)]
    cols = [c[k].astype(np.int64).tolist() for k in (
        "tx", "rx", "pause_tx", "pause_rx", "cnp_sent", "cnp_handled", "ecn", "oos", "down",
        "sym", "rx_err", "drops", "xmit_wait")]
    return [
        {"v": 1, "kind": "nic", "ts": t, "host": hosts[h], "nic": names[k], "port": 1,
         "tx_bytes_total": tx, "rx_bytes_total": rx, "state": "down" if dn else "up",
         "speed_gbps": 400.0, "tx_packets_total": tx >> 12, "rx_packets_total": rx >> 12,
         "rx_errors_total": re, "tx_errors_total": 0, "rx_drops_total": dr,
         "tx_pause_total": pt, "rx_pause_total": pr, "cnp_sent_total": cs,
         "cnp_handled_total": ch, "ecn_marked_total": ec, "out_of_sequence_total": oo,
         "link_downed_total": ld, "symbol_errors_total": sy, "xmit_wait_total": xw}
        for t, h, k, dn, tx, rx, pt, pr, cs, ch, ec, oo, ld, sy, re, dr, xw in zip(
            ts, tel.host_of.tolist(), tel.local.tolist(), down.tolist(), *cols, strict=True)]


def host_events(tel: Telemetry, base: float, cpu_busy, iowait, ckpt) -> list[dict]:
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
    ts = np.round(base + tel.phase + 0.0001, 6).tolist()
    return [
        {"v": 1, "kind": "host", "ts": t, "host": h, "cpu_util_pct": u, "cpu_iowait_pct": w,
         "cpu_steal_pct": 0.0, "load1": ld, "mem_available_bytes": m, "procs_running": p}
        for t, h, u, w, ld, m, p in zip(ts, tel.hosts, np.round(util, 1).tolist(),
                                        np.round(wait, 2).tolist(), np.round(load, 2).tolist(),
                                        mem.tolist(), procs.tolist(), strict=True)]
