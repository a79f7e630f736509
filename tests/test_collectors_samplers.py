"""Samplers: fake NVML, the fake sysfs tree, and this machine's real /proc and /sys/class/net."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pynvml
import pytest
from fakes.nvml import FakeGpu, FakeNVML

from failslow.collectors.gpu import GpuSampler
from failslow.collectors.host import HostSampler
from failslow.collectors.nic import NicSampler
from failslow.collectors.samplers import (
    BANDS,
    RATE_COUNTERS,
    OnChange,
    OnChangeConfig,
    filter_trace,
)
from failslow.schema import validate

FIXTURE_SYS = Path(__file__).parent / "fixtures" / "sysfs"


def eight_gpus() -> FakeNVML:
    return FakeNVML([FakeGpu(uuid=f"GPU-{i:08x}") for i in range(8)])


# -- GPU ---------------------------------------------------------------------------------------

def test_gpu_every_field_and_units():
    nvml = eight_gpus()
    sampler = GpuSampler(nvml=nvml, host="h0", ranks={3: ("job0", 11)}, clock=lambda: 1.7e9)
    events = sampler.sample()
    assert [e["gpu"] for e in events] == list(range(8))
    for e in events:
        validate(e)
    e = events[3]
    assert e["uuid"] == "GPU-00000003" and e["job_id"] == "job0" and e["rank"] == 11
    assert e["power_w"] == 650.0 and e["power_limit_w"] == 700.0  # from mW
    assert e["pcie_tx_bytes_s"] == 1_000_000 * 1024.0  # from KB/s
    assert e["max_sm_clock_mhz"] == 1980 and e["pcie_max_gen"] == 5 and e["xid"] == []
    assert e["mem_used_bytes"] == 40 << 30 and e["nvlink_crc_errors_total"] == 0
    assert "job_id" not in events[0]
    # every optional field of the contract that NVML can give is filled
    missing = {k for k, v in e.items() if v is None}
    assert not missing


def test_gpu_nvml_initialized_once_and_changes_show():
    nvml = eight_gpus()
    sampler = GpuSampler(nvml=nvml, host="h0")
    sampler.sample()
    g = nvml.gpus[5]
    g.sm_clock, g.temp, g.reasons, g.pcie_width = 1200, 92, 0x40 | 0x20, 8
    g.ecc_sbe, g.pcie_replay, g.nvlink_crc_per_link = 3, 7, 2
    nvml.inject_xid(5, 79)
    nvml.inject_xid(5, 48)
    e = sampler.sample()[5]
    assert nvml.init_calls == 1
    assert (e["sm_clock_mhz"], e["temp_c"], e["clocks_event_reasons"]) == (1200, 92, 0x60)
    assert e["pcie_width"] == 8 and e["ecc_sbe_total"] == 3 and e["pcie_replay_total"] == 7
    assert e["nvlink_crc_errors_total"] == 2 * 18
    assert e["xid"] == [79, 48]
    assert sampler.sample()[5]["xid"] == []  # XIDs are reported once


def test_gpu_unsupported_fields_are_null_not_asked_again():
    gpus = [FakeGpu(uuid="GPU-a", unsupported={"nvmlDeviceGetPcieReplayCounter",
                                               "nvmlDeviceGetTotalEccErrors",
                                               "nvmlDeviceGetNvLinkState",
                                               "nvmlDeviceGetCurrentClocksEventReasons"})]
    nvml = FakeNVML(gpus, event_sets=False)
    sampler = GpuSampler(nvml=nvml, host="h0")
    e = sampler.sample()[0]
    validate(e)
    assert e["pcie_replay_total"] is None and e["ecc_sbe_total"] is None
    assert e["ecc_dbe_total"] is None and e["nvlink_crc_errors_total"] is None
    assert e["xid"] is None and e["clocks_event_reasons"] is None
    assert e["sm_clock_mhz"] == 1980
    before = nvml.calls
    sampler.sample()
    per_sample = nvml.calls - before
    sampler.sample()
    assert nvml.calls - before == 2 * per_sample  # unsupported calls are not retried


def test_gpu_that_disappears_is_reported_not_a_crash(caplog):
    nvml = eight_gpus()
    sampler = GpuSampler(nvml=nvml, host="h0")
    nvml.gpus[2].lost = True
    events = sampler.sample()
    assert [e["gpu"] for e in events] == [0, 1, 3, 4, 5, 6, 7]
    assert sampler.lost == {2}
    assert "GPU 2" in caplog.text and "lost" in caplog.text
    assert len(sampler.sample()) == 7


def test_gpu_real_nvml_errors_are_pynvml_errors():
    nvml = FakeNVML([FakeGpu(uuid="GPU-a", unsupported={"nvmlDeviceGetPowerUsage"})])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0))


# -- NIC ---------------------------------------------------------------------------------------

def test_nic_fake_tree_fields_and_units(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE_SYS, root)
    sampler = NicSampler(host="h0", sys_root=str(root), clock=lambda: 1.7e9)
    events = {(e["nic"], e["port"]): e for e in sampler.sample()}
    assert set(events) == {("mlx5_0", 1), ("mlx5_1", 1), ("eth0", 0)}
    for e in events.values():
        validate(e)
    ib = events[("mlx5_0", 1)]
    assert ib["tx_bytes_total"] == 1000 * 4 and ib["rx_bytes_total"] == 2000 * 4  # 4-byte words
    assert (ib["cnp_sent_total"], ib["cnp_handled_total"], ib["ecn_marked_total"]) == (7, 8, 9)
    assert ib["out_of_sequence_total"] == 4 and ib["link_downed_total"] == 2
    assert ib["symbol_errors_total"] == 3 and ib["xmit_wait_total"] == 12345
    assert ib["rx_drops_total"] == 5 and ib["state"] == "up" and ib["speed_gbps"] == 200.0
    assert "tx_pause_total" not in ib  # mlx5 keeps PFC pause counters out of sysfs
    assert events[("mlx5_1", 1)]["state"] == "down"
    eth = events[("eth0", 0)]
    assert eth["speed_gbps"] == 25.0 and eth["state"] == "up" and eth["tx_bytes_total"] == 5000

    counters = root / "class/infiniband/mlx5_0/ports/1"
    (counters / "counters/port_xmit_data").write_text("1500\n")
    (counters / "hw_counters/np_cnp_sent").write_text("70\n")
    again = {(e["nic"], e["port"]): e for e in sampler.sample()}
    assert again[("mlx5_0", 1)]["tx_bytes_total"] == 6000
    assert again[("mlx5_0", 1)]["cnp_sent_total"] == 70


def test_nic_real_sys_class_net_counters_move():
    sampler = NicSampler(host="h0")
    first = {e["nic"]: e for e in sampler.sample()}
    assert "lo" in first, "this machine has no /sys/class/net/lo"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(20):
            s.sendto(b"x" * 1000, ("127.0.0.1", 9))
    second = {e["nic"]: e for e in sampler.sample()}
    for e in second.values():
        validate(e)
    assert second["lo"]["tx_bytes_total"] >= first["lo"]["tx_bytes_total"] + 20_000
    assert second["lo"]["tx_packets_total"] >= first["lo"]["tx_packets_total"] + 20


# -- host --------------------------------------------------------------------------------------

def test_host_real_proc_counters_move():
    sampler = HostSampler(host="h0")
    first = sampler.sample()[0]
    validate(first)
    x = 0
    for i in range(2_000_000):  # burn a little CPU so the next interval has user time
        x += i
    second = sampler.sample()[0]
    validate(second)
    assert 0 < second["cpu_util_pct"] <= 100
    assert 0 <= second["cpu_iowait_pct"] <= 100 and 0 <= second["cpu_steal_pct"] <= 100
    assert second["mem_available_bytes"] > 0 and second["load1"] >= 0
    assert second["procs_running"] >= 1
    assert second["ts"] >= first["ts"]


def test_host_missing_proc_gives_nulls(tmp_path):
    e = HostSampler(host="h0", proc_root=str(tmp_path)).sample()[0]
    validate(e)
    assert e["load1"] is None and e["mem_available_bytes"] is None


# -- on change (collectors.samplers.OnChange) ---------------------------------------------------

class _Clock:
    def __init__(self, t: float = 1.7e9) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _gpus_on_change(**config) -> tuple[FakeNVML, GpuSampler, _Clock, OnChange]:
    nvml, clock = eight_gpus(), _Clock()
    return nvml, GpuSampler(nvml=nvml, host="h0", clock=clock), clock, \
        OnChange(OnChangeConfig(**config))


def _cycle(sampler, clock: _Clock, flt: OnChange) -> list[dict]:
    clock.t += 1.0
    return flt.filter(sampler.sample())


def test_on_change_quiet_gpus_one_sample_per_cycle_and_a_heartbeat_each():
    nvml, sampler, clock, flt = _gpus_on_change(heartbeat_s=10.0)
    assert len(_cycle(sampler, clock, flt)) == 8            # first samples: all
    sent: dict[int, list[float]] = {i: [] for i in range(8)}
    for _ in range(30):
        out = _cycle(sampler, clock, flt)
        # nothing moved: one sample a cycle (the host keeps publishing its kind), the GPU
        # that waited longest; so every GPU is heard from well within the heartbeat
        assert len(out) == 1
        sent[out[0]["gpu"]].append(out[0]["ts"])
    for ts in sent.values():
        assert ts and max(b - a for a, b in zip([1.7e9 + 1, *ts], ts, strict=False)) <= 10.0
    assert flt.kept["gpu"] == 8 + 30 and flt.dropped["gpu"] == 30 * 7


def test_on_change_without_the_per_host_minimum_only_heartbeats():
    nvml, sampler, clock, flt = _gpus_on_change(heartbeat_s=5.0, per_host_min=False)
    _cycle(sampler, clock, flt)
    counts = [len(_cycle(sampler, clock, flt)) for _ in range(10)]
    assert counts == [0, 0, 0, 0, 8, 0, 0, 0, 0, 8]


def test_on_change_a_throttle_is_published_with_its_settling_samples_a_jiggle_is_not():
    nvml, sampler, clock, flt = _gpus_on_change(settle=3, per_host_min=False)
    _cycle(sampler, clock, flt)
    nvml.gpus[2].sm_clock = 1975            # 0.3 %: inside the 2 % band
    nvml.gpus[4].temp = 65                  # 1 C: inside the 2 C band
    assert _cycle(sampler, clock, flt) == []
    nvml.gpus[5].sm_clock = 1200
    nvml.gpus[5].reasons = 0x40
    out = [[e["gpu"] for e in _cycle(sampler, clock, flt)] for _ in range(6)]
    assert out == [[5], [5], [5], [5], [], []]   # the move, then 3 to settle
    out = _cycle(sampler, clock, flt)
    nvml.gpus[4].temp = 66                  # 2 C above the sample kept: still inside
    nvml.gpus[3].temp = 67                  # 3 C above: out
    assert [e["gpu"] for e in _cycle(sampler, clock, flt)] == [3]


def test_on_change_never_drops_an_xid_or_a_pcie_link_change():
    nvml, sampler, clock, flt = _gpus_on_change(settle=0, per_host_min=False)
    _cycle(sampler, clock, flt)
    nvml.inject_xid(6, 79)
    nvml.gpus[1].pcie_width = 8
    out = _cycle(sampler, clock, flt)
    assert {e["gpu"]: e for e in out}.keys() == {1, 6}
    assert {e["gpu"]: e for e in out}[6]["xid"] == [79]


def test_on_change_error_counters_that_start_counting_are_published():
    nvml, sampler, clock, flt = _gpus_on_change(settle=0, per_host_min=False)
    _cycle(sampler, clock, flt)
    _cycle(sampler, clock, flt)
    nvml.gpus[7].ecc_sbe += 2               # within the noise of a rate of 0
    assert _cycle(sampler, clock, flt) == []
    nvml.gpus[7].pcie_replay += 500         # 500 replays in a second: a move
    out = _cycle(sampler, clock, flt)
    assert [e["gpu"] for e in out] == [7] and out[0]["pcie_replay_total"] == 500
    nvml.gpus[7].pcie_replay += 510         # the same rate again: nothing new
    assert _cycle(sampler, clock, flt) == []


def test_on_change_nic_congestion_from_the_fake_sysfs_tree(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE_SYS, root)
    clock = _Clock()
    sampler = NicSampler(host="h0", sys_root=str(root), clock=clock)
    flt = OnChange(OnChangeConfig(settle=0, per_host_min=False))
    assert len(_cycle(sampler, clock, flt)) == 3
    port = root / "class/infiniband/mlx5_0/ports/1"
    (port / "counters/port_xmit_data").write_text("900000\n")   # traffic alone: quiet
    assert _cycle(sampler, clock, flt) == []
    (port / "hw_counters/np_cnp_sent").write_text("5007\n")     # 5,000 CNPs in a second
    out = _cycle(sampler, clock, flt)
    assert [(e["nic"], e["cnp_sent_total"]) for e in out] == [("mlx5_0", 5007)]


def test_on_change_passes_other_kinds_and_keeps_the_order():
    flt = OnChange()
    step = {"v": 1, "kind": "step", "ts": 1.0, "job_id": "j", "rank": 0, "world_size": 1,
            "host": "h0", "step": 0, "duration_s": 1.0}
    host = {"v": 1, "kind": "host", "ts": 1.0, "host": "h0", "load1": 3.0}
    assert flt.filter([step, host, step]) == [step, host, step]
    assert flt.filter([step, dict(host, ts=2.0), step]) == [step, dict(host, ts=2.0), step]


def test_on_change_bands_cover_what_the_root_cause_reads():
    from failslow.models import telemetry

    read = {*telemetry.GPU_GAUGES, *telemetry.HOST_GAUGES, "speed_gbps", "state",
            "clocks_event_reasons"}
    assert read <= set(BANDS)
    assert {*telemetry.GPU_COUNTERS, *telemetry.NIC_COUNTERS} <= set(RATE_COUNTERS)


def test_on_change_config_is_checked():
    for bad in ({"heartbeat_s": 0}, {"settle": -1}, {"bands": {"temp_c": ("pct", 1.0)}}):
        with pytest.raises(ValueError):
            OnChangeConfig(**bad)


def test_filter_trace_is_each_host_agent_s_filter_cycle_by_cycle():
    def gpu(host: str, i: int, t: float, clock: float = 1980.0) -> dict:
        return {"v": 1, "kind": "gpu", "ts": t, "host": host, "gpu": i, "uuid": f"{host}-{i}",
                "sm_clock_mhz": clock}
    trace = []
    for t in range(1, 13):
        for host in ("a", "b"):
            trace += [gpu(host, i, t + 0.001 * i, 1500.0 if (host, i, t) == ("b", 1, 7)
                          else 1980.0) for i in range(4)]
    kept = filter_trace(trace, OnChangeConfig(settle=0))
    by_host = {h: [(e["ts"], e["gpu"]) for e in kept if e["host"] == h] for h in "ab"}
    assert len(by_host["a"]) == 4 + 11                 # first cycle, then one per cycle
    assert [g for t, g in by_host["a"][4:]] == [0, 1, 2, 3] * 2 + [0, 1, 2]
    # the clock drop at t=7 and the return at t=8 are published, not just the round
    assert (7.001, 1) in by_host["b"] and (8.001, 1) in by_host["b"]
    ids = set(map(id, kept))
    assert kept == [e for e in trace if id(e) in ids]           # in the trace's order
