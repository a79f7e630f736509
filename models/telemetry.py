"""Device telemetry state: the latest sample of every GPU, NIC port and host,
and smoothed rates of their cumulative counters.

Per sample the work is O(number of fields): store the gauge values, turn each
``*_total`` counter into a per-second rate (a decrease is a reset, never a
negative rate) smoothed exponentially, remember what the device looked like
when first seen (its own past), and collect XID codes. The root-cause
attribution (``models.rootcause``) reads this state; it never reads events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from itertools import chain, repeat
from typing import Any

import numpy as np

from failslow.models.config import DetectorConfig

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
# Smoothing: ``DetectorConfig`` (``[detector]``): ``rate_alpha`` (0.3, the newest rate's
# weight: a few samples of memory), ``gauge_alpha`` (0.3) and ``first_samples`` (3: a
# device's own past), passed by the ``TelemetryStore`` that holds the device.


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
                counters: tuple[str, ...], p: DetectorConfig | None = None) -> None:
        p = p or DetectorConfig()
        ts = ev["ts"]
        g = self.gauges
        for name in gauges:
            x = ev.get(name)
            if x is not None:
                old = g.get(name)
                g[name] = x if old is None else old + p.gauge_alpha * (x - old)
                if self.n < p.first_samples:
                    self.first[name] = g[name]
        self.count(ts, zip(counters, map(ev.get, counters), strict=True), p.rate_alpha)

    def count(self, ts: float, values: Iterable[tuple[str, Any]], rate_alpha: float) -> None:
        """One sample's counters (name, value or None) at ``ts``: each counter's rate
        since the last sample, smoothed; the sample counted."""
        dt = ts - self.last_ts
        last, rates = self.last, self.rates
        for name, x in values:
            if x is None:
                continue
            prev = last.get(name)
            if x == prev and type(x) is type(prev) and rates.get(name) == 0.0:
                continue      # unchanged at a rate of 0 (most error counters): it stays so
            last[name] = x
            if prev is not None and dt > 0 and x >= prev:
                r = (x - prev) / dt
                old = rates.get(name)
                rates[name] = r if old is None else old + rate_alpha * (r - old)
        self.last_ts = ts
        self.n += 1


_NAN = float("nan")
_REASON_BITS = tuple(REASON_GROUPS.values())
_BITS = np.array(_REASON_BITS, dtype=np.int64)
_REASON_NAMES = tuple(REASON_GROUPS)
_NG, _NC, _NR = len(GPU_GAUGES), len(GPU_COUNTERS), len(REASON_GROUPS)
# GPU samples held back at most (``TelemetryStore.flush``): a round over that many GPUs
PENDING_MAX = 4096
# what a round of GPU samples reads of each (``TelemetryStore._round``), in this order
_ROUND_FIELDS = ("ts", *GPU_GAUGES, *GPU_COUNTERS, "clocks_event_reasons", "xid")
_NUMBER = frozenset((float, int))
_INTS = frozenset((int,))
_INT_NONE = frozenset((int, type(None)))
# what a round of NIC samples reads of each (``TelemetryStore._nic_round``), in this order
_NIC_FIELDS = ("ts", "speed_gbps", "state", *NIC_COUNTERS)
_NIC_INDEX = {name: j for j, name in enumerate(NIC_COUNTERS)}


class GpuTable:
    """Every GPU's state as arrays, a row per GPU ``(host, gpu)``: what a ``Device``
    holds, so that the samples released for a judged step (a ``gpu_batch`` per host, or
    per-GPU ``gpu`` events) update all of a job's GPUs in one numpy step. NaN: no value
    yet (where a ``Device`` lacks the key). ``update`` (many GPUs) and ``update_one`` (one
    sample) do ``Device.observe``'s arithmetic, so the state is the same floats whichever
    form the samples came in and however they were grouped."""

    __slots__ = ("rows", "gauges", "first", "rates", "last", "reasons", "last_ts", "n",
                 "xids", "ver")

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], int] = {}
        self.gauges = np.empty((0, _NG))
        self.first = np.empty((0, _NG))
        self.rates = np.empty((0, _NC))
        self.last = np.empty((0, _NC))
        self.reasons = np.empty((0, _NR))
        self.last_ts = np.empty(0)
        self.n = np.empty(0, dtype=np.int64)
        self.xids: list[list[int]] = []
        self.ver = 0                      # bumped by every change (the views' caches)

    def index(self, keys: list[tuple[str, int]]) -> tuple[list[int], list[tuple[str, int]]]:
        """The rows of ``keys``, and the keys that got a new row."""
        rows = self.rows
        try:
            return list(map(rows.__getitem__, keys)), []    # every key known (nearly always)
        except KeyError:
            pass
        new = [k for k in dict.fromkeys(keys) if k not in rows]
        if new:
            m = len(new)
            for k in new:
                rows[k] = len(rows)
            self.gauges = np.concatenate((self.gauges, np.full((m, _NG), np.nan)))
            self.first = np.concatenate((self.first, np.full((m, _NG), np.nan)))
            self.rates = np.concatenate((self.rates, np.full((m, _NC), np.nan)))
            self.last = np.concatenate((self.last, np.full((m, _NC), np.nan)))
            self.reasons = np.concatenate((self.reasons, np.full((m, _NR), np.nan)))
            self.last_ts = np.concatenate((self.last_ts, np.zeros(m)))
            self.n = np.concatenate((self.n, np.zeros(m, dtype=np.int64)))
            self.xids += [[] for _ in range(m)]
        return [rows[k] for k in keys], new

    def drop(self, keys: set[tuple[str, int]]) -> None:
        """Forget ``keys`` (a later sample starts them afresh)."""
        keep = [(k, r) for k, r in self.rows.items() if k not in keys]
        idx = [r for _, r in keep]
        for name in ("gauges", "first", "rates", "last", "reasons", "last_ts", "n"):
            setattr(self, name, getattr(self, name)[idx])
        self.xids = [self.xids[r] for r in idx]
        self.rows = {k: i for i, (k, _) in enumerate(keep)}
        self.ver += 1

    def update(self, rows: list[int], ts: np.ndarray, gauges: np.ndarray,
               counters: np.ndarray, reasons: list[Any], p: DetectorConfig | None = None
               ) -> None:
        """One sample for each of ``rows`` (distinct): ``ts`` (k,), ``gauges`` (k, G) and
        ``counters`` (k, C) with NaN where the sample lacks the field, ``reasons`` the
        clocks_event_reasons (None: none); ``p`` the smoothing."""
        p = p or DetectorConfig()
        idx = np.asarray(rows)
        has = ~np.isnan(gauges)
        old = self.gauges[idx]
        new = np.where(np.isnan(old), gauges, old + p.gauge_alpha * (gauges - old))
        np.copyto(new, old, where=~has)
        self.gauges[idx] = new
        early = has & (self.n[idx] < p.first_samples)[:, None]
        if early.any():
            first = self.first[idx]
            np.copyto(first, new, where=early)
            self.first[idx] = first
        dt = ts - self.last_ts[idx]
        prev = self.last[idx]
        hasc = ~np.isnan(counters)
        last = prev.copy()
        np.copyto(last, counters, where=hasc)
        self.last[idx] = last
        with np.errstate(invalid="ignore", divide="ignore"):
            ok = hasc & (counters >= prev) & (dt > 0)[:, None]   # NaN prev: False
            if ok.any():
                r = (counters - prev) / dt[:, None]
                oldr = self.rates[idx]
                rate = np.where(np.isnan(oldr), r, oldr + p.rate_alpha * (r - oldr))
                np.copyto(oldr, rate, where=ok)
                self.rates[idx] = oldr
        if any(x is not None for x in reasons):
            none = [x is None for x in reasons]
            bits = np.array([0 if x is None else x for x in reasons], dtype=np.int64)
            hit = ((bits[:, None] & _BITS) != 0).astype(float)
            if any(none):
                hit[np.array(none)] = np.nan
            olds = self.reasons[idx]
            share = np.where(np.isnan(olds), hit, olds + p.rate_alpha * (hit - olds))
            np.copyto(olds, share, where=~np.isnan(hit))
            self.reasons[idx] = olds
        self.last_ts[idx] = ts
        self.n[idx] += 1
        self.ver += 1

    def update_one(self, row: int, ev: dict[str, Any], p: DetectorConfig | None = None
                   ) -> None:
        """One GPU's sample (a ``gpu`` event), in plain Python on its row: for a lone
        sample numpy's per-call cost would outweigh the work."""
        p = p or DetectorConfig()
        ts = ev["ts"]
        n = int(self.n[row])
        g = self.gauges[row].tolist()
        first = self.first[row].tolist() if n < p.first_samples else None
        for j, name in enumerate(GPU_GAUGES):
            x = ev.get(name)
            if x is not None:
                old = g[j]
                g[j] = x if old != old else old + p.gauge_alpha * (x - old)
                if first is not None:
                    first[j] = g[j]
        self.gauges[row] = g
        if first is not None:
            self.first[row] = first
        dt = ts - float(self.last_ts[row])
        last, rates = self.last[row].tolist(), self.rates[row].tolist()
        for j, name in enumerate(GPU_COUNTERS):
            x = ev.get(name)
            if x is None:
                continue
            prev = last[j]
            last[j] = x
            if prev == prev and dt > 0 and x >= prev:
                r = (x - prev) / dt
                old = rates[j]
                rates[j] = r if old != old else old + p.rate_alpha * (r - old)
        self.last[row], self.rates[row] = last, rates
        reasons = ev.get("clocks_event_reasons")
        if reasons is not None:
            share = self.reasons[row].tolist()
            for j, bits in enumerate(_REASON_BITS):
                hit = 1.0 if reasons & bits else 0.0
                old = share[j]
                share[j] = hit if old != old else old + p.rate_alpha * (hit - old)
            self.reasons[row] = share
        self.last_ts[row] = ts
        self.n[row] = n + 1
        self.ver += 1


