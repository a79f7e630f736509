"""A slow point-to-point link between pipeline stages is named as a rank pair (both ranks,
both hosts), at both grains and whatever the p2p communicator is called, from send/recv
timing (``models.p2p``) and the NIC counters of both ends; a slow stage or a stage heavier
by design is never called a link."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import orjson
import pytest

from failslow.models.cusum import capped_increment
from failslow.models.job import JobConfig
from failslow.models.p2p import P2PMonitor
from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, FaultSpec, JobSpec, Scenario, simulate
from failslow.simulator.p2p import megatron_groups

# p2p_link_pp, cut short: the link rank 22 (h2) <-> 38 (h4) at 5x from ~step 19 of 40
SCENARIO = replace(SCENARIOS["p2p_link_pp"], steps=40)


def detect(batches) -> list[dict]:
    det = Detector()
    out = []
    for batch in batches:
        out.extend(det.process_batch(batch))
    out.extend(det.flush())
    return out


def link_incidents(incidents: list[dict]) -> list[dict]:
    return [i for i in incidents if i["fault"] == "slow_link"]


def assert_pair_named(incidents: list[dict], truth: dict) -> None:
    orjson.dumps(incidents)           # plain JSON: no numpy scalar leaks into an incident
    f = truth["faults"][0]
    named = [i for i in link_incidents(incidents)
             if {i.get("rank"), i.get("peer_rank")} == {f["rank"], f["peer_rank"]}]
    assert named, [(i["fault"], i.get("rank"), i.get("host")) for i in incidents]
    first, last = named[0], named[-1]
    assert {first["host"], first["peer_host"]} == {"h2", "h4"}
    assert first["detected_ts"] >= f["onset_ts"]
    assert last["root_cause"] == "nic_congestion"
    assert last["mitigation"] in ("ignore", "adjust_pipeline")
    assert last["gpu_hours_lost"] > 0
    assert any(i["severity"] != "info" for i in named)     # it pages
    # nothing else pages
    others = {i["incident_id"] for i in incidents if i["severity"] != "info"} \
        - {i["incident_id"] for i in named}
    assert not others


@pytest.mark.parametrize("grain", ["comm", "collective"])
def test_slow_pipeline_pair_is_named_with_both_hosts_and_its_cost(grain):
    trace = simulate(SCENARIO, seed=0, grain=grain)
    assert_pair_named(detect(trace.batches()), trace.truth)


@pytest.mark.parametrize("grain", ["comm", "collective"])
def test_pair_named_when_sends_run_on_the_pipeline_group(grain):
    # Megatron-style: send/recv on the pipeline-parallel group (4 members), the other
    # end known only by ``peer``; no group of two names the pair.
    trace = simulate(SCENARIO, seed=1, grain=grain)
    batches = list(megatron_groups(trace))
    sends = [e for b in batches for e in b if e.get("op") == "send"] + [
        op for b in batches for e in b if e["kind"] == "comm" for op in e["ops"]
        if op["op"] == "send"]
    assert sends and all(e["group_size"] == 4 and e["group"].startswith("pipe")
                         for e in sends)
    assert_pair_named(detect(batches), trace.truth)


def test_pair_slow_from_the_first_step_is_named_and_priced():
    sc = replace(SCENARIO, faults=(replace(SCENARIO.faults[0], start_s=0.0),), steps=24)
    trace = simulate(sc, seed=0)
    assert_pair_named(detect(trace.batches()), trace.truth)


def test_stage_slow_from_its_compute_is_no_link():
    sc = replace(SCENARIOS["pipeline_stage_slow"], steps=50)
    incidents = detect(simulate(sc, seed=0).batches())
    assert any(i["fault"] == "slow_rank" and i.get("rank") == 20 for i in incidents)
    assert not link_incidents(incidents)


@pytest.mark.parametrize("grain", ["comm", "collective"])
def test_last_stage_heavier_from_the_first_step_is_no_link(grain):
    # 32 ranks tp4 pp4 dp2, a stage per host: the last stage computes 30 % more from the
    # job's first step (every one of its ranks), the layout, not a link.
    job = JobSpec(hosts=4, tp=4, pp=4, micro_batches=8)
    last = range(24, 32)
    sc = Scenario("heavy_last_stage", "last stage heavier by design", (job,), steps=40,
                  faults=tuple(FaultSpec("gpu_clock", 0, None, 0.3, rank=r) for r in last))
    incidents = detect(simulate(sc, seed=0, grain=grain).batches())
    assert not link_incidents(incidents)


def test_decisions_are_the_same_one_event_at_a_time_and_after_a_restore():
    trace = simulate(SCENARIO, seed=0)
    events = list(trace.events())
    whole = detect([events])
    det = Detector()
    out = []
    half = len(events) // 2
    for ev in events[:half]:
        out.extend(det.process(copy.deepcopy(ev)))
    det = Detector.from_state(det.state_dict())      # a stream worker restarts mid-fault
    for ev in events[half:]:
        out.extend(det.process(ev))
    out.extend(det.flush())
    assert out == whole
    assert link_incidents(whole)


# -- the monitor alone ---------------------------------------------------------------------


def _collectives(step: int, costs: dict[tuple[int, int], float], rng,
                 peer: bool = True) -> list[dict]:
    """send/recv events of one step: each pair moves 4 ops of 1 MiB each way; the side
    that posts last takes the transfer time, the other also waits. Without ``peer``, as
    an NCCL Inspector tailer reports them: on a communicator of two, no peer field."""
    evs = []
    for (a, b), cost in costs.items():
        for _ in range(4):
            t = cost * (1 << 20) * rng.lognormal(0.0, 0.03)
            wait = rng.uniform(0.0, 0.01)
            for r, op, other, d in ((a, "send", b, t + wait), (b, "recv", a, t),
                                    (b, "send", a, t), (a, "recv", b, t + wait)):
                evs.append({"rank": r, "host": f"h{r // 8}", "op": op, "group": f"c{a}-{b}",
                            "group_size": 2, "duration_s": d, "bytes": 1 << 20, "step": step,
                            **({"peer": other} if peer else {})})
    return evs


def _run(costs_at, steps: int = 30, seed: int = 0, peer: bool = True) -> list[list]:
    rng = np.random.default_rng(seed)
    mon = P2PMonitor(JobConfig())
    found = []
    for s in range(steps):
        evs = _collectives(s, costs_at(s), rng, peer)
        for ev in evs:
            mon.add_collective(ev, s)
        hosts = {ev["rank"]: ev["host"] for ev in evs}
        found.append(mon.evaluate(s, hosts, 1.0 + s, 1.0, 64))
    return found


PAIRS = [(r, r + 8) for r in range(8)]       # h0 rank r <-> h1 rank r + 8


@pytest.mark.parametrize("peer", [True, False])
def test_monitor_confirms_a_pair_that_slows_and_only_it(peer):
    found = _run(lambda s: {p: 1e-9 * (2.0 if p == (3, 11) and s >= 15 else 1.0)
                            for p in PAIRS}, peer=peer)
    assert not any(f.confirmed for fs in found[:15] for f in fs)
    late = [f for fs in found[15:] for f in fs if f.confirmed]
    assert late and {f.key for f in late} == {"slow_link:r3-r11"}
    f = late[-1]
    assert (f.rank, f.peer_rank, f.host, f.peer_host) == (3, 11, "h0", "h1")
    assert f.onset_step == 15


def test_monitor_finds_a_pair_slow_from_the_first_step_from_the_other_pairs():
    found = _run(lambda s: {p: 1e-9 * (1.8 if p == (5, 13) else 1.0) for p in PAIRS})
    keys = {f.key for fs in found[:6] for f in fs if f.confirmed}
    assert keys == {"slow_link:r5-r13"}


def test_monitor_judges_the_slower_direction():
    # only the data moving from the higher rank to the lower one slows (congested one way)
    rng = np.random.default_rng(0)
    mon = P2PMonitor(JobConfig())
    keys = set()
    for s in range(30):
        evs = _collectives(s, {p: 1e-9 for p in PAIRS}, rng)
        for ev in evs:
            if s >= 15 and {ev["rank"], ev.get("peer")} == {2, 10} and (
                    (ev["op"] == "send") == (ev["rank"] == 10)):
                ev["duration_s"] *= 2.0
            mon.add_collective(ev, s)
        found = mon.evaluate(s, {ev["rank"]: ev["host"] for ev in evs}, 1.0 + s, 1.0, 64)
        keys |= {f.key for f in found if f.confirmed}
    assert keys == {"slow_link:r2-r10"}


def test_monitor_quiet_on_healthy_pairs_and_pairs_inside_a_host():
    for seed in range(4):
        healthy = _run(lambda s: {p: 1e-9 for p in PAIRS}, seed=seed)
        assert not any(f.confirmed for fs in healthy for f in fs)
    # a pair inside one host (NVLink) is never judged, however slow
    inside = _run(lambda s: {**{p: 1e-9 for p in PAIRS}, (1, 2): 1e-9 * (5.0 if s > 12 else 1)})
    assert not any(f.key.endswith("r1-r2") for fs in inside for f in fs)


def test_monitor_names_a_host_when_its_pairs_slow():
    # four stages on h0..h3; h3's NICs slow from step 15: its 8 pairs (to h2) slow, h2's
    # other 8 pairs (to h1) do not
    chain = [(r + 8 * k, r + 8 * (k + 1)) for k in range(3) for r in range(8)]
    found = _run(lambda s: {p: 1e-9 * (2.0 if s >= 15 and p[1] >= 24 else 1.0)
                            for p in chain})
    keys = {f.key for fs in found[15:] for f in fs if f.confirmed}
    assert keys == {"slow_link:h3"}


def test_capped_increment_is_the_rank_rule():
    from types import SimpleNamespace
    cfg = SimpleNamespace(z_min=4.0, confirm_z=8.0)
    inc = capped_increment(np.array([0.3, 0.04, 0.3]), np.array([50.0, 50.0, 3.0]), 0.05, cfg)
    assert inc.tolist() == [4.0, 0.0, 1.0]


def test_detect_cli_output_does_not_depend_on_the_hash_seed(tmp_path):
    import os
    import subprocess
    import sys

    trace = tmp_path / "p2p.jsonl"
    simulate(replace(SCENARIO, steps=30), seed=0).write_jsonl(trace)
    outs = []
    for seed in ("1", "7"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-m", "failslow.cli", "detect", str(trace)],
                             capture_output=True, env=env, timeout=300, check=True)
        outs.append(run.stdout)
    assert b'"peer_rank":38' in outs[0].replace(b" ", b"")
    assert outs[0] == outs[1]
