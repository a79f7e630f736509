"""Telemetry of the simulator: counters only grow, and every fault leaves its signature."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from failslow.simulator import FaultSpec, JobSpec, Scenario, simulate

DP16 = (JobSpec(),)
START = 1_767_225_600.0


def _run(*faults: FaultSpec, steps: int = 50) -> list[dict]:
    return list(simulate(Scenario("x", "x", DP16, steps=steps, faults=faults), seed=2).events())


def _gpu(events, host, gpu, after):
    return [e for e in events if e["kind"] == "gpu" and e["host"] == host and e["gpu"] == gpu
            and e["ts"] - START >= after]


def _nic_rate(events, field, host, nic, lo, hi):
    s = [e for e in events if e["kind"] == "nic" and e["host"] == host and e["nic"] == nic
         and lo <= e["ts"] - START < hi]
    return (s[-1][field] - s[0][field]) / (s[-1]["ts"] - s[0]["ts"])


def test_counters_are_monotonic():
    events = _run(FaultSpec("nic_errors", 10, 30, 1.0, host="h1"),
                  FaultSpec("gpu_errors", 10, 30, 1.0, rank=3))
    last: dict = {}
    for e in events:
        if e["kind"] not in ("nic", "gpu"):
            continue
        key = (e["kind"], e["host"], e.get("nic", e.get("gpu")))
        for name, value in e.items():
            if name.endswith("_total"):
                assert value >= last.get((key, name), 0), (key, name)
                last[(key, name)] = value
    assert len(last) > 100


def test_traffic_grows_nic_bytes():
    events = _run(steps=30)
    rate = _nic_rate(events, "tx_bytes_total", "h0", "mlx5_3", 10, 25)
    assert 1e9 < rate < 50e9  # busy, below a 400 Gb/s port


@pytest.mark.parametrize("kind, intensity, check", [
    ("gpu_thermal", 0.5, lambda s, h: (s["temp_c"] > 80 and s["clocks_event_reasons"] & 0x60
                                       and s["sm_clock_mhz"] < 0.8 * h["sm_clock_mhz"])),
    ("gpu_power", 0.5, lambda s, h: (s["clocks_event_reasons"] & 0x04
                                     and s["power_limit_w"] < h["power_limit_w"]
                                     and s["power_w"] <= s["power_limit_w"])),
    ("gpu_clock", 0.3, lambda s, h: (s["clocks_event_reasons"] == 0
                                     and s["sm_clock_mhz"] < 0.85 * h["sm_clock_mhz"])),
    ("pcie_degraded", 0.6, lambda s, h: (s["pcie_width"] < s["pcie_max_width"]
                                         and h["pcie_width"] == h["pcie_max_width"])),
])
def test_gpu_fault_signature(kind, intensity, check):
    events = _run(FaultSpec(kind, 20, None, intensity, rank=5), steps=60)
    sick = _gpu(events, "h0", 5, 40)
    healthy = _gpu(events, "h0", 6, 40)
    hits = sum(bool(check(s, h)) for s, h in zip(sick, healthy, strict=False))
    assert hits >= 0.8 * len(sick) > 0
    before = _gpu(events, "h0", 5, 5)[:10]
    assert sum(bool(check(s, h)) for s, h in zip(before, healthy, strict=False)) <= 1


def test_gpu_errors_signature():
    events = _run(FaultSpec("gpu_errors", 20, None, 1.0, rank=9), steps=50)
    sick = _gpu(events, "h1", 1, 0)
    ok = _gpu(events, "h1", 2, 0)
    assert sick[-1]["ecc_sbe_total"] - sick[0]["ecc_sbe_total"] > 100
    assert any(s["xid"] for s in sick) and not any(s["xid"] for s in ok)
    assert ok[-1]["ecc_sbe_total"] - ok[0]["ecc_sbe_total"] < 3


def test_congestion_signature():
    events = _run(FaultSpec("slow_link", 20, None, 0.5, host="h1"), steps=50)
    for field in ("rx_pause_total", "cnp_handled_total", "ecn_marked_total"):
        sick = _nic_rate(events, field, "h1", "mlx5_2", 25, 45)
        ok = _nic_rate(events, field, "h0", "mlx5_2", 25, 45)
        before = _nic_rate(events, field, "h1", "mlx5_2", 5, 18)
        assert sick > 10 * max(ok, before, 1.0), field


def test_nic_errors_signature():
    events = _run(FaultSpec("nic_errors", 15, None, 1.0, host="h0"), steps=60)
    assert _nic_rate(events, "symbol_errors_total", "h0", "mlx5_1", 20, 55) > 10
    assert _nic_rate(events, "symbol_errors_total", "h1", "mlx5_1", 20, 55) == 0
    flaps = [e for e in events if e["kind"] == "nic" and e["host"] == "h0"
             and e["state"] == "down"]
    assert flaps and all(e["ts"] - START >= 15 for e in flaps)


def test_cpu_contention_signature():
    events = _run(FaultSpec("cpu_contention", 20, None, 0.5, host="h1"), steps=50)
    cpu = defaultdict(list)
    for e in events:
        if e["kind"] == "host" and e["ts"] - START > 25:
            cpu[e["host"]].append(e["cpu_util_pct"])
    assert np.median(cpu["h1"]) > 90 > 2 * np.median(cpu["h0"])
    util = defaultdict(list)
    for e in events:
        if e["kind"] == "gpu" and e["ts"] - START > 25:
            util[e["host"]].append(e["util_pct"])
    assert np.median(util["h1"]) < np.median(util["h0"]) - 10


def test_input_stall_signature():
    events = _run(FaultSpec("input_stall", 20, None, 0.5, rank=7), steps=50)
    data = defaultdict(list)
    for e in events:
        if e["kind"] == "step" and e["step"] >= 30:
            data[e["rank"] == 7].append(e["data_s"])
    assert np.median(data[True]) > 0.4 > 10 * np.median(data[False])


def test_ended_job_goes_idle():
    sc = Scenario("e", "end", (JobSpec(), JobSpec(job_id="job1")), steps=40,
                  faults=(FaultSpec("job_end", 15, job="job1"),))
    trace = simulate(sc, seed=0)
    events = list(trace.events())
    last_step = max(e["ts"] for e in events if e["kind"] == "step" and e["job_id"] == "job1")
    assert last_step - START < 20
    late = [e for e in events if e["kind"] == "gpu" and e["host"] == "h2"
            and e["ts"] > last_step + 2]
    assert late and all(e["util_pct"] == 0 and e["job_id"] is None for e in late)
    assert any(b["kind"] == "job_end" and b["job_id"] == "job1" for b in trace.truth["benign"])
