"""Device telemetry on change, plus a heartbeat: what the host agent publishes of its
samplers' ``gpu``, ``nic`` and ``host`` samples (docs/collectors.md, "Telemetry on
change"; the measurements in docs/streams.md, "What device telemetry costs").

The samplers read every device every interval; on a healthy cluster the samples of
one device are the same second after second in everything the root cause reads, and
each one costs the pipeline a decode, a validation and an update. ``OnChange.filter``
keeps a device's sample when

- it is the device's first, or a field the root cause reads moved past its dead band
  since the last sample kept for a move (``OnChangeConfig.bands``: a relative band for
  clocks, power and load, an absolute one for temperatures and CPU percentages, any
  change of a reason bit, PCIe link, link state, speed or rank mapping), or a field
  appeared or disappeared;
- it reports XIDs (``xid`` lists those seen since the previous sample: never dropped);
- the rate of a counter the root cause reads (``RATE_COUNTERS``: errors, drops, PFC
  pauses, CNPs, ECN marks, ...) left its Poisson noise around the rate when it last
  moved, or a counter went back (a reset);
- it is one of the ``settle`` samples after such a move (the Detector averages per
  sample: a few samples let its averages settle on the new value);
- the device sent nothing for ``heartbeat_s`` (event time: the sample's ``ts``);
- no sample of its (kind, host) was kept in this cycle and it is the device most
  overdue: each host publishes at least one sample of each kind every interval, so
  whatever follows telemetry by (kind, host) never waits on a quiet device.

Counters are cumulative, so a dropped sample loses nothing of them: the next kept
sample carries the total (rates are computed over the time between kept samples).
Everything else (steps, comm, collective events) passes untouched.

>>> f = OnChange()
>>> s = {"v": 1, "kind": "host", "ts": 1.0, "host": "h0", "load1": 3.0}
>>> len(f.filter([s])), len(f.filter([dict(s, ts=2.0)]))   # the host's only sample
(1, 1)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEVICE_KINDS = frozenset(("gpu", "nic", "host"))

# field -> ("any",): any change | ("abs", band): |new - old| > band | ("rel", band):
# |new - old| > band x |old|. What models/telemetry.py and models/rootcause.py read
# (tests/test_collectors_samplers.py keeps the two in agreement).
BANDS: dict[str, tuple[str, float]] = {
    "sm_clock_mhz": ("rel", 0.02), "temp_c": ("abs", 2.0), "power_limit_w": ("rel", 0.02),
    "clocks_event_reasons": ("any", 0.0), "pcie_gen": ("any", 0.0),
    "pcie_width": ("any", 0.0), "pcie_max_gen": ("any", 0.0),
    "pcie_max_width": ("any", 0.0), "uuid": ("any", 0.0), "job_id": ("any", 0.0),
    "rank": ("any", 0.0), "state": ("any", 0.0), "speed_gbps": ("any", 0.0),
    "cpu_steal_pct": ("abs", 2.0), "cpu_util_pct": ("abs", 5.0), "load1": ("rel", 0.1),
    "procs_running": ("abs", 2.0),
}
# Cumulative counters whose rate the root cause reads (GPU errors; NIC errors and
# congestion). Byte and packet counters are not here: their rate follows the job's
# traffic, second by second, and decides nothing.
RATE_COUNTERS: tuple[str, ...] = (
    "pcie_replay_total", "ecc_sbe_total", "ecc_dbe_total", "nvlink_crc_errors_total",
    "rx_errors_total", "tx_errors_total", "rx_drops_total", "tx_pause_total",
    "rx_pause_total", "cnp_sent_total", "cnp_handled_total", "ecn_marked_total",
    "out_of_sequence_total", "link_downed_total", "symbol_errors_total", "xmit_wait_total")


@dataclass(frozen=True)
class OnChangeConfig:
    """``heartbeat_s``: longest a device stays silent (seconds of sample time);
    ``settle``: samples kept after a move; ``rate_rel``: relative band of a counter's
    rate (beyond its Poisson noise, 3 sqrt(rate) + 3 per second); ``bands``: see
    ``BANDS``; ``per_host_min``: keep at least one sample of each (kind, host) per
    cycle (the most overdue device)."""

    heartbeat_s: float = 10.0
    settle: int = 5
    rate_rel: float = 0.25
    bands: Mapping[str, tuple[str, float]] = field(default_factory=lambda: dict(BANDS))
    rate_counters: tuple[str, ...] = RATE_COUNTERS
    per_host_min: bool = True

    def __post_init__(self) -> None:
        if not self.heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be > 0, not {self.heartbeat_s}")
        if self.settle < 0 or self.rate_rel < 0:
            raise ValueError("settle and rate_rel must be >= 0")
        for name, (how, band) in self.bands.items():
            if how not in ("any", "abs", "rel") or band < 0:
                raise ValueError(f"band of {name}: {how!r} {band!r}")


class _Device:
    """What the filter remembers of one device."""

    __slots__ = ("ref", "sent_ts", "settle", "prev", "ref_rates")

    def __init__(self, ev: Mapping[str, Any]) -> None:
        self.ref = ev                 # the sample kept at the last move (or the first)
        self.sent_ts = ev["ts"]       # ts of the last sample kept
        self.settle = 0               # samples still to keep after a move
        self.prev = ev                # the previous sample, kept or not
        self.ref_rates: dict[str, float] = {}   # counter rates at the last rate move


def device_of(ev: Mapping[str, Any]) -> tuple:
    """The identity of the device a sample describes."""
    kind = ev["kind"]
    if kind == "gpu":
        return ("gpu", ev["host"], ev["gpu"])
    if kind == "nic":
        return ("nic", ev["host"], ev["nic"], ev["port"])
    return ("host", ev["host"])


class OnChange:
    """The on-change filter of one host agent (state per device; not thread-safe: the
    agent's loop calls it once per cycle). ``kept`` and ``dropped`` count samples per
    kind."""

    def __init__(self, config: OnChangeConfig | None = None) -> None:
        self.config = config or OnChangeConfig()
        self._devices: dict[tuple, _Device] = {}
        self.kept: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def filter(self, events: list[Any]) -> list[Any]:
        """The events of one cycle that are to be published, in their order."""
        cfg = self.config
        keep = [True] * len(events)
        kept_hosts: set[tuple[str, str]] = set()
        overdue: dict[tuple[str, str], tuple[float, int, _Device]] = {}
        for i, ev in enumerate(events):
            kind = ev.get("kind")
            if kind not in DEVICE_KINDS:
                continue
            key = device_of(ev)
            dev = self._devices.get(key)
            if dev is None:
                self._devices[key] = _Device(ev)
                kept_hosts.add((kind, ev["host"]))
                continue
            if self._keep(dev, ev):
                dev.sent_ts = ev["ts"]
                kept_hosts.add((kind, ev["host"]))
                continue
            keep[i] = False
            kh = (kind, ev["host"])
            if cfg.per_host_min and (kh not in overdue or dev.sent_ts < overdue[kh][0]):
                overdue[kh] = (dev.sent_ts, i, dev)
        for kh, (_, i, dev) in overdue.items():
            if kh not in kept_hosts:
                keep[i] = True
                dev.sent_ts = events[i]["ts"]
        out = []
        for ev, k in zip(events, keep, strict=True):
            kind = ev.get("kind")
            if kind in DEVICE_KINDS:
                (self.kept if k else self.dropped)[kind] += 1
            if k:
                out.append(ev)
        return out

    def _keep(self, dev: _Device, ev: Mapping[str, Any]) -> bool:
        cfg = self.config
        prev, dev.prev = dev.prev, ev
        rates = self._rates(prev, ev)
        moved = self._moved(dev.ref, ev) or bool(ev.get("xid"))
        if moved or self._rate_moved(dev.ref_rates, rates):
            if moved:
                dev.ref = ev
            dev.ref_rates = rates
            dev.settle = cfg.settle
            return True
        if dev.settle > 0:
            dev.settle -= 1
            return True
        return ev["ts"] - dev.sent_ts >= cfg.heartbeat_s

    def _moved(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        for name, (how, band) in self.config.bands.items():
            a, b = old.get(name), new.get(name)
            if a == b:
                continue
            if a is None or b is None or how == "any":
                return True
            if abs(b - a) > (band if how == "abs" else band * abs(a)):
                return True
        return False

    def _rates(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, float]:
        dt = b["ts"] - a["ts"]
        if dt <= 0:
            return {}
        out = {}
        for c in self.config.rate_counters:
            x, y = a.get(c), b.get(c)
            if x is not None and y is not None:
                out[c] = (y - x) / dt
        return out

    def _rate_moved(self, ref: dict[str, float], now: dict[str, float]) -> bool:
        rel = self.config.rate_rel
        for c, r in now.items():
            r0 = ref.get(c, 0.0)
            if r < 0 or abs(r - r0) > max(rel * abs(r0), 3 * max(abs(r0), 1.0) ** 0.5 + 3):
                return True
        return False


def filter_trace(events: list[Any], config: OnChangeConfig | None = None) -> list[Any]:
    """``events`` (a trace: any kinds, in ts order) less the device samples that host
    agents with this config would not publish: each host's samples go through its own
    filter one cycle at a time (a cycle ends when a device of the host shows up again).
    For benchmarks and experiments on simulated traces."""
    filters: dict[str, OnChange] = {}
    cycles: dict[str, tuple[set, list[Any]]] = {}   # host -> (devices, its samples)
    kept: set[int] = set()

    def close(host: str) -> None:
        flt = filters.get(host) or filters.setdefault(host, OnChange(config))
        kept.update(map(id, flt.filter(cycles.pop(host)[1])))

    for e in events:
        if e["kind"] not in DEVICE_KINDS:
            continue
        dev = device_of(e)
        if e["host"] in cycles and dev in cycles[e["host"]][0]:
            close(e["host"])
        seen, samples = cycles.setdefault(e["host"], (set(), []))
        seen.add(dev)
        samples.append(e)
    for host in list(cycles):
        close(host)
    return [e for e in events if e["kind"] not in DEVICE_KINDS or id(e) in kept]
