"""Root cause of a located fail-slow, from the culprit's device telemetry
compared with its peers (the other devices of the job) and with its own past.

Each candidate cause gets a score (>= 1 means the telemetry supports it; the
larger, the stronger) and the metrics behind it, which go into the incident's
evidence. Explicit signals win over symptoms: a thermal/power reason bit, an
XID, a PCIe link below its maximum explain a lower clock, so a clock drop is
blamed on ``gpu_clock`` only when nothing explains it (see ``TIERS``). Every comparison is a
ratio or a robust z-score against the peers, never an absolute constant.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from models.telemetry import Device, TelemetryStore

THERMAL_BITS = 0x20 | 0x40
POWER_BITS = 0x04 | 0x80
HW_SLOWDOWN = 0x08
CONGESTION = ("rx_pause_total", "tx_pause_total", "cnp_sent_total", "cnp_handled_total",
              "ecn_marked_total", "xmit_wait_total")
NIC_ERRORS = ("rx_errors_total", "tx_errors_total", "rx_drops_total", "symbol_errors_total",
              "link_downed_total", "out_of_sequence_total")
GPU_ERROR_COUNTERS = ("ecc_dbe_total", "ecc_sbe_total", "pcie_replay_total",
                      "nvlink_crc_errors_total")
# Tiers of causes, strongest explanation first; within a tier the higher score wins.
TIERS = (("gpu_errors", "pcie_degraded", "gpu_thermal", "gpu_power", "nic_errors",
          "nic_congestion"), ("cpu_contention",), ("input_stall",), ("gpu_clock",))
Scores = dict[str, tuple[float, dict[str, Any]]]


def _peer_stats(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    med = float(np.median(arr))
    return med, 1.4826 * float(np.median(np.abs(arr - med)))


def _gauge_z(dev: Device, peers: list[Device], name: str) -> tuple[float, dict[str, Any]] | None:
    """Robust z of a gauge vs the peers (spread floored at 2% of the median)."""
    x = dev.gauges.get(name)
    vals = [p.gauges[name] for p in peers if name in p.gauges]
    if x is None or len(vals) < 2:
        return None
    med, mad = _peer_stats(vals)
    scale = max(mad, 0.02 * abs(med), 1e-9)
    info = {"value": round(x, 3), "peer_median": round(med, 3),
            "own_past": round(dev.first.get(name, x), 3)}
    return (x - med) / scale, info


def _rate_ratio(dev: Device, peers: list[Device], names: tuple[str, ...]) -> tuple[float, dict]:
    """How many times the peers' typical rate the device's counters grow (max over names)."""
    best, ev = 0.0, {}
    for name in names:
        r = dev.rates.get(name, 0.0)
        if r <= 0:
            continue
        vals = [p.rates.get(name, 0.0) for p in peers]
        ref = float(np.percentile(vals, 75)) if vals else 0.0
        ratio = r / max(ref, 0.01 * r)
        if ratio > best:
            best = ratio
        ev[name] = {"rate_per_s": round(r, 3), "peer_p75": round(ref, 3), "ratio": round(ratio, 1)}
    return best, ev


def gpu_scores(dev: Device, peers: list[Device]) -> Scores:
    out: Scores = {}
    peer_reasons = [p.reasons for p in peers]

    def rare(bits: int) -> bool:     # set here, and on at most a quarter of the peers
        return bool(dev.reasons & bits) and sum(1 for r in peer_reasons if r & bits) <= len(peers) / 4
    if rare(THERMAL_BITS):
        out["gpu_thermal"] = (3.0, {"clocks_event_reasons": hex(dev.reasons)})
    if rare(POWER_BITS):
        out["gpu_power"] = (3.0, {"clocks_event_reasons": hex(dev.reasons)})
    temp = _gauge_z(dev, peers, "temp_c")
    if temp and temp[0] >= 4 and "gpu_thermal" not in out:
        out["gpu_thermal"] = (temp[0] / 4, {"temp_c": temp[1]})
    limit = _gauge_z(dev, peers, "power_limit_w")
    if limit and limit[0] <= -4 and "gpu_power" not in out:
        out["gpu_power"] = (-limit[0] / 4, {"power_limit_w": limit[1]})
    if dev.xids:
        out["gpu_errors"] = (5.0, {"xid": sorted(set(dev.xids))[:8]})
    ratio, ev = _rate_ratio(dev, peers, GPU_ERROR_COUNTERS)
    if ratio >= 5 and "gpu_errors" not in out:
        out["gpu_errors"] = (min(ratio / 5, 5.0), ev)
    g = dev.gauges
    for cur, top in (("pcie_gen", "pcie_max_gen"), ("pcie_width", "pcie_max_width")):
        if cur in g and top in g and g[cur] < g[top] - 0.5:
            out["pcie_degraded"] = (4.0, {cur: g[cur], top: g[top]})
    for name in ("pcie_gen", "pcie_width"):
        z = _gauge_z(dev, peers, name)
        if z and z[0] <= -4 and "pcie_degraded" not in out:
            out["pcie_degraded"] = (3.0, {name: z[1]})
    clock = _gauge_z(dev, peers, "sm_clock_mhz")
    if clock and clock[0] <= -4:
        out["gpu_clock"] = (-clock[0] / 4, {"sm_clock_mhz": clock[1]})
    elif dev.reasons & HW_SLOWDOWN and rare(HW_SLOWDOWN):
        out["gpu_clock"] = (2.0, {"clocks_event_reasons": hex(dev.reasons)})
    return out


def host_scores(dev: Device, peers: list[Device]) -> Scores:
    out: Scores = {}
    best, ev = 0.0, {}
    for name in ("cpu_steal_pct", "load1", "procs_running", "cpu_util_pct"):
        z = _gauge_z(dev, peers, name)
        if z and z[0] >= 4:
            ev[name] = z[1]
            best = max(best, z[0] / 4)
    if best >= 1:
        out["cpu_contention"] = (best, ev)
    return out


def nic_scores(devs: list[Device], peers: list[Device]) -> Scores:
    out: Scores = {}
    for dev in devs:
        ratio, ev = _rate_ratio(dev, peers, CONGESTION)
        if ratio >= 5 and ratio / 5 > out.get("nic_congestion", (0.0, {}))[0]:
            out["nic_congestion"] = (min(ratio / 5, 5.0), ev)
        ratio, ev = _rate_ratio(dev, peers, NIC_ERRORS)
        if dev.down:
            ratio, ev = max(ratio, 25.0), {**ev, "state": "down"}
        speed = _gauge_z(dev, peers, "speed_gbps")
        if speed and speed[0] <= -4:
            ratio, ev = max(ratio, 10.0), {**ev, "speed_gbps": speed[1]}
        if ratio >= 5 and ratio / 5 > out.get("nic_errors", (0.0, {}))[0]:
            out["nic_errors"] = (min(ratio / 5, 5.0), ev)
    return out


def attribute(fault: str, store: TelemetryStore, hosts: list[str], gpus: list[tuple[str, int]],
              job_hosts: set[str], data_share: float) -> tuple[str, dict[str, Any]]:
    """Pick the root cause of a located fault.

    ``hosts`` / ``gpus`` are the culprit's devices; ``job_hosts`` bound the
    peers; ``data_share`` is the part of the culprit's extra time spent waiting
    for input (0..1). Returns ``(root_cause, evidence)``.
    """
    scores: Scores = {}
    if data_share >= 0.5:
        scores["input_stall"] = (2.0 * data_share, {"data_share_of_excess": round(data_share, 2)})
    if fault in ("slow_rank", "slow_host"):
        peers_g = [d for (h, i), d in store.gpus.items() if h in job_hosts and (h, i) not in gpus]
        for key in gpus:
            dev = store.gpus.get(key)
            if dev is not None:
                for cause, val in gpu_scores(dev, peers_g).items():
                    if val[0] > scores.get(cause, (0.0, {}))[0]:
                        scores[cause] = (val[0], {"gpu": f"{key[0]}:{key[1]}", **val[1]})
        peers_h = [d for h, d in store.hosts.items() if h in job_hosts and h not in hosts]
        for h in hosts:
            if h in store.hosts:
                scores.update(host_scores(store.hosts[h], peers_h))
    if fault == "slow_link":
        mine = [d for h in hosts for d in store.nics_of(h)]
        peers_n = [d for (h, _, _), d in store.nics.items() if h in job_hosts and h not in hosts]
        scores.update(nic_scores(mine, peers_n))
    evidence = {c: {"score": round(s, 2), **ev} for c, (s, ev) in scores.items()}
    strong = {c: s for c, (s, _) in scores.items() if s >= 1.0}
    if not strong:
        return "unknown", evidence
    for tier in TIERS:
        pool = {c: s for c, s in strong.items() if c in tier}
        if pool:
            return max(pool, key=lambda c: pool[c]), evidence
    return "unknown", evidence
