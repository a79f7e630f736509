"""The simulator's public surface: scenarios, determinism, truth, files, schedules, the CLI."""

from __future__ import annotations

import dataclasses
import uuid

import orjson
import pytest
from confluent_kafka import Consumer

from failslow import schema
from failslow.cli import main
from failslow.schema.batches import expand, is_batch
from failslow.simulator import (
    GRAINS,
    SCENARIOS,
    FaultSpec,
    SimulatorError,
    load_schedule,
    parse_schedule,
    simulate,
)
from failslow.simulator.spec import FAULT_KINDS

SMALL = [name for name, sc in SCENARIOS.items() if not sc.large]


def test_scenario_library_covers_the_issue():
    assert len(SCENARIOS) >= 20
    kinds = {f.kind for sc in SCENARIOS.values() for f in sc.faults}
    assert set(FAULT_KINDS) <= kinds
    assert {"checkpoint", "eval", "long_seq", "gc_spike", "restart", "job_end"} <= kinds
    sizes = {sum(j.hosts for j in sc.jobs) * sc.gpus_per_host for sc in SCENARIOS.values()}
    assert min(sizes) == 16 and max(sizes) == 4096
    assert any(not sc.faults or all(not f.is_fault for f in sc.faults)
               for sc in SCENARIOS.values())
    assert any(sum(f.is_fault for f in sc.faults) >= 2 for sc in SCENARIOS.values())
    for sc in SCENARIOS.values():
        sc.check()
        assert sc.description


@pytest.mark.parametrize("grain", GRAINS)
@pytest.mark.parametrize("name", SMALL)
def test_every_small_scenario_emits_valid_events(name, grain):
    trace = simulate(SCENARIOS[name], seed=1, steps=8, grain=grain)
    kinds = set()
    for e in trace.events():
        schema.validate(e)
        kinds.add(e["kind"])
    assert {"step", grain, "gpu", "nic", "host"} <= kinds
    assert {"comm", "collective"} - {grain} - kinds
    truth = orjson.loads(orjson.dumps(trace.truth))
    assert truth["scenario"] == name and truth["seed"] == 1
    assert truth["end_ts"] > truth["start_ts"]


def test_deterministic_per_seed():
    sc = SCENARIOS["two_faults"]
    a = list(simulate(sc, seed=7, steps=12).events())
    b = list(simulate(sc, seed=7, steps=12).events())
    c = list(simulate(sc, seed=8, steps=12).events())
    assert a == b
    assert a != c
    trace = simulate(sc, seed=7, steps=12)
    truth_first = trace.truth  # physics-only pass
    assert list(trace.events()) == a and trace.truth == truth_first


def test_truth_format():
    trace = simulate(SCENARIOS["gpu_thermal_30"], seed=0)
    t = trace.truth
    assert t["job_ids"] == ["job0"] and t["world_size"] == 16
    assert 0.9 < t["step_s"] < 1.2
    (f,) = t["faults"]
    assert (f["kind"], f["fault"], f["root_cause"]) == ("gpu_thermal", "slow_rank", "gpu_thermal")
    assert (f["rank"], f["host"], f["gpu"], f["peer_rank"]) == (5, "h0", 5, None)
    assert f["onset_ts"] == t["start_ts"] + 30 and f["end_ts"] == t["start_ts"] + 90
    assert 20 <= f["onset_step"] <= 30
    assert 15 < f["expected_job_slowdown_pct"] < 32
    link = simulate(SCENARIOS["slow_link_pair_3x"], seed=0, steps=5).truth["faults"][0]
    assert (link["fault"], link["rank"], link["peer_rank"]) == ("slow_link", 9, 25)
    assert link["host"] != link["peer_host"]
    nic = simulate(SCENARIOS["slow_link_host_50"], seed=0, steps=5).truth["faults"][0]
    assert (nic["rank"], nic["host"], nic["root_cause"]) == (None, "h1", "nic_congestion")
    host = simulate(SCENARIOS["cpu_contention_30"], seed=0, steps=5).truth["faults"][0]
    assert (host["fault"], host["rank"], host["host"]) == ("slow_host", None, "h3")


def test_benign_truth_lists_pauses_and_restart():
    t = simulate(SCENARIOS["restart_16"], seed=0).truth
    kinds = [b["kind"] for b in t["benign"]]
    assert kinds == ["warmup", "checkpoint", "restart"]
    assert t["faults"] == []
    restart = t["benign"][2]
    assert restart["end_ts"] - restart["start_ts"] > 15


def test_restart_rewinds_steps():
    trace = simulate(SCENARIOS["restart_16"], seed=0)
    steps = [e["step"] for e in trace.events() if e["kind"] == "step" and e["rank"] == 0]
    back = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
    assert len(back) == 1
    ck = [b for b in trace.truth["benign"] if b["kind"] == "restart"][0]
    assert steps[back[0]] == ck["resumed_at_step"]


