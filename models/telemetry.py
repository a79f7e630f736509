"""Device telemetry state: the latest sample of every GPU, NIC port and host,
and smoothed rates of their cumulative counters.

Per sample the work is O(number of fields): store the gauge values, turn each
``*_total`` counter into a per-second rate (a decrease is a reset, never a
negative rate) smoothed exponentially, remember what the device looked like
when first seen (its own past), and collect XID codes. The root-cause
attribution (``models.rootcause``) reads this state; it never reads events.
"""

from __future__ import annotations

from typing import Any

# Only what the root-cause attribution reads (``models.rootcause``, ``models.links``)
# is kept: a sample's other fields (power draw, utilization, byte counters) decide
# nothing, and skipping them saves ~15% of the per-sample work.
GPU_GAUGES = ("sm_clock_mhz", "temp_c", "power_limit_w", "pcie_gen", "pcie_width",
              "pcie_max_gen", "pcie_max_width")
GPU_COUNTERS = ("pcie_replay_total", "ecc_sbe_total", "ecc_dbe_total", "nvlink_crc_errors_total")
# NVML clocks_event_reasons groups whose recent share of samples is tracked.
REASON_GROUPS = {"thermal": 0x20 | 0x40, "power": 0x04 | 0x80, "hw_slowdown": 0x08}
NIC_COUNTERS = ("rx_errors_total", "tx_errors_total", "rx_drops_total", "tx_pause_total",
                "rx_pause_total", "cnp_sent_total", "cnp_handled_total", "ecn_marked_total",
                "out_of_sequence_total", "link_downed_total", "symbol_errors_total",
                "xmit_wait_total")
HOST_GAUGES = ("cpu_util_pct", "cpu_steal_pct", "load1", "procs_running")
RATE_ALPHA = 0.3        # weight of the newest rate: a few samples of memory
GAUGE_ALPHA = 0.3


class Device:
    """One device: smoothed gauges, the gauges when first seen, smoothed counter
    rates (per second), the latest raw counter values, and XIDs seen."""

    __slots__ = ("gauges", "first", "rates", "last", "last_ts", "xids", "reasons", "down", "n")
    # reasons: per REASON_GROUPS name, the smoothed share of samples with a bit set (0..1),
    # so a one-sample blip (a momentary power cap) weighs little and a throttle weighs 1.

    def __init__(self) -> None:
        self.gauges: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.rates: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.last_ts = 0.0
        self.xids: list[int] = []
        self.reasons: dict[str, float] = {}
        self.down = False
        self.n = 0

    def observe(self, ev: dict[str, Any], gauges: tuple[str, ...],
                counters: tuple[str, ...]) -> None:
        ts = ev["ts"]
        g = self.gauges
        for name in gauges:
            x = ev.get(name)
            if x is not None:
                old = g.get(name)
                g[name] = x if old is None else old + GAUGE_ALPHA * (x - old)
                if self.n < 3:
                    self.first[name] = g[name]
        dt = ts - self.last_ts
        last, rates = self.last, self.rates
        for name in counters:
            x = ev.get(name)
            if x is None:
                continue
            prev = last.get(name)
            last[name] = x
            if prev is not None and dt > 0 and x >= prev:
                r = (x - prev) / dt
                old = rates.get(name)
                rates[name] = r if old is None else old + RATE_ALPHA * (r - old)
        self.last_ts = ts
        self.n += 1


class TelemetryStore:
    """Latest state of every GPU ``(host, gpu)``, NIC ``(host, nic, port)`` and host."""

    def __init__(self) -> None:
        self.gpus: dict[tuple[str, int], Device] = {}
        self.nics: dict[tuple[str, str, int], Device] = {}
        self.hosts: dict[str, Device] = {}
        self.gpu_rank: dict[tuple[str, int], int] = {}   # from gpu samples that name a rank

    def observe_gpu(self, ev: dict[str, Any]) -> None:
        key = (ev["host"], ev["gpu"])
        dev = self.gpus.get(key)
        if dev is None:
            dev = self.gpus[key] = Device()
        dev.observe(ev, GPU_GAUGES, GPU_COUNTERS)
        reasons = ev.get("clocks_event_reasons")
        if reasons is not None:
            share = dev.reasons
            for name, bits in REASON_GROUPS.items():
                hit = 1.0 if reasons & bits else 0.0
                old = share.get(name)
                share[name] = hit if old is None else old + RATE_ALPHA * (hit - old)
        xid = ev.get("xid")
        if xid:
            dev.xids.extend(xid)
        if ev.get("rank") is not None:
            self.gpu_rank[key] = ev["rank"]

    def observe_nic(self, ev: dict[str, Any]) -> None:
        key = (ev["host"], ev["nic"], ev["port"])
        dev = self.nics.get(key)
        if dev is None:
            dev = self.nics[key] = Device()
        dev.observe(ev, ("speed_gbps",), NIC_COUNTERS)
        dev.down = ev.get("state") == "down"

    def observe_host(self, ev: dict[str, Any]) -> None:
        dev = self.hosts.get(ev["host"])
        if dev is None:
            dev = self.hosts[ev["host"]] = Device()
        dev.observe(ev, HOST_GAUGES, ())

    def nics_of(self, host: str) -> list[Device]:
        return [d for (h, _, _), d in self.nics.items() if h == host]

    def forget(self, before_ts: float, keep_hosts: set[str]) -> int:
        """Drop every device whose newest sample is older than ``before_ts`` and whose host
        is not in ``keep_hosts`` (issue 17: the devices of hosts no job runs on any more
        would otherwise be kept for ever); returns how many were dropped."""
        gone_g = [k for k, d in self.gpus.items() if d.last_ts < before_ts and k[0] not in keep_hosts]
        for g in gone_g:
            del self.gpus[g]
            self.gpu_rank.pop(g, None)
        gone_n = [k for k, d in self.nics.items() if d.last_ts < before_ts and k[0] not in keep_hosts]
        for nk in gone_n:
            del self.nics[nk]
        n = len(gone_g) + len(gone_n)
        gone_h = [h for h, d in self.hosts.items() if d.last_ts < before_ts and h not in keep_hosts]
        for h in gone_h:
            del self.hosts[h]
        return n + len(gone_h)