class _TableView(ABC):
    """One device's row of a table as a ``Device`` reads it: dicts of the values it has
    (``gauges``, ``first``, ``rates``, ``last``, ...: ``_PARTS``), each made when read and
    kept until the table changes (``_make``)."""

    __slots__ = ("store", "key", "_ver", "_dicts")
    _PARTS: tuple[Any, ...] = ()
    # the store's flag of samples held back, the method applying them, and the table
    _FROM = ("_pending", "flush", "table")

    def __init__(self, store: TelemetryStore, key: tuple[Any, ...]) -> None:
        self.store = store
        self.key = key
        self._ver = -1
        self._dicts: list[dict[str, Any] | None] = [None] * len(self._PARTS)

    @property
    def table(self) -> Any:
        """The table, once the samples the store holds back are applied."""
        st = self.store
        held, apply, table = self._FROM
        if getattr(st, held):
            getattr(st, apply)()
        return getattr(st, table)

    @abstractmethod
    def _make(self, t: Any, i: int) -> dict[str, Any]:
        """Part ``i`` of ``_PARTS`` read from row ``t.rows[self.key]``."""

    def _get(self, i: int) -> dict[str, Any]:
        t = self.table
        if self._ver != t.ver:
            self._dicts = [None] * len(self._PARTS)
            self._ver = t.ver
        d = self._dicts[i]
        if d is None:
            d = self._dicts[i] = self._make(t, i)
        return d

    gauges = property(lambda self: self._get(0))
    first = property(lambda self: self._get(1))
    rates = property(lambda self: self._get(2))
    last = property(lambda self: self._get(3))


