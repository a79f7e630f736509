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

from typing import Any, cast

import numpy as np

from failslow.models.config import CauseConfig
from failslow.models.stats import median
from failslow.models.telemetry import (
    GPU_COUNTERS,
    GPU_GAUGES,
    REASON_GROUPS,
    Device,
    GpuTable,
    TelemetryStore,
)

CONGESTION = ("rx_pause_total", "tx_pause_total", "cnp_sent_total", "cnp_handled_total",
              "ecn_marked_total", "xmit_wait_total")
NIC_ERRORS = ("rx_errors_total", "tx_errors_total", "rx_drops_total", "symbol_errors_total",
              "link_downed_total", "out_of_sequence_total")
GPU_ERROR_COUNTERS = ("ecc_dbe_total", "ecc_sbe_total", "nvlink_crc_errors_total")
# Tiers of causes, strongest explanation first; within a tier the higher score wins.
TIERS = (("gpu_errors", "pcie_degraded", "gpu_thermal", "gpu_power", "nic_errors",
          "nic_congestion"), ("cpu_contention",), ("input_stall",), ("gpu_clock",))
Scores = dict[str, tuple[float, dict[str, Any]]]
REASON_NAMES = tuple(REASON_GROUPS)     # a ``GpuTable``'s reason columns, in order
# Thresholds: ``CauseConfig`` (``[rules.causes]``). ``sparse_floor_per_s``: error counters
# that stay at zero on healthy devices (ECC, PCIe replays) count as a rate from one event
# a minute up, so a lone correctable error is no fault. ``nic_outlier``: a NIC is congested
# / erroring when ``nic_agree`` of its counters grow this many times faster than the job's
# typical NIC (incast bursts on healthy ports reach ~30x for one sample; smoothing spreads
# that below 20x, real congestion is orders of magnitude above).


def _peer_stats(values: list[float] | np.ndarray) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    med = median(arr)
    return med, 1.4826 * median(np.abs(arr - med))


