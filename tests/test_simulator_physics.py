"""Step-time physics of the simulator: collectives gated by the slowest member, critical path,
link faults that slow only transfers, benign pauses that hit everyone together."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from failslow.simulator import FaultSpec, JobSpec, Scenario, simulate

DP16 = (JobSpec(),)
PP = (JobSpec(hosts=4, tp=2, pp=4, micro_batches=4),)  # 32 ranks: tp2 pp4 dp4


def _events(sc: Scenario, seed: int = 0, steps: int | None = None) -> list[dict]:
    # Per-op events: the physics is checked op by op (tests/test_simulator_comm.py checks
    # that the comm windows sum exactly these ops).
    return list(simulate(sc, seed=seed, steps=steps, grain="collective").events())


def _steps(events, lo, hi):
    return [e for e in events if e["kind"] == "step" and lo <= e["step"] < hi]


@pytest.fixture(scope="module")
def thermal():
    sc = Scenario("t", "rank 5 at 2x from 20 s", DP16, steps=45,
                  faults=(FaultSpec("gpu_thermal", 20, None, 1.0, rank=5),))
    return _events(sc)


def test_slow_member_gates_its_collective(thermal):
    late = [e for e in thermal if e["kind"] == "collective" and e["step"] >= 30
            and e["seq"] % 4 == 0]  # the first bucket of each step: arrival order matters
    by_seq = defaultdict(list)
    for e in late:
        by_seq[(e["group"], e["seq"])].append(e)
    assert by_seq
    for members in by_seq.values():
        assert len(members) == members[0]["group_size"] == 16
        last = max(members, key=lambda e: e["start_ts"])
        assert last["rank"] == 5
        shortest = min(members, key=lambda e: e["duration_s"])
        assert shortest["rank"] == 5
        others = [e["duration_s"] for e in members if e["rank"] != 5]
        assert min(others) > 3 * last["duration_s"]
        ends = [e["ts"] for e in members]
        assert max(ends) - min(ends) < 0.01  # everybody leaves together


def test_slow_rank_computes_long_and_waits_short(thermal):
    st = _steps(thermal, 30, 45)
    slow = [e for e in st if e["rank"] == 5]
    fast = [e for e in st if e["rank"] != 5]
    assert np.median([e["compute_s"] for e in slow]) > 1.8 * np.median(
        [e["compute_s"] for e in fast])
    assert np.median([e["comm_s"] for e in slow]) < 0.5 * np.median(
        [e["comm_s"] for e in fast])


def test_step_time_follows_the_critical_path(thermal):
    before = _steps(thermal, 8, 18)
    after = _steps(thermal, 30, 45)
    for e in before + after:  # no checkpoint here: the parts add up to the step
        parts = e["compute_s"] + e["comm_s"] + e["data_s"]
        assert abs(e["duration_s"] - parts) < 1e-5
    per_step = defaultdict(list)
    for e in after:
        per_step[e["step"]].append(e["duration_s"])
    for durations in per_step.values():  # everyone is held to the slow rank's pace
        assert max(durations) / min(durations) < 1.02
    slow_down = (np.median([e["duration_s"] for e in after])
                 / np.median([e["duration_s"] for e in before]))
    assert slow_down == pytest.approx(1.8, abs=0.3)


def test_send_recv_pairs_match():
    events = _events(Scenario("p", "pp", PP, steps=6))
    p2p = [e for e in events if e["kind"] == "collective" and e["op"] in ("send", "recv")]
    assert p2p
    pairs = defaultdict(list)
    for e in p2p:
        assert e["group_size"] == 2
        a, b = sorted((e["rank"], e["peer"]))
        assert e["group"] == f"pp{a}-{b}"
        pairs[(e["group"], e["seq"])].append(e)
    for members in pairs.values():
        assert sorted(m["op"] for m in members) == ["recv", "send"]
        send, recv = sorted(members, key=lambda m: m["op"] != "send")
        assert send["peer"] == recv["rank"] and recv["peer"] == send["rank"]
        assert abs(send["ts"] - recv["ts"]) < 0.01  # ends on both sides at once (+ clock skew)


def test_link_fault_slows_only_its_transfers():
    fault = FaultSpec("slow_link", 10, None, 2.0, rank=9, peer_rank=17)  # stage 1 <-> 2
    events = _events(Scenario("l", "link", PP, steps=30, faults=(fault,)))
    pair = "pp9-17"
    dur = defaultdict(list)
    for e in events:
        if e["kind"] == "collective" and e["op"] == "send" and e["step"] >= 15:
            dur[e["group"] == pair].append(e["duration_s"])
    assert np.median(dur[True]) > 2.5 * np.median(dur[False])
    st = _steps(events, 15, 30)
    ends = [e["compute_s"] for e in st if e["rank"] in (9, 17)]
    rest = [e["compute_s"] for e in st if e["rank"] not in (9, 17)]
    assert abs(np.median(ends) / np.median(rest) - 1.0) < 0.05  # both ends compute normally


def test_pipeline_stage_slowdown_propagates_downstream():
    healthy = _events(Scenario("h", "pp", PP, steps=30))
    slow = _events(Scenario("s", "pp", PP, steps=30,
                            faults=(FaultSpec("gpu_clock", 0, None, 1.0, rank=8),)))  # stage 1

    def fwd_recv_wait(events, stage):
        # Forward recv on stage s waits for stage s-1 (its peer has the lower rank); rank 8
        # is in replica d=0, whose ranks on stage s are 8s and 8s+1.
        return np.median([e["duration_s"] for e in events if e["kind"] == "collective"
                          and e["op"] == "recv" and e["peer"] < e["rank"] and e["step"] >= 10
                          and e["rank"] in (8 * stage, 8 * stage + 1)])

    for stage in (2, 3):
        assert fwd_recv_wait(slow, stage) > 3 * fwd_recv_wait(healthy, stage)


def test_checkpoint_pauses_everyone_together():
    sc = Scenario("c", "ckpt", DP16, steps=40, faults=(FaultSpec("checkpoint", 20, 28),))
    trace = simulate(sc, seed=3)
    events = list(trace.events())
    (ck,) = [b for b in trace.truth["benign"] if b["kind"] == "checkpoint"]
    steps = [e for e in events if e["kind"] == "step"]
    hit = [e for e in steps if e["ts"] - e["duration_s"] < ck["start_ts"] < e["ts"]]
    assert len(hit) == 16  # one step of every rank contains the pause
    for e in hit:
        assert e["duration_s"] > 7.0
        assert e["compute_s"] + e["comm_s"] + e["data_s"] < 2.0  # time not spent working
    assert len({e["step"] for e in hit}) == 1


def test_warmup_steps_are_slow_for_everyone():
    st = _events(Scenario("w", "warm", DP16, steps=12))
    first = [e["duration_s"] for e in st if e["kind"] == "step" and e["step"] == 0]
    later = [e["duration_s"] for e in st if e["kind"] == "step" and e["step"] == 10]
    assert min(first) > 3 * max(later)