class GpuView(_TableView):
    """One GPU of the ``GpuTable`` as a ``Device`` reads (``gauges``, ``first``, ``rates``,
    ``last``, ``reasons``: dicts of the values it has; ``xids``, ``last_ts``, ``n``,
    ``down``), for the readers of a few devices (``models.rootcause``, ``models.links``,
    ``models.incidents``). A dict is made when read and kept until the table changes;
    samples the store holds back are applied first."""

    __slots__ = ()
    down = False
    _PARTS = (("gauges", GPU_GAUGES), ("first", GPU_GAUGES), ("rates", GPU_COUNTERS),
              ("last", GPU_COUNTERS), ("reasons", _REASON_NAMES))

    def _make(self, t: GpuTable, i: int) -> dict[str, Any]:
        attr, names = self._PARTS[i]
        values = getattr(t, attr)[t.rows[self.key]].tolist()
        return {k: x for k, x in zip(names, values, strict=True) if x == x}

    reasons = property(lambda self: self._get(4))

    @property
    def xids(self) -> list[int]:
        return self.table.xids[self.table.rows[self.key]]

    @property
    def last_ts(self) -> float:
        return float(self.table.last_ts[self.table.rows[self.key]])

    @property
    def n(self) -> int:
        return int(self.table.n[self.table.rows[self.key]])


_NNC = len(NIC_COUNTERS)