def test_write_jsonl_matches_events(tmp_path):
    trace = simulate(SCENARIOS["gc_spikes_16"], seed=4, steps=10)
    path = tmp_path / "t.jsonl"
    n = trace.write_jsonl(path)
    lines = path.read_bytes().splitlines()
    assert len(lines) == n
    assert [orjson.loads(x) for x in lines] == list(trace.events())
    truth = orjson.loads((tmp_path / "t.jsonl.truth.json").read_bytes())
    assert truth == orjson.loads(orjson.dumps(trace.truth))


EVERY_KIND = """
gpu_thermal     3   -   rank=5            60%
gpu_power       3   -   rank=12           1.2
gpu_clock       4   -   rank=20           0.2
pcie_degraded   4   -   rank=30           1.5
gpu_errors      3   -   rank=40           1.5
slow_link       5   -   rank=3,peer=19    2x
nic_errors      5   -   host=h6           0.8
cpu_contention  6   -   host=h7           0.3
input_stall     6   12  rank=50           50%
gc_spike        8   -   rank=9            0.8
checkpoint      10  14  -                 -
eval            15  18  -                 0.5
long_seq        18  20  -                 0.3
restart         20  24  rank=4            -
"""


@pytest.mark.parametrize("grain", GRAINS)
@pytest.mark.parametrize("vectorized", [False, True])
@pytest.mark.parametrize("name", ["healthy_hybrid_64", "two_jobs_one_ends"])
def test_write_jsonl_equals_events_with_every_kind(tmp_path, monkeypatch, name, vectorized,
                                                   grain):
    """The file path formats numbers itself (no dicts, no orjson); parsed back, every
    line equals the event dict, key order and int/float types included."""
    if vectorized:  # format even the smallest tables and chunks in numpy
        monkeypatch.setattr("failslow.simulator.jsonl.SMALL_TABLE", 0)
        monkeypatch.setattr("failslow.simulator.jsonl.SMALL_CHUNK", 0)
    faults = parse_schedule(EVERY_KIND) if name == "healthy_hybrid_64" else ()
    trace = simulate(SCENARIOS[name], seed=5, steps=30, extra_faults=faults, grain=grain)
    path = tmp_path / "t.jsonl"
    n = trace.write_jsonl(path)
    got = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    expected = list(trace.events())
    assert n == len(got) == len(expected)
    assert got == expected
    assert all(list(a) == list(b) for a, b in zip(got, expected, strict=True))
    assert all(type(a[k]) is type(b[k]) for a, b in zip(got, expected, strict=True) for k in a)
    for e in got:
        schema.validate(e)
    assert {e["kind"] for e in got} == {"step", grain, "gpu", "nic", "host"}
    if faults:
        kinds = {f["kind"] for f in trace.truth["faults"]} | {
            b["kind"] for b in trace.truth["benign"]}
        assert set(FAULT_KINDS) | {"checkpoint", "gc_spike", "restart"} <= kinds
        assert any(e["kind"] == "gpu" and e["xid"] for e in got)
        assert any(e["kind"] == "nic" and e["state"] == "down" for e in got)
    else:
        assert any(e["kind"] == "gpu" and e["job_id"] is None for e in got)


def test_events_roughly_in_ts_order():
    ts = [e["ts"] for e in simulate(SCENARIOS["two_jobs_one_ends"], seed=0, steps=30).events()]
    worst = max(max(ts[: i + 1]) - t for i, t in enumerate(ts))
    assert worst < 3.0  # about one step of lag at most


def test_realtime_paces_events():
    import time

    trace = simulate(SCENARIOS["healthy_16"], seed=0, steps=3)
    t0 = time.monotonic()
    events = list(trace.events(realtime=True, speed=50.0))
    span = (events[-1]["ts"] - events[0]["ts"]) / 50.0
    assert time.monotonic() - t0 >= 0.8 * span > 0


def test_schedule_format(tmp_path):
    text = """
    # kind          start  end   targets          intensity
    gpu_thermal     30s    90s   rank=5           30%
    slow_link       1m     +45s  rank=3,peer=11   3x
    slow_link       10     -     host=h1,nic=mlx5_2  0.5
    cpu_contention  20     2m    host=h1          0.25  # trailing comment
    checkpoint      60     75    -                -
    """
    specs = parse_schedule(text)
    assert specs[0] == FaultSpec("gpu_thermal", 30.0, 90.0, 0.3, rank=5)
    assert specs[1] == FaultSpec("slow_link", 60.0, 105.0, 2.0, rank=3, peer_rank=11)
    assert specs[2] == FaultSpec("slow_link", 10.0, None, 0.5, host="h1", nic=2)
    assert specs[3].end_s == 120.0 and specs[4].kind == "checkpoint"
    path = tmp_path / "s.txt"
    path.write_text(text)
    assert load_schedule(path) == specs
    trace = simulate(SCENARIOS["healthy_16"], seed=0, steps=5, extra_faults=specs)
    assert len(trace.truth["faults"]) == 4


