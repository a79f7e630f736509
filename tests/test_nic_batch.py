"""``nic_batch`` (issue 31): a host's NIC ports sampled together as one columnar message,
rows named by NIC and port. Lossless both ways (the property tests are in
test_schema_batches.py), gathered by the agents' Batcher a row per port, taken whole by
`failslow detect` and the telemetry store, and giving the per-rank trace's incidents and
store state byte for byte."""

from __future__ import annotations

import copy

import orjson
import pytest
from batch_support import detect_all, store_state

from failslow.models.telemetry import TelemetryStore
from failslow.schema import decode, decode_lenient, encode
from failslow.schema.batches import Batcher, batch_trace, expand, take, to_batch, valid
from failslow.schema.topics import Topics, key_for
from failslow.simulator import SCENARIOS, simulate

T0 = 1.7e9


def _nic(nic: str, port: int, ts: float = T0, **patch) -> dict:
    ev = {"v": 1, "kind": "nic", "ts": ts, "host": "h0", "nic": nic, "port": port,
          "tx_bytes_total": 10, "rx_bytes_total": 20, "state": "up", "speed_gbps": 400.0,
          "symbol_errors_total": 3}
    ev.update(patch)
    return ev


def _ports(ts: float = T0, **patch) -> list[dict]:
    return [_nic(n, p, ts, **patch) for n in ("mlx5_0", "mlx5_1") for p in (1, 2)]


def test_a_hosts_ports_are_one_batch_and_come_back_exactly():
    rows = _ports()
    rows[1]["state"] = "down"
    del rows[2]["symbol_errors_total"]
    rows[3]["speed_gbps"] = None
    b = to_batch(copy.deepcopy(rows))
    assert b["kind"] == "nic_batch" and b["host"] == "h0"
    assert b["nic"] == ["mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1"] and b["port"] == [1, 2, 1, 2]
    assert b["tx_bytes_total"] == 10 and b["absent"] == {"symbol_errors_total": [2]}
    assert valid(b) and expand(b) == rows
    assert decode(encode(b)) == rows and decode_lenient(encode([b]), Topics().kinds_of(
        "failslow.nic")) == (rows, [])
    assert Topics().for_kind("nic_batch") == Topics().for_kind("nic") and key_for(b) == "h0"
    assert expand(take(b, [3, 1])) == [rows[3], rows[1]]


def test_the_batcher_makes_a_row_of_each_port_and_a_batch_of_each_sample_round():
    batcher = Batcher(linger_s=0.5)
    out = []
    for k in range(3):                      # three rounds of a host's four ports
        for ev in _ports(T0 + k):
            out += batcher.add(ev, ev["ts"])
    out += batcher.flush()
    assert [b["kind"] for b in out] == ["nic_batch"] * 3
    assert all(len(b["nic"]) == 4 for b in out)
    assert [r for b in out for r in expand(b)] == [e for k in range(3) for e in _ports(T0 + k)]


def test_a_nic_batch_updates_the_store_as_its_samples_one_by_one():
    events = [e for e in simulate(SCENARIOS["nic_errors_flap"], seed=4, steps=40).events()
              if e["kind"] == "nic"]
    # fields absent, null and changing state on some rows
    events[1] = {k: v for k, v in events[1].items() if k != "symbol_errors_total"}
    events[2] = dict(events[2], speed_gbps=None, state="down")
    one, whole = TelemetryStore(), TelemetryStore()
    for e in events:
        one.observe_nic(e)
    batches = list(batch_trace(events))
    assert {b["kind"] for b in batches} == {"nic_batch"} and len(batches) < len(events) / 2
    for b in batches:
        assert valid(b)
        whole.observe_nic_batch(b)
    assert len(one.nics) > 1
    assert {k: (d.gauges, d.first, d.rates, d.last, d.down, d.last_ts, d.n, d.xids)
            for k, d in whole.nics.items()} == {
        k: (d.gauges, d.first, d.rates, d.last, d.down, d.last_ts, d.n, d.xids)
        for k, d in one.nics.items()}
    assert any(d.rates for d in whole.nics.values())


def test_a_port_twice_in_one_batch_is_applied_row_after_row():
    rows = [_nic("mlx5_0", 1, T0, symbol_errors_total=3), _nic("mlx5_1", 1, T0),
            _nic("mlx5_0", 1, T0 + 1, symbol_errors_total=9, state="down")]
    one, whole = TelemetryStore(), TelemetryStore()
    for e in rows:
        one.observe_nic(e)
    whole.observe_nic_batch(to_batch(rows))
    for key, d in one.nics.items():
        w = whole.nics[key]
        assert (w.gauges, w.first, w.rates, w.last, w.down, w.last_ts, w.n) == (
            d.gauges, d.first, d.rates, d.last, d.down, d.last_ts, d.n)
    assert whole.nics[("h0", "mlx5_0", 1)].rates["symbol_errors_total"] == 6.0




@pytest.mark.parametrize("scenario,steps", [("slow_link_host_50", 70), ("nic_errors_flap", None),
                                            ("slow_link_pair_3x", 70), ("gpu_thermal_30", 60)])
def test_incidents_and_store_state_are_those_of_the_per_rank_trace(scenario, steps):
    events = list(simulate(SCENARIOS[scenario], seed=2, steps=steps).events())
    batched = list(batch_trace(events))
    kinds = {e["kind"] for e in batched}
    assert "nic_batch" in kinds and "nic" not in kinds
    want, det_a, warned_a = detect_all([orjson.dumps(e) for e in events])
    got, det_b, warned_b = detect_all([orjson.dumps(e) for e in batched])
    assert not warned_a and not warned_b
    assert want.count(b"\n") >= 1
    assert got == want
    assert store_state(det_b.store) == store_state(det_a.store)
    assert det_b.rejected == det_a.rejected == 0
    assert det_b.late_samples == det_a.late_samples


def test_a_bad_nic_batch_line_is_one_warning_and_costs_no_other_line():
    good = to_batch(_ports())
    short = dict(good, speed_gbps=[1.0])                        # a column of the wrong length
    one_bad = dict(good, symbol_errors_total=[1, "many", 3, 4])  # one row's value, wrong type
    lines = [orjson.dumps(x) for x in (good, short, one_bad, dict(good, ts=T0 + 1))]
    _, det, warned = detect_all(lines)
    assert warned == [(2, "nic_batch.speed_gbps: 1 values for 4 rows"),
                      (3, "nic_batch row 1 (nic 'mlx5_0'): nic.symbol_errors_total: expected "
                          "an integer, got str 'many'")]
    # the good lines' rows, and line 3's three good rows, reached the store
    assert det.store.nics[("h0", "mlx5_0", 1)].n == 3
    assert det.store.nics[("h0", "mlx5_0", 2)].n == 2
    assert det.rejected == 0