class NicTable:
    """Every NIC port's state as arrays, a row per port ``(host, nic, port)``: what a
    ``Device`` holds for one (its ``speed_gbps`` gauge, smoothed counter rates, the latest
    counter values, ``down``), so that the ``nic_batch``es released for a judged step
    update all of a job's ports in one numpy step. ``speed`` / ``first`` / ``rates``: NaN
    where a ``Device`` lacks the key; ``last``: the counters as the integers they are
    (int64), ``has`` where a value was seen. ``update`` does ``Device.observe``'s
    arithmetic (the same float operations in the same order: a counter's increase is
    taken exactly, as an integer, before it is divided by the seconds), ``update_one``
    the same in plain Python for a lone sample."""

    __slots__ = ("rows", "speed", "first", "rates", "last", "has", "last_ts", "n", "down",
                 "ver")

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, int], int] = {}
        self.speed = np.empty(0)
        self.first = np.empty(0)
        self.rates = np.empty((0, _NNC))
        self.last = np.zeros((0, _NNC), dtype=np.int64)
        self.has = np.zeros((0, _NNC), dtype=bool)
        self.last_ts = np.empty(0)
        self.n = np.empty(0, dtype=np.int64)
        self.down = np.zeros(0, dtype=bool)
        self.ver = 0

    def index(self, keys: list[tuple[str, str, int]]) -> tuple[list[int], list]:
        """The rows of ``keys``, and the keys that got a new row."""
        rows = self.rows
        try:
            return list(map(rows.__getitem__, keys)), []    # every key known (nearly always)
        except KeyError:
            pass
        new = [k for k in dict.fromkeys(keys) if k not in rows]
        if new:
            m = len(new)
            for k in new:
                rows[k] = len(rows)
            self.speed = np.concatenate((self.speed, np.full(m, np.nan)))
            self.first = np.concatenate((self.first, np.full(m, np.nan)))
            self.rates = np.concatenate((self.rates, np.full((m, _NNC), np.nan)))
            self.last = np.concatenate((self.last, np.zeros((m, _NNC), dtype=np.int64)))
            self.has = np.concatenate((self.has, np.zeros((m, _NNC), dtype=bool)))
            self.last_ts = np.concatenate((self.last_ts, np.zeros(m)))
            self.n = np.concatenate((self.n, np.zeros(m, dtype=np.int64)))
            self.down = np.concatenate((self.down, np.zeros(m, dtype=bool)))
        return [rows[k] for k in keys], new

    def drop(self, keys: set) -> None:
        """Forget ``keys`` (a later sample starts them afresh)."""
        keep = [(k, r) for k, r in self.rows.items() if k not in keys]
        idx = [r for _, r in keep]
        for name in ("speed", "first", "rates", "last", "has", "last_ts", "n", "down"):
            setattr(self, name, getattr(self, name)[idx])
        self.rows = {k: i for i, (k, _) in enumerate(keep)}
        self.ver += 1

    def update(self, rows: list[int], ts: np.ndarray, speed: np.ndarray, values: np.ndarray,
               hasv: np.ndarray, down: np.ndarray, p: DetectorConfig) -> None:
        """One sample for each of ``rows`` (distinct): ``ts`` (k,), ``speed`` (k,) NaN where
        the sample has none, ``values`` (k, C) int64 counters where ``hasv``, ``down``."""
        idx = np.asarray(rows)
        hs = ~np.isnan(speed)
        if hs.any():
            old = self.speed[idx]
            new = np.where(np.isnan(old), speed, old + p.gauge_alpha * (speed - old))
            np.copyto(new, old, where=~hs)
            self.speed[idx] = new
            early = hs & (self.n[idx] < p.first_samples)
            if early.any():
                first = self.first[idx]
                np.copyto(first, new, where=early)
                self.first[idx] = first
        dt = ts - self.last_ts[idx]
        prev, had = self.last[idx], self.has[idx]
        ok = hasv & had & (values >= prev) & (dt > 0)[:, None]
        if ok.any():
            # x - prev exactly (x >= prev: the difference fits 64 bits unsigned), then
            # made a float and divided, as Python's int arithmetic does
            inc = (values.view(np.uint64) - prev.view(np.uint64)).astype(float)
            r = inc / dt[:, None]
            oldr = self.rates[idx]
            rate = np.where(np.isnan(oldr), r, oldr + p.rate_alpha * (r - oldr))
            np.copyto(oldr, rate, where=ok)
            self.rates[idx] = oldr
        np.copyto(prev, values, where=hasv)
        self.last[idx] = prev
        self.has[idx] = had | hasv
        self.last_ts[idx] = ts
        self.n[idx] += 1
        self.down[idx] = down
        self.ver += 1

    def update_one(self, row: int, ts: Any, speed: Any, state: Any,
                   values: Iterable[tuple[int, Any]], p: DetectorConfig) -> None:
        """One port's sample in plain Python on its row (``values``: (counter index,
        value or None))."""
        n = int(self.n[row])
        if speed is not None:
            old = float(self.speed[row])
            g = speed if old != old else old + p.gauge_alpha * (speed - old)
            self.speed[row] = g
            if n < p.first_samples:
                self.first[row] = g
        dt = ts - float(self.last_ts[row])
        last, has, rates = self.last[row].tolist(), self.has[row].tolist(), \
            self.rates[row].tolist()
        for j, x in values:
            if x is None:
                continue
            prev = last[j] if has[j] else None
            last[j], has[j] = x, True
            if prev is not None and dt > 0 and x >= prev:
                r = (x - prev) / dt
                old = rates[j]
                rates[j] = r if old != old else old + p.rate_alpha * (r - old)
        self.last[row], self.has[row], self.rates[row] = last, has, rates
        self.last_ts[row] = ts
        self.n[row] = n + 1
        self.down[row] = state == "down"
        self.ver += 1


class NicView(_TableView):
    """One NIC port of the ``NicTable`` as a ``Device`` reads (``gauges``, ``first``,
    ``rates``, ``last``: dicts of the values it has; ``down``, ``last_ts``, ``n``), for the
    readers of a job's ports (``models.rootcause``, ``models.links``). A dict is made when
    read and kept until the table changes; samples the store holds back are applied
    first."""

    __slots__ = ()
    _PARTS = ("gauges", "first", "rates", "last")     # the dicts it makes, in this order
    xids: tuple[int, ...] = ()
    reasons: dict[str, float] = {}

    _FROM = ("_nic_pending", "flush_nics", "nic_table")

    def _make(self, t: NicTable, i: int) -> dict[str, Any]:
        r = t.rows[self.key]
        if i < 2:
            x = float((t.speed if i == 0 else t.first)[r])
            return {"speed_gbps": x} if x == x else {}
        if i == 2:
            return {k: x for k, x in zip(NIC_COUNTERS, t.rates[r].tolist(), strict=True)
                    if x == x}
        return {k: x for k, x, h in zip(NIC_COUNTERS, t.last[r].tolist(),
                                        t.has[r].tolist(), strict=True) if h}

    @property
    def down(self) -> bool:
        t = self.table
        return bool(t.down[t.rows[self.key]])

    @property
    def last_ts(self) -> float:
        t = self.table
        return float(t.last_ts[t.rows[self.key]])

    @property
    def n(self) -> int:
        t = self.table
        return int(t.n[t.rows[self.key]])


