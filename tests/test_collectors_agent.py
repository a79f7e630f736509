"""`failslow collect` (SIGTERM flushes), `failslow replay`, the agent loop, the NCCL tailer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from fakes.kafka import read_events
from waiting import wait_until

from failslow.collectors.agent import Agent
from failslow.collectors.nccl_inspector import InspectorTailer
from failslow.schema import validate


def _record(sn: int, rank: int = 1, coll: str = "AllReduce", verbose: bool = False) -> dict:
    perf = {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": 1 << 20,
            "coll_exec_time_us": 1500, "coll_algobw_gbs": 100.0, "coll_busbw_gbs": 175.0}
    if verbose:
        perf["event_trace_ts"] = {"coll_start_ts": 1_700_000_000_000_000 + sn * 10_000,
                                  "coll_stop_ts": 1_700_000_000_001_000 + sn * 10_000}
    return {"header": {"id": "0x7f8c496ae9f661", "rank": rank, "n_ranks": 8, "nnodes": 1},
            "metadata": {"inspector_output_format_version": "v4.0", "hostname": "node7",
                         "pid": 4242, "dump_timestamp_us": 1_700_000_000_500_000 + sn},
            "coll_perf": perf}


def test_nccl_inspector_follows_files(tmp_path):
    dump = tmp_path / "nccl-inspector"
    dump.mkdir()
    old = dump / "node7-pid4242.log"
    old.write_text(json.dumps(_record(0)) + "\n")
    # starts at the end, like tail -f
    tailer = InspectorTailer(str(dump), job_id="job0", grain="collective")
    assert tailer.sample() == []
    with old.open("a") as f:
        f.write(json.dumps(_record(1)) + "\n")
        f.write(json.dumps(_record(2, verbose=True), indent=2) + "\n")  # pretty-printed
        f.write(json.dumps(_record(3, coll="AllGather"))[:40])  # still being written
    events = tailer.sample()
    assert [e["seq"] for e in events] == [1, 2]
    for e in events:
        validate(e)
    e = events[1]
    assert e["op"] == "allreduce" and e["group"] == "nccl-0x7f8c496ae9f661"
    assert e["rank"] == 1 and e["group_size"] == 8 and e["host"] == "node7"
    assert e["bytes"] == 1 << 20 and e["duration_s"] == 0.0015
    assert e["start_ts"] == 1_700_000_000.02 and abs(e["ts"] - (e["start_ts"] + 0.0015)) < 1e-9
    with old.open("a") as f:
        f.write(json.dumps(_record(3, coll="AllGather"))[40:] + "\n")
        f.write("{not json}\n")
    (dump / "node7-pid4243.log").write_text(json.dumps(_record(0, rank=2)) + "\n")
    events = tailer.sample()
    assert sorted((e["rank"], e["seq"], e["op"]) for e in events) == [
        (1, 3, "allgather"), (2, 0, "allreduce")]
    assert tailer.bad_records == 1


def test_nccl_inspector_summarizes_each_sample_per_rank(tmp_path):
    """The default grain: one ``comm`` record per (rank, host) per sample, equal to the
    raw events read in it; concurrent ops of two communicators never double count."""
    dump = tmp_path / "nccl-inspector"
    dump.mkdir()
    lines = [_record(sn, verbose=True) for sn in range(4)]
    lines += [_record(7, rank=2), _record(8, rank=2, coll="Send")]
    other = _record(0, verbose=True)  # another communicator, overlapping seq 0 exactly
    other["header"]["id"] = "0x99"
    lines.append(other)
    (dump / "node7-pid4242.log").write_text("".join(json.dumps(r) + "\n" for r in lines))
    clock = iter([1_700_000_000.0, 1_700_000_001.0, 1_700_000_002.0]).__next__
    raw = InspectorTailer(str(dump), job_id="job0", from_start=True, grain="collective")
    tailer = InspectorTailer(str(dump), job_id="job0", from_start=True, clock=clock)
    want = raw.sample()
    got = tailer.sample()
    for ev in got:
        validate(ev)
    assert [(e["rank"], e["host"], e["step"]) for e in got] == [(1, "node7", None),
                                                                 (2, "node7", None)]
    one = got[0]
    assert one["window_start_ts"] == 1_700_000_000.0 and one["ts"] == 1_700_000_001.0
    entries = {(o["group"], o["op"]): o for o in one["ops"]}
    ar = entries[("nccl-0x7f8c496ae9f661", "allreduce")]
    assert (ar["n"], ar["bytes"], ar["first_seq"], ar["last_seq"]) == (4, 4 << 20, 0, 3)
    assert ar["min_s"] == ar["max_s"] == 0.0015
    assert ar["first_start_ts"] == 1_700_000_000.0
    # seq 0 of both communicators ran over the same 1.5 ms: 0.75 ms each
    assert abs(ar["blocked_s"] - (3 * 0.0015 + 0.00075)) < 1e-6  # (µs on epoch floats)
    assert abs(entries[("nccl-0x99", "allreduce")]["blocked_s"] - 0.00075) < 1e-6
    n_raw = {(e["rank"], e["op"]): 0 for e in want}
    for e in want:
        n_raw[(e["rank"], e["op"])] += 1
    n_comm = {(r["rank"], o["op"]): 0 for r in got for o in r["ops"]}
    for r in got:
        for o in r["ops"]:
            n_comm[(r["rank"], o["op"])] += o["n"]
    assert n_comm == n_raw
    # an op read one dump interval late widens the window back to its end
    late = got[1]
    assert late["window_start_ts"] <= min(e["ts"] for e in want if e["rank"] == 2)
    assert tailer.sample() == []  # nothing new: nothing published


class _ListPublisher:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.stats = dict.fromkeys(("delivered", "pending", "spooled", "dropped", "failed"), 0)

    def publish(self, events: list[dict]) -> None:
        self.events += events


class _Boom:
    name = "boom"

    def sample(self) -> list[dict]:
        raise OSError("device vanished")


class _Counter:
    name = "count"

    def __init__(self) -> None:
        self.n = 0

    def sample(self) -> list[dict]:
        self.n += 1
        return [{"v": 1, "kind": "host", "ts": float(self.n), "host": "h"}]


def test_agent_survives_a_broken_sampler_and_reports(caplog):
    pub = _ListPublisher()
    agent = Agent([_Boom(), _Counter()], pub, interval_s=0.01, report_s=0.0)
    caplog.set_level("INFO")
    agent.run(threading.Event(), cycles=5)
    assert len(pub.events) == 5 and agent.errors["boom"] == 5
    assert "events count=" in caplog.text and "sampler boom failed" in caplog.text


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "failslow.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_collect_sigterm_flushes(broker, topics, tmp_path):
    # A long linger keeps the last samples inside the producer: only the flush on
    # SIGTERM gets them to the broker. The first batch arriving (one linger after the
    # first sample) says the agent has been sampling for a while.
    proc = _cli("collect", "--samplers", "host,nic", "--interval", "0.2", "--linger-ms", "8000",
                "--bootstrap", broker.bootstrap, "--topic-prefix", topics.prefix,
                "--spool-dir", str(tmp_path / "spool"), "--host", "collect-test")

    def first_batch_arrived() -> list[dict]:
        assert proc.poll() is None, proc.communicate()[0]
        return read_events(broker.bootstrap, topics.for_kind("host"), expect_events=1, timeout=1)

    wait_until(first_batch_arrived, timeout=90, what="the first batch on the broker")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    m = re.search(r"stopped after (\d+) cycles: published=(\d+) delivered=(\d+)", out)
    assert m, out
    cycles, published, delivered = map(int, m.groups())
    assert cycles >= 3 and published == delivered
    hosts = read_events(broker.bootstrap, topics.for_kind("host"), expect_events=cycles)
    assert len(hosts) == cycles and all(e["host"] == "collect-test" for e in hosts)
    assert [e["ts"] for e in hosts] == sorted(e["ts"] for e in hosts)
    nics = read_events(broker.bootstrap, topics.for_kind("nic"),
                       expect_events=published - cycles)
    assert len(nics) == published - cycles


def test_collect_comm_grain_flag(tmp_path):
    import argparse

    from failslow.commands.collect import add_arguments, build_samplers

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for argv, grain in (([], "comm"), (["--comm-grain", "collective"], "collective")):
        args = parser.parse_args(["--samplers", "nccl", "--nccl-dir", str(tmp_path),
                                  "--job-id", "j", *argv])
        [tailer] = build_samplers(args, "h0")
        assert isinstance(tailer, InspectorTailer) and tailer.grain == grain
    proc = _cli("collect", "--comm-grain", "ops", "--bootstrap", "127.0.0.1:1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--comm-grain" in out


def test_collect_rejects_bad_input():
    proc = _cli("collect", "--samplers", "gpu,disk", "--bootstrap", "127.0.0.1:1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "unknown disk" in out.strip().splitlines()[-1]


def test_replay_publishes_in_ts_order(broker, topics, tmp_path: Path):
    trace = tmp_path / "trace.jsonl"
    ts = [5.0, 1.0, 3.0, 2.0, 4.0]
    lines = [json.dumps({"v": 1, "kind": "host", "ts": 1.7e9 + t, "host": "h0"}) for t in ts]
    lines.insert(2, '{"v": 1, "kind": "host"}')  # missing fields: skipped, reported
    trace.write_text("\n".join(lines) + "\n")
    proc = _cli("replay", str(trace), "--speed", "100", "--bootstrap", broker.bootstrap,
                "--topic-prefix", topics.prefix, env={**os.environ})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "replayed 5 of 5 events" in out and "1 bad lines" in out and ":3:" in out
    got = read_events(broker.bootstrap, topics.for_kind("host"), expect_events=5)
    assert [e["ts"] - 1.7e9 for e in got] == [1.0, 2.0, 3.0, 4.0, 5.0]


class _Gpus:
    """Eight quiet GPUs of one host and a step event, every cycle."""

    name = "gpus"

    def __init__(self) -> None:
        self.t = 1.7e9

    def sample(self) -> list[dict]:
        self.t += 1.0
        step = {"v": 1, "kind": "step", "ts": self.t, "job_id": "j", "rank": 0,
                "world_size": 1, "host": "h", "step": int(self.t), "duration_s": 1.0}
        return [step, *({"v": 1, "kind": "gpu", "ts": self.t, "host": "h", "gpu": i,
                         "uuid": f"GPU-{i}", "sm_clock_mhz": 1980.0, "temp_c": 60.0}
                        for i in range(8))]


def test_agent_publishes_device_samples_on_change_by_default(caplog):
    pub = _ListPublisher()
    agent = Agent([_Gpus()], pub, interval_s=0.0, report_s=0.0)
    caplog.set_level("INFO")
    agent.run(threading.Event(), cycles=11)
    kinds = [e["kind"] for e in pub.events]
    # every step; all GPUs once, then one GPU a cycle (the host's gpu kind stays alive)
    assert kinds.count("step") == 11 and kinds.count("gpu") == 8 + 10
    assert agent.counts["gpus"] == 11 * 9 and agent.on_change.dropped["gpu"] == 70
    assert "device samples published (on change) since start 18/88" in caplog.text
    every = _ListPublisher()
    Agent([_Gpus()], every, interval_s=0.0, on_change=False).run(threading.Event(), cycles=11)
    assert len(every.events) == 11 * 9


def test_collect_telemetry_on_change_flags():
    import argparse

    from failslow.collectors.samplers import OnChangeConfig
    from failslow.commands.collect import add_arguments, on_change_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = on_change_config(parser.parse_args([]))
    assert isinstance(default, OnChangeConfig) and default.heartbeat_s == 10.0
    slow = on_change_config(parser.parse_args(["--telemetry-heartbeat", "30"]))
    assert isinstance(slow, OnChangeConfig) and slow.heartbeat_s == 30.0
    assert on_change_config(parser.parse_args(["--no-telemetry-on-change"])) is False
    proc = _cli("collect", "--samplers", "host", "--telemetry-heartbeat", "0",
                "--bootstrap", "127.0.0.1:1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--telemetry-heartbeat" in out.strip().splitlines()[-1]