class Peers:
    """A device's peers as the scores read them: per name, the peers' values as one float
    array (``reasons`` / ``rates``: 0 where a peer has none; ``gauges``: the peers that
    have it), and the order statistics taken of them, each once (``memo``): they do not
    depend on the peers' order, so the same numbers as from a list of ``Device``s, in
    whatever order. ``of_table``: the GPUs of a ``GpuTable`` by row, read as columns (issue
    31: at 131,072 GPUs each root cause walked every GPU's dicts a dozen times)."""

    def __init__(self, devs: list[Any]) -> None:
        self.devs = devs
        self.table: GpuTable | None = None
        self.rows = np.zeros(0, dtype=np.int64)
        self.memo: dict[tuple[str, str], Any] = {}

    @classmethod
    def of_table(cls, table: GpuTable, rows: np.ndarray) -> Peers:
        p = cls([])
        p.table, p.rows = table, rows
        return p

    def __len__(self) -> int:
        return len(self.devs) if self.table is None else int(self.rows.size)

    def _column(self, part: str, name: str) -> np.ndarray:
        """Part ``part`` (``gauges``, ``rates``, ``reasons``) of every peer for ``name``:
        NaN where a peer has none."""
        t = self.table
        if t is None:
            return np.array([getattr(p, part).get(name, np.nan) for p in self.devs],
                            dtype=float)
        names = {"gauges": GPU_GAUGES, "rates": GPU_COUNTERS, "reasons": REASON_NAMES}[part]
        if name not in names:
            return np.full(self.rows.size, np.nan)
        return getattr(t, part)[self.rows, names.index(name)]

    def typical_reason(self, group: str) -> float:
        """The middle (upper) of the peers' shares of ``group`` (0 where none), 0 for none."""
        key = ("reason", group)
        if key not in self.memo:
            col = self._column("reasons", group)
            theirs = np.sort(np.where(np.isnan(col), 0.0, col))
            self.memo[key] = float(theirs[theirs.size // 2]) if theirs.size else 0.0
        return cast(float, self.memo[key])

    def gauge(self, name: str) -> tuple[int, float, float]:
        """(how many peers have gauge ``name``, their median, their MAD spread)."""
        key = ("gauge", name)
        if key not in self.memo:
            col = self._column("gauges", name)
            vals = col[~np.isnan(col)]
            self.memo[key] = (vals.size, *_peer_stats(vals)) if vals.size >= 2 \
                else (vals.size, 0.0, 0.0)
        return cast(tuple[int, float, float], self.memo[key])

    def rate_p25(self, name: str) -> float:
        """``lower_quartile`` of the peers' rates of ``name`` (0 where none)."""
        key = ("rate", name)
        if key not in self.memo:
            col = self._column("rates", name)
            vals = np.where(np.isnan(col), 0.0, col)
            self.memo[key] = float(np.sort(vals)[(vals.size - 1) // 4]) if vals.size else 0.0
        return cast(float, self.memo[key])


def _peers(peers: list[Any] | Peers) -> Peers:
    return peers if isinstance(peers, Peers) else Peers(peers)


def _gauge_z(dev: Device, peers: list[Device] | Peers, name: str, floor: float
             ) -> tuple[float, dict[str, Any]] | None:
    """Robust z of a gauge vs the peers (spread floored at ``floor``, 2 %, of the median:
    ``CauseConfig.gauge_floor``)."""
    x = dev.gauges.get(name)
    if x is None:
        return None
    count, med, mad = _peers(peers).gauge(name)
    if count < 2:
        return None
    scale = max(mad, floor * abs(med), 1e-9)
    info = {"value": round(x, 3), "peer_median": round(med, 3),
            "own_past": round(dev.first.get(name, x), 3)}
    return (x - med) / scale, info


def lower_quartile(vals: list[float]) -> float:
    """25th percentile (nearest rank) of a small list; 0 for an empty one."""
    if not vals:
        return 0.0
    vals = sorted(vals)
    return vals[(len(vals) - 1) // 4]


def lower_quartiles(rows: np.ndarray) -> np.ndarray:
    """``lower_quartile`` of each row of a non-empty matrix, in one numpy pass."""
    return np.sort(rows, axis=1)[:, (rows.shape[1] - 1) // 4]


def rate_ratio(dev: Device, peers: list[Device] | Peers, names: tuple[str, ...],
               agree: int = 1, floor_per_s: float = 0.0, share: float | None = None
               ) -> tuple[float, dict]:
    """How many times the peers' typical rate the device's counters grow: the
    ``agree``-th largest ratio over ``names`` (0 when fewer counters grow), so a
    single sparse counter ticking once cannot make a device look faulty. The
    reference is at least ``floor_per_s``: for error counters that are zero on
    healthy peers, one stray increment is no rate; and at least ``share`` of the
    device's own rate (``CauseConfig.ref_floor``)."""
    share = CauseConfig().ref_floor if share is None else share
    ratios, ev = [], {}
    peers = _peers(peers)
    for name in names:
        r = dev.rates.get(name, 0.0)
        if r <= 0:
            continue
        # The peers' lower quartile: clean even when half the peers share the fault.
        ref = peers.rate_p25(name)
        ratio = r / max(ref, share * r, floor_per_s)
        ratios.append(ratio)
        ev[name] = {"rate_per_s": round(r, 3), "peer_p25": round(ref, 3), "ratio": round(ratio, 1)}
    ratios.sort(reverse=True)
    return (ratios[agree - 1] if len(ratios) >= agree else 0.0), ev


def gpu_scores(dev: Device, peers: list[Device] | Peers, c: CauseConfig | None = None
               ) -> Scores:
    c = c or CauseConfig()
    out: Scores = {}
    peers = _peers(peers)

    def throttled(group: str) -> bool:
        """A clock-event reason held on most recent samples here, on few peers'."""
        mine = dev.reasons.get(group, 0.0)
        return mine >= c.reason_share and peers.typical_reason(group) < c.reason_peer_max
    if throttled("thermal"):
        out["gpu_thermal"] = (c.reason_score, {"thermal_reason_share": round(dev.reasons["thermal"], 2)})
    if throttled("power"):
        out["gpu_power"] = (c.reason_score, {"power_reason_share": round(dev.reasons["power"], 2)})
    temp = _gauge_z(dev, peers, "temp_c", c.gauge_floor)
    zb = c.gauge_z
    if temp and temp[0] >= zb and "gpu_thermal" not in out:
        out["gpu_thermal"] = (temp[0] / zb, {"temp_c": temp[1]})
    limit = _gauge_z(dev, peers, "power_limit_w", c.gauge_floor)
    if limit and limit[0] <= -zb and "gpu_power" not in out:
        out["gpu_power"] = (-limit[0] / zb, {"power_limit_w": limit[1]})
    if dev.xids:
        out["gpu_errors"] = (c.xid_score, {"xid": sorted(set(dev.xids))[:8]})
    ratio, ev = rate_ratio(dev, peers, GPU_ERROR_COUNTERS, floor_per_s=c.sparse_floor_per_s,
                           share=c.ref_floor)
    if ratio >= c.error_ratio and "gpu_errors" not in out:
        out["gpu_errors"] = (min(ratio / c.error_ratio, c.score_max), ev)
    g = dev.gauges
    for cur, top in (("pcie_gen", "pcie_max_gen"), ("pcie_width", "pcie_max_width")):
        if cur in g and top in g and g[cur] < g[top] - 0.5:
            out["pcie_degraded"] = (c.pcie_down_score, {cur: g[cur], top: g[top]})
    ratio, ev = rate_ratio(dev, peers, ("pcie_replay_total",),
                           floor_per_s=c.sparse_floor_per_s, share=c.ref_floor)
    if ratio >= c.error_ratio and "pcie_degraded" not in out:
        out["pcie_degraded"] = (min(ratio / c.error_ratio, c.replay_score_max), ev)
    for name in ("pcie_gen", "pcie_width"):
        z = _gauge_z(dev, peers, name, c.gauge_floor)
        if z and z[0] <= -zb and "pcie_degraded" not in out:
            out["pcie_degraded"] = (c.pcie_gauge_score, {name: z[1]})
    clock = _gauge_z(dev, peers, "sm_clock_mhz", c.gauge_floor)
    if clock and clock[0] <= -zb:
        out["gpu_clock"] = (-clock[0] / zb, {"sm_clock_mhz": clock[1]})
    elif throttled("hw_slowdown"):
        out["gpu_clock"] = (c.hw_slowdown_score,
                            {"hw_slowdown_share": round(dev.reasons["hw_slowdown"], 2)})
    return out


def host_scores(dev: Device, peers: list[Device], c: CauseConfig | None = None) -> Scores:
    """CPU contention: load, runnable processes or CPU use well above both the
    other hosts of the job and this host's own past (ratio >= ``c.cpu_ratio``, 1.5,
    scores 1)."""
    c = c or CauseConfig()
    out: Scores = {}
    best, ev = 0.0, {}
    for name in ("cpu_steal_pct", "load1", "procs_running", "cpu_util_pct"):
        x = dev.gauges.get(name)
        if x is None:
            continue
        refs = [p.gauges[name] for p in peers if name in p.gauges]
        ref = max(median(refs) if refs else 0.0, dev.first.get(name, 0.0))
        if ref <= 0 and x <= 0:
            continue
        ratio = x / max(ref, c.cpu_ref_floor * x, 1e-9)
        if ratio >= c.cpu_ratio:
            ev[name] = {"value": round(x, 2), "reference": round(ref, 2), "ratio": round(ratio, 2)}
            best = max(best, min((ratio - 1.0) / (c.cpu_ratio - 1.0), c.score_max))
    if best >= 1:
        out["cpu_contention"] = (best, ev)
    return out


def nic_scores(devs: list[Device], peers: list[Device] | Peers, c: CauseConfig | None = None
               ) -> Scores:
    c = c or CauseConfig()
    bar = c.nic_outlier
    out: Scores = {}
    peers = _peers(peers)       # each statistic of the peers once, for all of ``devs``
    for dev in devs:
        ratio, ev = rate_ratio(dev, peers, CONGESTION, c.nic_agree, share=c.ref_floor)
        if ratio >= bar and ratio / bar > out.get("nic_congestion", (0.0, {}))[0]:
            out["nic_congestion"] = (ratio / bar, ev)
        ratio, ev = rate_ratio(dev, peers, NIC_ERRORS, c.nic_agree, share=c.ref_floor)
        if dev.down:
            ratio, ev = max(ratio, 2 * bar), {**ev, "state": "down"}
        speed = _gauge_z(dev, peers, "speed_gbps", c.gauge_floor)
        if speed and speed[0] <= -c.gauge_z:
            ratio, ev = max(ratio, 2 * bar), {**ev, "speed_gbps": speed[1]}
        if ratio >= bar and ratio / bar > out.get("nic_errors", (0.0, {}))[0]:
            out["nic_errors"] = (ratio / bar, ev)
    return out


def attribute(fault: str, store: TelemetryStore, hosts: list[str], gpus: list[tuple[str, int]],
              job_hosts: set[str], data_share: float,
              nic_slots: set[tuple[str, str]] | None = None,
              c: CauseConfig | None = None) -> tuple[str, dict[str, Any]]:
    """Pick the root cause of a located fault.

    ``hosts`` / ``gpus`` are the culprit's devices; ``job_hosts`` bound the
    peers; ``nic_slots`` optionally names the culprit's NICs as (host, nic name); ``data_share`` is the part of the culprit's extra time spent waiting
    for input (0..1); ``c`` the job's thresholds. Returns ``(root_cause, evidence)``.
    """
    c = c or CauseConfig()
    scores: Scores = {}
    if data_share >= c.input_stall_share:
        scores["input_stall"] = (c.input_stall_score * data_share,
                                 {"data_share_of_excess": round(data_share, 2)})
    if fault in ("slow_rank", "slow_host"):
        everyone = store.gpus
        table = getattr(store, "table", None)
        peers_g: list[Any] | Peers
        if isinstance(table, GpuTable) and len(table.rows) == len(everyone):
            # the GPUs as the table's rows: their statistics read from its columns
            peers_g = Peers.of_table(table, np.fromiter(
                (r for k, r in table.rows.items() if k[0] in job_hosts and k not in gpus),
                dtype=np.int64))
        else:
            peers_g = [d for (h, i), d in everyone.items()
                       if h in job_hosts and (h, i) not in gpus]
        per_gpu = [(key, gpu_scores(store.gpus[key], peers_g, c)) for key in gpus
                   if key in store.gpus]
        # A host-wide fault must show on at least half of the host's GPUs.
        need = (len(per_gpu) + 1) // 2 if fault == "slow_host" else 1
        for cause in sorted({c for _, sc in per_gpu for c in sc}):
            hits = sorted(((sc[cause][0], key, sc[cause][1]) for key, sc in per_gpu
                           if cause in sc), reverse=True, key=lambda t: t[0])
            if len(hits) >= need:
                score, key, ev = hits[need - 1]
                scores[cause] = (score, {"gpu": f"{key[0]}:{key[1]}", "gpus_showing": len(hits),
                                         **ev})
        peers_h = [d for h, d in store.hosts.items() if h in job_hosts and h not in hosts]
        for h in hosts:
            if h in store.hosts:
                scores.update(host_scores(store.hosts[h], peers_h, c))
    if fault == "slow_link":
        # A rank pair's ends are its ranks' NICs (``nic_slots``), a host's all its NICs.
        def mine(key: tuple[str, str, int]) -> bool:
            return (key[0], key[1]) in nic_slots if nic_slots else key[0] in hosts
        job_nics = [(k, d) for k, d in store.nics.items() if k[0] in job_hosts]
        scores.update(nic_scores([d for k, d in job_nics if mine(k)],
                                 [d for k, d in job_nics if not mine(k)], c))
    # Sorted: the output bytes must not depend on the order causes were scored in.
    evidence = {c: {"score": round(s, 2), **ev} for c, (s, ev) in sorted(scores.items())}
    strong = {c: s for c, (s, _) in scores.items() if s >= 1.0}
    if not strong:
        return "unknown", evidence
    for tier in TIERS:
        pool = {c: s for c, s in strong.items() if c in tier}
        if pool:
            return max(pool, key=lambda c: pool[c]), evidence
    return "unknown", evidence