def _round_columns(rnd: list[tuple[dict[str, Any], list[Any]]], fields: tuple[str, ...],
                   kind: str, unit: str) -> tuple[list[Any], list[list[Any]]]:
    """A round's device keys and its values a column per field: a lone sample's values, a
    batch's columns as they are (its ``absent`` entries read as None), a value it writes
    once repeated; ValueError for a batch column of the wrong length."""
    keys: list[Any] = []
    cols: list[list[Any]] = [[] for _ in fields]
    for it, its in rnd:
        keys += its
        get = it.get
        if it["kind"] != kind:          # a lone sample
            for c, x in zip(cols, map(get, fields), strict=True):
                c.append(x)
            continue
        k = len(its)
        absent = get("absent")
        for c, v, name in zip(cols, map(get, fields), fields, strict=True):
            if type(v) is not list:
                c += [v] * k
                continue
            if len(v) != k:
                raise ValueError(f"{kind}.{name}: {len(v)} values for {k} {unit}")
            gone = absent.get(name) if absent else None
            if gone:
                v = list(v)
                for i in gone:
                    v[i] = None
            c += v
    return keys, cols


def _is_batch(item: dict[str, Any]) -> bool:
    return item["kind"] == "gpu_batch"


class TelemetryStore:
    """Latest state of every GPU ``(host, gpu)``, NIC ``(host, nic, port)`` and host.

    GPUs are kept as arrays (``GpuTable``), updated a round of samples at a time
    (``observe_gpu_items``); ``gpus`` maps each to a view that reads like a ``Device``.
    NICs and hosts are ``Device`` objects."""

    rejected = 0          # GPU samples that failed when applied (a field of the wrong type)
    p = DetectorConfig()  # its smoothing; what a store pickled before it ran with

    def __init__(self, p: DetectorConfig | None = None) -> None:
        if p is not None:
            self.p = p
        self.table = GpuTable()
        self._gpus: dict[tuple[str, int], GpuView] = {}
        # GPU samples not applied yet: applied together (``flush``) before anything reads
        # the GPUs' state, so a lone sample costs no numpy step of its own
        self._pending: list[dict[str, Any]] = []
        # NIC ports likewise (``NicTable``), their samples held back until read
        self.nic_table = NicTable()
        self._nics: dict[tuple[str, str, int], NicView] = {}
        self._nic_pending: list[dict[str, Any]] = []
        self._nic_keys: dict[str, tuple[list, list, list[tuple[str, str, int]]]] = {}
        self._gpu_keys: dict[str, tuple[list, list[tuple[str, int]]]] = {}
        self.hosts: dict[str, Device] = {}
        self.gpu_rank: dict[tuple[str, int], int] = {}   # from gpu samples that name a rank

    @property
    def gpus(self) -> dict[tuple[str, int], Any]:   # GpuView: reads as a Device
        if self._pending:
            self.flush()
        return self._gpus

    @gpus.setter
    def gpus(self, keep: dict[tuple[str, int], Any]) -> None:
        """Keep only the GPUs of ``keep`` (a filtered ``gpus``): the others are forgotten."""
        if self._pending:
            self.flush()
        self._drop([k for k in self._gpus if k not in keep])

    @property
    def nics(self) -> dict[tuple[str, str, int], Any]:   # NicView: reads as a Device
        if self._nic_pending:
            self.flush_nics()
        return self._nics

    @nics.setter
    def nics(self, keep: dict[tuple[str, str, int], Any]) -> None:
        """Keep only the NIC ports of ``keep`` (a filtered ``nics``)."""
        self._drop_nics([k for k in self.nics if k not in keep])

    def _drop_nics(self, keys: list[tuple[str, str, int]]) -> None:
        if keys:
            for k in keys:
                del self._nics[k]
            self.nic_table.drop(set(keys))
            self._nic_keys = {}

    def _drop(self, keys: list[tuple[str, int]]) -> None:
        if keys:
            for k in keys:
                del self._gpus[k]
            self.table.drop(set(keys))
            self._gpu_keys = {}

    def __getstate__(self) -> dict[str, Any]:
        if self._pending:
            self.flush()
        if self._nic_pending:
            self.flush_nics()
        state = dict(self.__dict__)
        del state["_gpus"], state["_nics"]   # views: made again from the tables
        state.pop("_nic_keys", None)         # caches (``flush_nics``, ``_keys``)
        state.pop("_gpu_keys", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        old = state.pop("gpus", None)      # a snapshot from before the table: Devices
        self.__dict__.update(state)
        self._pending = []
        if old is not None:
            self.table = GpuTable()
            for key, dev in old.items():
                self._load(key, dev)
        self._gpus = {k: GpuView(self, k) for k in self.table.rows}
        if "nic_table" not in state:       # from before the NIC table: migrate.py's
            self.nic_table = NicTable()    # _from_10 fills it from the old Devices
        self._nic_pending = []
        self._nic_keys = {}
        self._gpu_keys = {}
        self._nics = {k: NicView(self, k) for k in self.nic_table.rows}

    def load_nics(self, old: dict[tuple[str, str, int], Device]) -> None:
        """The NIC ports of a snapshot from before the ``NicTable`` (``Device`` objects)
        into the table (``models.migrate``)."""
        t = self.nic_table
        rows, _ = t.index(list(old))
        for r, dev in zip(rows, old.values(), strict=True):
            if "speed_gbps" in dev.gauges:
                t.speed[r] = dev.gauges["speed_gbps"]
            if "speed_gbps" in dev.first:
                t.first[r] = dev.first["speed_gbps"]
            for j, name in enumerate(NIC_COUNTERS):
                if name in dev.rates:
                    t.rates[r, j] = dev.rates[name]
                if name in dev.last:
                    t.last[r, j], t.has[r, j] = dev.last[name], True
            t.last_ts[r], t.n[r], t.down[r] = dev.last_ts, dev.n, dev.down
        t.ver += 1
        self._nics.update((k, NicView(self, k)) for k in old)

    def _load(self, key: tuple[str, int], dev: Device) -> None:
        t = self.table
        (r,), _ = t.index([key])
        for arr, names, d in ((t.gauges, GPU_GAUGES, dev.gauges), (t.first, GPU_GAUGES, dev.first),
                              (t.rates, GPU_COUNTERS, dev.rates), (t.last, GPU_COUNTERS, dev.last),
                              (t.reasons, _REASON_NAMES, dev.reasons)):
            for j, name in enumerate(names):
                if name in d:
                    arr[r, j] = d[name]
        t.last_ts[r] = dev.last_ts
        t.n[r] = dev.n
        t.xids[r] = list(dev.xids)
        t.ver += 1

    def _rows(self, keys: list[tuple[str, int]]) -> list[int]:
        rows, new = self.table.index(keys)
        for k in new:
            self._gpus[k] = GpuView(self, k)
        return rows

    def observe_gpu(self, ev: dict[str, Any]) -> None:
        """One GPU's sample, held back until the GPUs' state is read (``flush``)."""
        key = (ev["host"], ev["gpu"])
        ts = ev["ts"]
        if type(ts) is not float and type(ts) is not int:
            raise TypeError("a sample's ts is not a number")
        hash(key)
        self._pending.append(ev)
        if ev.get("rank") is not None:
            self.gpu_rank[key] = ev["rank"]
        if len(self._pending) >= PENDING_MAX:
            self.flush()

    def _observe_one(self, ev: dict[str, Any]) -> None:
        key = (ev["host"], ev["gpu"])
        (row,) = self._rows([key])
        self.table.update_one(row, ev, self.p)
        xid = ev.get("xid")
        if xid:
            self.table.xids[row].extend(xid)

    def observe_gpu_batch(self, batch: dict[str, Any]) -> None:
        """A host's GPUs sampled together (valid: ``schema.batches.valid``), held back
        until the GPUs' state is read."""
        self._hold([batch])
        if len(self._pending) >= PENDING_MAX:
            self.flush()

    def observe_gpu_items(self, items: list[dict[str, Any]]) -> int:
        """GPU samples, ``gpu`` events and ``gpu_batch``es (valid: ``schema.batches.valid``,
        read from their columns, no per-GPU event made), in the order given, applied now
        with those held back (``flush``); returns how many items were rejected."""
        self._hold(items)
        return self.flush()

    def _hold(self, items: list[dict[str, Any]]) -> None:
        for it in items:
            if _is_batch(it):
                ranks = it.get("rank")
                if ranks is not None:
                    h = it["host"]
                    gpus = it["gpu"]
                    if type(ranks) is not list:
                        ranks = [ranks] * len(gpus)
                    gone = (it.get("absent") or {}).get("rank")
                    if None in ranks or gone:
                        ranks = [None if i in (gone or ()) else r for i, r in enumerate(ranks)]
                        self.gpu_rank.update(((h, g), r) for g, r in zip(gpus, ranks,
                                                                         strict=True)
                                             if r is not None)
                    else:
                        self.gpu_rank.update(zip(self._keys(h, gpus), ranks, strict=True))
            elif it.get("rank") is not None:
                self.gpu_rank[(it["host"], it["gpu"])] = it["rank"]
        self._pending += items

    def _keys(self, h: str, gpus: list) -> list[tuple[str, int]]:
        """The keys ``(h, gpu)`` of a batch's ``gpus``: those of the host's last batch
        again where its GPUs are the same (issue 31: the same tuples, not made anew, found
        at once in the tables' dicts)."""
        was = self._gpu_keys.get(h)
        if was is not None and was[0] == gpus:
            return was[1]
        keys = [(h, g) for g in gpus]
        self._gpu_keys[h] = (gpus, keys)
        return keys

    def flush(self) -> int:
        """Apply the GPU samples held back, in rounds, each a numpy step over GPUs that
        differ: a GPU's samples in their order, each in the round after its previous one.
        Returns how many samples were rejected (a field of the wrong type: the items of its
        round go one by one)."""
        items, self._pending = self._pending, []
        rounds: list[list[tuple[dict[str, Any], list[tuple[str, int]]]]] = []
        done: dict[Any, int] = {}
        for it in items:
            h = it["host"]
            if _is_batch(it):
                keys = self._keys(h, it["gpu"])
                if len(set(keys)) != len(keys):      # a GPU twice: its rows as events
                    from failslow.schema.batches import expand
                    for ev in expand(it):
                        self._place(rounds, done, ev, [(h, ev["gpu"])])
                    continue
            else:
                keys = [(h, it["gpu"])]
            self._place(rounds, done, it, keys)
        bad = 0
        for rnd in rounds:
            try:
                if len(rnd) == 1 and not _is_batch(rnd[0][0]):
                    self._observe_one(rnd[0][0])
                else:
                    self._round(rnd)
            except (KeyError, TypeError, ValueError):
                if len(rnd) == 1:
                    bad += 1
                    continue
                for it, _ in rnd:               # the round again, item by item
                    self._pending = [it]
                    bad += self.flush()
        self.rejected += bad
        return bad

    @staticmethod
    def _place(rounds: list, done: dict, it: dict[str, Any], keys: list) -> None:
        """Put ``it`` in the round after every earlier sample of its GPUs: ``done`` maps a
        host to the round after its last batch and ``(host, None)`` to the round after
        its last lone sample, a GPU ``(host, gpu)`` to the round after its last sample.
        A batch goes after all of its host's earlier samples (a round more at worst)."""
        h = keys[0][0]
        if len(keys) > 1 or _is_batch(it):
            r = max(done.get(h, 0), done.get((h, None), 0))
            done[h] = r + 1
        else:
            k = keys[0]
            r = max(done.get(h, 0), done.get(k, 0))
            done[k] = r + 1
            if r + 1 > done.get((h, None), 0):
                done[(h, None)] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append((it, keys))

    def _round(self, rnd: list[tuple[dict[str, Any], list[tuple[str, int]]]]) -> None:
        """One numpy step over samples of distinct GPUs: their values gathered a column per
        field over the round (a lone sample's values, a batch's columns as they are, a value
        it writes once repeated), each column made an array at once."""
        keys, cols = _round_columns(rnd, _ROUND_FIELDS, "gpu_batch", "GPUs")
        ts, reasons, xids = cols[0], cols[-2], cols[-1]
        if not set(map(type, ts)) <= _NUMBER:
            raise TypeError("a sample's ts is not a number")
        rows = self._rows(keys)
        self.table.update(rows, np.array(ts, dtype=float),
                          np.array(cols[1:1 + _NG], dtype=float).T,
                          np.array(cols[1 + _NG:1 + _NG + _NC], dtype=float).T, reasons, self.p)
        txids = self.table.xids
        for r, xid in zip(rows, xids, strict=True):
            if xid:
                txids[r].extend(xid)

    def observe_nic(self, ev: dict[str, Any]) -> None:
        """One NIC port's sample, held back until the ports' state is read."""
        hash((ev["host"], ev["nic"], ev["port"]))
        ts = ev["ts"]
        if type(ts) is not float and type(ts) is not int:
            raise TypeError("a sample's ts is not a number")
        self._nic_pending.append(ev)
        if len(self._nic_pending) >= PENDING_MAX:
            self.flush_nics()

    def observe_nic_batch(self, batch: dict[str, Any]) -> None:
        """A host's NIC ports sampled together (a ``nic_batch``, valid:
        ``schema.batches.valid``), held back until the ports' state is read, then applied
        read from its columns as ``observe_nic`` applies each row's ``nic`` event (the
        same floats, in row order)."""
        hash(batch["host"])
        if type(batch["nic"]) is not list or batch.get("port") is None \
                or batch.get("ts") is None:
            raise KeyError("a nic_batch without nic, port or ts")
        self._nic_pending.append(batch)
        if len(self._nic_pending) >= PENDING_MAX:
            self.flush_nics()

    def flush_nics(self) -> int:
        """Apply the NIC samples held back, in rounds as ``flush`` does the GPUs' (a
        numpy step over ports that differ, a port's samples in their order); returns how
        many were rejected (a field of the wrong type: its round goes item by item)."""
        items, self._nic_pending = self._nic_pending, []
        rounds: list[list[tuple[dict[str, Any], list]]] = []
        done: dict[Any, int] = {}
        seen: list[tuple[Any, ...]] = []    # the ports in the order first sampled
        # per host, the ports of its last batch and their keys, all rows of the table
        # (issue 31: the same tuples again, not made, checked and looked up anew)
        known = self._nic_keys
        learnt = []
        for it in items:
            h = it["host"]
            if it["kind"] == "nic_batch":
                ports = it.get("port")
                nics = it["nic"]
                if type(ports) is not list:
                    ports = [ports] * len(nics)
                gone = (it.get("absent") or {}).get("port")
                if not gone:
                    was = known.get(h)
                    if was is not None and was[0] == nics and was[1] == ports:
                        self._place(rounds, done, it, was[2])
                        continue
                keys = list(zip(repeat(h), nics, ports))
                if len(set(keys)) != len(keys) or gone:
                    from failslow.schema.batches import expand
                    for ev in expand(it):           # a port twice: its rows as events
                        key = (h, ev["nic"], ev.get("port"))
                        seen.append(key)
                        self._place(rounds, done, ev, [key])
                    continue
                learnt.append((h, nics, ports, keys))
            else:
                keys = [(h, it["nic"], it["port"])]
            seen += keys
            self._place(rounds, done, it, keys)
        if seen:
            self._nic_rows(seen)  # (a round may hold a later sample of a new port)
        for h, nics, ports, keys in learnt:
            known[h] = (nics, ports, keys)
        bad = 0
        for rnd in rounds:
            try:
                if len(rnd) == 1 and rnd[0][0]["kind"] == "nic":
                    self._nic_one(rnd[0][0])
                else:
                    self._nic_round(rnd)
            except (KeyError, TypeError, ValueError, OverflowError):
                if len(rnd) == 1:
                    bad += 1
                    continue
                for it, _ in rnd:               # the round again, item by item
                    self._nic_pending = [it]
                    bad += self.flush_nics()
        self.rejected += bad
        return bad

    def _nic_rows(self, keys: list[tuple[str, str, int]]) -> list[int]:
        rows, new = self.nic_table.index(keys)
        for k in new:
            self._nics[k] = NicView(self, k)
        return rows

    def _nic_one(self, ev: dict[str, Any]) -> None:
        ts = ev["ts"]
        if type(ts) is not float and type(ts) is not int:
            raise TypeError("a sample's ts is not a number")
        (row,) = self._nic_rows([(ev["host"], ev["nic"], ev["port"])])
        get = ev.get
        self.nic_table.update_one(row, ts, get("speed_gbps"), get("state"),
                                  enumerate(map(get, NIC_COUNTERS)), self.p)

    def _nic_round(self, rnd: list[tuple[dict[str, Any], list]]) -> None:
        """One numpy step over samples of distinct ports: their values gathered a column
        per field over the round (a batch's columns as they are, a value it writes once
        repeated), each column made an array at once."""
        keys, cols = _round_columns(rnd, _NIC_FIELDS, "nic_batch", "ports")
        ts, speed, state, *counters = cols
        if not set(map(type, ts)) <= _NUMBER:
            raise TypeError("a sample's ts is not a number")
        k = len(keys)
        kinds = set(map(type, chain.from_iterable(counters)))
        if kinds <= _INTS:              # every value given (most rounds): one conversion
            values = np.array(counters, dtype=np.int64).T
            hasv = np.ones((k, _NNC), dtype=bool)
        else:
            if not kinds <= _INT_NONE:
                raise TypeError("a NIC counter is not an integer")
            values = np.zeros((k, _NNC), dtype=np.int64)
            hasv = np.ones((k, _NNC), dtype=bool)
            for j, c in enumerate(counters):
                if None in c:
                    hasv[:, j] = [x is not None for x in c]
                    c = [0 if x is None else x for x in c]
                values[:, j] = c
        rows = self._nic_rows(keys)
        self.nic_table.update(rows, np.array(ts, dtype=float),
                              np.array(speed, dtype=float) if None not in speed else
                              np.array([np.nan if x is None else x for x in speed], dtype=float),
                              values, hasv, np.array([x == "down" for x in state]), self.p)

    def observe_host(self, ev: dict[str, Any]) -> None:
        dev = self.hosts.get(ev["host"])
        if dev is None:
            dev = self.hosts[ev["host"]] = Device()
        dev.observe(ev, HOST_GAUGES, (), self.p)

    def nic_rates(self, keys: list[tuple[str, str, int]], names: tuple[str, ...]
                  ) -> np.ndarray:
        """The smoothed rates of ports ``keys`` (held ones) for the counters ``names``: a
        row per name, a column per port, 0.0 where a port has none (what
        ``[[nics[k].rates.get(name, 0.0) for k in keys] for name in names]`` reads), taken
        from the table at once."""
        if self._nic_pending:
            self.flush_nics()
        t = self.nic_table
        rows = list(map(t.rows.__getitem__, keys))
        r = t.rates[np.ix_(rows, [_NIC_INDEX[name] for name in names])].T
        return np.ascontiguousarray(np.where(np.isnan(r), 0.0, r))

    def nics_of(self, host: str) -> list[Any]:
        return [d for (h, _, _), d in self.nics.items() if h == host]

    def forget(self, before_ts: float, keep_hosts: set[str]) -> int:
        """Drop every device whose newest sample is older than ``before_ts`` and whose host
        is not in ``keep_hosts`` (issue 17: the devices of hosts no job runs on any more
        would otherwise be kept for ever); returns how many were dropped."""
        if self._pending:
            self.flush()
        t = self.table
        gone_g = [k for k, r in t.rows.items()
                  if k[0] not in keep_hosts and t.last_ts[r] < before_ts]
        self._drop(gone_g)
        for g in gone_g:
            self.gpu_rank.pop(g, None)
        if self._nic_pending:
            self.flush_nics()
        nt = self.nic_table
        gone_n = [k for k, r in nt.rows.items()
                  if k[0] not in keep_hosts and nt.last_ts[r] < before_ts]
        self._drop_nics(gone_n)
        n = len(gone_g) + len(gone_n)
        gone_h = [h for h, d in self.hosts.items() if d.last_ts < before_ts and h not in keep_hosts]
        for h in gone_h:
            del self.hosts[h]
        return n + len(gone_h)
