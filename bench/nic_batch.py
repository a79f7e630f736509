"""CPU cost of applying a host's NIC samples to the telemetry store (issue 31): per-port
``nic`` events (``TelemetryStore.observe_nic``), a ``nic_batch`` read from its columns into
the ports' ``Device`` objects (``observe_nic_batch``, what the store does), and a
``nic_batch`` as one array step over a table of ports (``NicTable`` below: a prototype of
``models.telemetry.GpuTable``'s arithmetic for NICs, kept here to show why the store does
not use it: at a few ports per host numpy's per-call cost outweighs the loop).

The samples are those of a simulated scenario (``large_1024``: 8 ports per host); times
are CPU seconds (``time.process_time``), best of ``--repeat``.

    .venv/bin/python bench/nic_batch.py [--scenario large_1024] [--steps 6] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from failslow.models.telemetry import (  # noqa: E402
    GAUGE_ALPHA,
    NIC_COUNTERS,
    RATE_ALPHA,
    TelemetryStore,
)
from failslow.schema.batches import batch_trace  # noqa: E402
from failslow.simulator import SCENARIOS, simulate  # noqa: E402

_NC = len(NIC_COUNTERS)


class NicTable:
    """Every NIC port's state as arrays (a row per port), a ``nic_batch`` applied in one
    numpy step: ``Device.observe``'s arithmetic over rows."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, int], int] = {}
        self.gauges = np.empty((0, 1))
        self.first = np.empty((0, 1))
        self.rates = np.empty((0, _NC))
        self.last = np.empty((0, _NC))
        self.last_ts = np.empty(0)
        self.n = np.empty(0, dtype=np.int64)
        self.down = np.empty(0, dtype=bool)

    def _index(self, keys: list[tuple[str, str, int]]) -> np.ndarray:
        rows = self.rows
        new = [k for k in keys if k not in rows]
        if new:
            m = len(new)
            for k in new:
                rows[k] = len(rows)
            self.gauges = np.concatenate((self.gauges, np.full((m, 1), np.nan)))
            self.first = np.concatenate((self.first, np.full((m, 1), np.nan)))
            self.rates = np.concatenate((self.rates, np.full((m, _NC), np.nan)))
            self.last = np.concatenate((self.last, np.full((m, _NC), np.nan)))
            self.last_ts = np.concatenate((self.last_ts, np.zeros(m)))
            self.n = np.concatenate((self.n, np.zeros(m, dtype=np.int64)))
            self.down = np.concatenate((self.down, np.zeros(m, dtype=bool)))
        return np.array([rows[k] for k in keys])

    def observe_batch(self, b: dict[str, Any]) -> None:
        nics = b["nic"]
        k = len(nics)
        get = b.get
        absent = get("absent") or {}

        def col(name: str) -> list[Any]:
            v = get(name)
            v = v if type(v) is list else [v] * k
            gone = absent.get(name)
            if gone:
                v = list(v)
                for i in gone:
                    v[i] = None
            return v

        idx = self._index(list(zip(repeat(b["host"]), nics, col("port"))))
        ts = np.array(col("ts"), dtype=float)
        gauges = np.array(col("speed_gbps"), dtype=float)[:, None]
        counters = np.array(list(zip(*map(col, NIC_COUNTERS), strict=True)), dtype=float)
        has = ~np.isnan(gauges)
        old = self.gauges[idx]
        new = np.where(np.isnan(old), gauges, old + GAUGE_ALPHA * (gauges - old))
        np.copyto(new, old, where=~has)
        self.gauges[idx] = new
        early = has & (self.n[idx] < 3)[:, None]
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
            ok = hasc & (counters >= prev) & (dt > 0)[:, None]
            if ok.any():
                r = (counters - prev) / dt[:, None]
                oldr = self.rates[idx]
                rate = np.where(np.isnan(oldr), r, oldr + RATE_ALPHA * (r - oldr))
                np.copyto(oldr, rate, where=ok)
                self.rates[idx] = oldr
        self.last_ts[idx] = ts
        self.n[idx] += 1
        self.down[idx] = np.array([s == "down" for s in col("state")])


def _best(fn, repeat_n: int) -> float:
    best = float("inf")
    for _ in range(repeat_n):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="large_1024")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    events = [e for e in simulate(SCENARIOS[args.scenario], seed=0, steps=args.steps).events()
              if e["kind"] == "nic"]
    batches = list(batch_trace(events))
    assert all(b["kind"] == "nic_batch" for b in batches)

    def per_event() -> TelemetryStore:
        st = TelemetryStore()
        for e in events:
            st.observe_nic(e)
        return st

    def loop() -> TelemetryStore:
        st = TelemetryStore()
        for b in batches:
            st.observe_nic_batch(b)
        return st

    def table() -> NicTable:
        t = NicTable()
        for b in batches:
            t.observe_batch(b)
        return t

    # the table's state is the Devices' (the same floats, NaN where a Device lacks a key)
    st, t = loop(), table()
    for key, dev in st.nics.items():
        r = t.rows[key]
        assert dev.rates == {k: x for k, x in zip(NIC_COUNTERS, t.rates[r].tolist(),
                                                 strict=True) if x == x}
        assert dev.n == t.n[r] and dev.down == t.down[r]
    n = len(events)
    print(f"{args.scenario}: {n} nic samples, {len(batches)} nic_batches "
          f"({n / len(batches):.1f} ports each), CPU best of {args.repeat}")
    for name, fn in (("per-port nic events (observe_nic)", per_event),
                     ("nic_batch, rows into Devices (observe_nic_batch)", loop),
                     ("nic_batch, one numpy step (NicTable prototype)", table)):
        s = _best(fn, args.repeat)
        print(f"  {name:50s} {s * 1e6 / n:6.2f} us per sample  ({s:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