@pytest.mark.parametrize("line, message", [
    ("gpu_melt 1 2 rank=1 0.5", "unknown fault kind"),
    ("gpu_thermal 1 2 rank=1", "expected 5 fields"),
    ("gpu_thermal soon 2 rank=1 0.5", "not a time"),
    ("gpu_thermal 5 2 rank=1 0.5", "start < end"),
    ("gpu_thermal 1 2 host=h1 0.5", "needs a target rank"),
    ("gpu_thermal 1 2 rank=x 0.5", "needs an integer"),
    ("slow_link 1 2 rank=1 0.5", "rank pair"),
    ("gpu_thermal 1 2 rank=1 lots", "not a number"),
    ("gpu_thermal 1 2 colour=red 0.5", "unknown target key"),
])
def test_bad_schedule_lines(line, message):
    with pytest.raises(SimulatorError, match=message) as err:
        parse_schedule(f"# header\n{line}\n", source="f.txt")
    assert str(err.value).startswith("f.txt:2: ") and "\n" not in str(err.value)


def test_bad_targets_are_rejected():
    with pytest.raises(SimulatorError, match="outside job0"):
        simulate(SCENARIOS["healthy_16"], extra_faults=(FaultSpec("gpu_clock", 1, 2, 0.5,
                                                                  rank=99),))
    with pytest.raises(SimulatorError, match="no host"):
        simulate(SCENARIOS["healthy_16"], extra_faults=(FaultSpec("cpu_contention", 1, 2, 0.5,
                                                                  host="h9"),))
    with pytest.raises(SimulatorError, match="not divisible"):
        dataclasses.replace(SCENARIOS["healthy_16"],
                            jobs=(dataclasses.replace(SCENARIOS["healthy_16"].jobs[0], tp=3),)
                            ).check()


def test_cli_list_and_errors(capsys, tmp_path):
    assert main(["simulate", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SCENARIOS)
    assert lines[0].split()[0] in SCENARIOS and len(lines[0].split()) > 1
    assert main(["simulate", "no_such", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("failslow simulate: unknown scenario 'no_such'") and "\n" not in err
    bad = tmp_path / "bad.txt"
    bad.write_text("gpu_thermal 1 2 rank=1\n")
    assert main(["simulate", "healthy_16", "--schedule", str(bad), "--out",
                 str(tmp_path / "x")]) == 2
    assert "bad.txt:1: expected 5 fields" in capsys.readouterr().err


def test_cli_writes_trace_and_truth(tmp_path):
    sched = tmp_path / "s.txt"
    sched.write_text("input_stall 5 - rank=3 50%\n")
    out = tmp_path / "trace.jsonl"
    assert main(["simulate", "healthy_16", "--out", str(out), "--steps", "12", "--seed", "3",
                 "--schedule", str(sched)]) == 0
    events = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    # what the host agents publish: a host's comm windows, steps, GPU and NIC samples batched
    assert {e["kind"] for e in events} == {"step_batch", "comm_batch", "gpu_batch",
                                           "nic_batch", "host"}
    rows = tmp_path / "rows.jsonl"
    assert main(["simulate", "healthy_16", "--out", str(rows), "--steps", "12", "--seed", "3",
                 "--schedule", str(sched), "--per-rank"]) == 0
    per_rank = [orjson.loads(x) for x in rows.read_bytes().splitlines()]
    assert {e["kind"] for e in per_rank} == {"step", "comm", "gpu", "nic", "host"}
    expanded = [r for e in events for r in (expand(e) if is_batch(e) else [e])]
    assert sorted(map(orjson.dumps, expanded)) == sorted(map(orjson.dumps, per_rank))
    truth = orjson.loads((tmp_path / "trace.jsonl.truth.json").read_bytes())
    assert truth["seed"] == 3 and truth["faults"][0]["kind"] == "input_stall"
    raw = tmp_path / "raw.jsonl"
    assert main(["simulate", "healthy_16", "--out", str(raw), "--steps", "12", "--seed", "3",
                 "--schedule", str(sched), "--grain", "collective"]) == 0
    events = [orjson.loads(x) for x in raw.read_bytes().splitlines()]
    assert {e["kind"] for e in events} == {"step_batch", "collective", "gpu_batch",
                                           "nic_batch", "host"}
    assert (tmp_path / "raw.jsonl.truth.json").read_bytes() == (
        tmp_path / "trace.jsonl.truth.json").read_bytes()


def test_cli_kafka_publishes_through_the_publisher(broker, topics):
    assert main(["simulate", "healthy_16", "--kafka", "--steps", "4", "--bootstrap",
                 broker.bootstrap, "--topic-prefix", topics.prefix]) == 0
    expected = list(simulate(SCENARIOS["healthy_16"], seed=0, steps=4).events())
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 3000,
                         "fetch.wait.max.ms": 100})
    consumer.subscribe(topics.inputs())
    got: list[dict] = []
    try:
        import time

        deadline = time.monotonic() + 60
        while len(got) < len(expected) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            batch = schema.decode(msg.value())
            assert msg.key().decode() == schema.topics.key_for(batch[0])
            got.extend(batch)
    finally:
        consumer.close()
    key = lambda e: (e["kind"], e["ts"], e.get("rank"), e.get("gpu"), e.get("nic"),  # noqa: E731
                     e.get("group"))
    assert sorted(got, key=key) == sorted(expected, key=key)
