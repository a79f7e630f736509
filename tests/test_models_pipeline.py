"""End-to-end behaviour of models.pipeline.Detector on small synthetic jobs.

The generator below builds CONTRACT events of a synchronous data-parallel job
(optionally two pipeline stages): every rank computes, then all meet in an
all-reduce that ends when the last one arrives, so step times equalize and
only own work and arrival times carry the signal.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from failslow import schema
from failslow.models.pipeline import Detector


def synth(world=16, steps=60, slow=None, onset=20, intensity=0.3, seed=0, per_host=8,
          compute=True, collectives=True, stages=1, job_factor=None, job_from=None,
          telemetry=False, until=None):
    """Events of one job, in ts order per step. ``slow``: the rank whose compute
    grows by ``intensity`` from step ``onset`` (until step ``until``); ``job_factor``
    from ``job_from`` slows every rank alike."""
    rng = np.random.default_rng(seed)
    dp = world // stages
    t = 1.7e9
    out = []
    seqs: dict[str, int] = {}
    for s in range(steps):
        c = 0.4 * rng.lognormal(0, 0.015, world)
        if slow is not None and s >= onset and (until is None or s < until):
            c[slow] *= 1 + intensity
        if job_factor and s >= job_from:
            c *= job_factor
        data = 0.01 * rng.lognormal(0, 0.2, world)
        ready = t + data + c                      # end of own work
        evs = []
        coll = np.zeros(world)
        if stages == 2:
            for d in range(dp):                   # stage 0 rank d -> stage 1 rank dp + d
                a, b = d, dp + d
                end = ready[a] + 0.01
                g = f"pp{a}-{b}"
                seq = seqs.get(g, 0)
                seqs[g] = seq + 1
                for r, op, start, peer in ((a, "send", ready[a], b), (b, "recv", t, a)):
                    evs.append({"v": 1, "kind": "collective", "ts": float(end), "job_id": "j",
                                "rank": r, "host": f"h{r // per_host}", "group": g,
                                "group_size": 2, "op": op, "seq": seq, "start_ts": float(start),
                                "duration_s": float(end - start), "bytes": 1 << 20, "step": s,
                                "peer": peer})
                    coll[r] += end - start
                ready[a] = end
                ready[b] = end + c[b] + data[b]
        for k in range(stages):
            members = list(range(k * dp, (k + 1) * dp))
            g = f"dp{k}"
            end = max(ready[m] for m in members) + 0.05
            seq = seqs.get(g, 0)
            seqs[g] = seq + 1
            for m in members:
                evs.append({"v": 1, "kind": "collective", "ts": float(end), "job_id": "j",
                            "rank": m, "host": f"h{m // per_host}", "group": g,
                            "group_size": dp, "op": "allreduce", "seq": seq,
                            "start_ts": float(ready[m]), "duration_s": float(end - ready[m]),
                            "bytes": 1 << 26, "step": s})
                coll[m] += end - ready[m]
                ready[m] = end
        t_end = float(max(ready))
        for r in range(world):
            ev = {"v": 1, "kind": "step", "ts": t_end, "job_id": "j", "rank": r,
                  "world_size": world, "host": f"h{r // per_host}", "gpu": r % per_host,
                  "step": s, "duration_s": t_end - t, "pp_rank": r // dp}
            if compute:
                ev.update(compute_s=float(c[r]), data_s=float(data[r]), comm_s=float(coll[r]))
            evs.append(ev)
        if telemetry:
            for r in range(world):
                hot = slow == r and s >= onset
                evs.append({"v": 1, "kind": "gpu", "ts": t_end, "host": f"h{r // per_host}",
                            "gpu": r % per_host, "uuid": f"GPU-{r}",
                            "sm_clock_mhz": 1500.0 if hot else 1980.0, "temp_c": 88.0 if hot
                            else 60.0 + rng.normal(0, 1), "clocks_event_reasons": 0x20 if hot
                            else 0, "pcie_gen": 5, "pcie_width": 16, "pcie_max_gen": 5,
                            "pcie_max_width": 16})
        out.extend(evs if collectives else [e for e in evs if e["kind"] != "collective"])
        t = t_end
    return out


def run(events, det=None):
    det = det or Detector()
    incs = det.process_batch(events) + det.flush()
    for inc in incs:
        schema.validate(inc)
    return incs


def opened(incs):
    return [i for i in incs if i["status"] == "open"
            and i["incident_id"] not in {j["incident_id"] for j in incs[:incs.index(i)]}]


@pytest.mark.parametrize("compute", [True, False])
def test_slow_rank_found_with_or_without_compute_fields(compute):
    incs = run(synth(slow=5, compute=compute))
    first = opened(incs)
    assert [(i["fault"], i["rank"], i["host"]) for i in first] == [("slow_rank", 5, "h0")]
    # It opens as info, or already paging when its evidence spans two steps clearly
    # outside the noise (IncidentTracker.steady), and pages.
    assert first[0]["severity"] in ("info", "warning", "critical")
    assert incs[-1]["severity"] in ("warning", "critical")
    assert first[0]["onset_ts"] <= first[0]["detected_ts"]


def test_healthy_job_has_no_incident_across_seeds():
    for seed in range(6):
        assert run(synth(seed=seed)) == [], seed


def test_rank_slow_from_the_first_step_is_found_by_peers():
    first = opened(run(synth(slow=11, onset=0)))
    assert [(i["fault"], i["rank"]) for i in first] == [("slow_rank", 11)]


def test_pipeline_lateness_blames_the_rank_whose_work_grew():
    # Rank 3 (stage 0) slows; its stage-1 partner 11 arrives late at its own
    # all-reduce although its own work is normal: only rank 3 is the culprit.
    first = opened(run(synth(slow=3, stages=2, compute=False)))
    assert [(i["fault"], i["rank"]) for i in first] == [("slow_rank", 3)]


def test_single_step_spike_is_not_an_incident_and_two_steps_do_not_page():
    evs = synth()
    for e in evs:
        if e["kind"] == "step" and e["step"] == 30 and e["rank"] == 2:
            e["compute_s"] *= 2.0
    assert run(evs) == []
    for e in evs:
        if e["kind"] == "step" and e["step"] == 31 and e["rank"] == 2:
            e["compute_s"] *= 2.0
    assert {i["severity"] for i in run(evs)} <= {"info"}


def test_whole_job_slower_is_info_only():
    incs = run(synth(job_factor=1.4, job_from=30, steps=50))
    assert incs, "a 40% job-wide change should be reported"
    assert {i["fault"] for i in incs} == {"job_slowdown"}
    assert {i["severity"] for i in incs} == {"info"}
    assert {i["mitigation"] for i in incs} == {"ignore"}


def test_whole_host_slower_is_slow_host():
    evs = synth(steps=50)
    for e in evs:
        if e["kind"] == "step" and e["host"] == "h1" and e["step"] >= 20:
            e["compute_s"] *= 1.3
    first = opened(run(evs))
    assert [(i["fault"], i.get("host"), i.get("rank")) for i in first] == [("slow_host", "h1",
                                                                            None)]


def test_incident_resolves_once_the_rank_recovers_and_ids_are_stable():
    # rank 7 recovers from step 45: its own work and its arrival at the collectives
    # (its group no longer waits for it: models.evidence.WaitedFor)
    evs = synth(slow=7, steps=80, until=45)
    incs = run(evs)
    ids = {i["incident_id"] for i in incs}
    assert ids == {"j:slow_rank:r7:20"}
    assert [i["status"] for i in incs].count("resolved") == 1
    assert incs[-1]["status"] == "resolved" and incs[-1]["resolved_ts"] >= incs[0]["ts"]


def test_root_cause_from_telemetry_and_evidence_attached():
    incs = run(synth(slow=9, telemetry=True))
    last = incs[-1]
    assert last["root_cause"] == "gpu_thermal" and last["gpu"] == 1
    assert "gpu_thermal" in last["evidence"]["root_cause"]
    assert last["evidence"]["rel_to_peers"] > 0.2


def test_process_and_process_batch_agree_and_input_is_not_mutated():
    evs = synth(slow=5)
    before = copy.deepcopy(evs)
    a = Detector()
    one = [i for e in evs for i in a.process(e)] + a.flush()
    assert one == run(evs)
    assert evs == before


def test_state_dict_round_trip_resumes_identically():
    evs = synth(slow=5, steps=60)
    ref = run(evs)
    det = Detector()
    head = det.process_batch(evs[: len(evs) // 3])
    det2 = Detector.from_state(det.state_dict())
    assert head + det2.process_batch(evs[len(evs) // 3:]) + det2.flush() == ref


def test_malformed_event_is_counted_not_raised():
    det = Detector()
    assert det.process({"v": 1, "kind": "step", "ts": 1.0}) == []
    assert det.rejected == 1


def test_transfers_that_take_no_measurable_time_are_no_evidence():
    """Eager sends complete before their receive is posted: min end - max start <= 0.
    When most cross-host groups of a step moved their data that way, the link
    evaluation must neither divide by a zero reference (it raised
    ZeroDivisionError and stopped a stream worker) nor flag the others."""
    from failslow.models.job import JobConfig
    from failslow.models.links import LinkMonitor

    mon = LinkMonitor(JobConfig())
    rank_host = {r: f"h{r // 2}" for r in range(16)}

    def coll(g: int, start: float, transfer_s: float) -> list:
        a, b = 2 * g, (2 * g + 3) % 16      # ranks on different hosts
        end = start + transfer_s
        return [0, f"pp{g}", "send", 1 << 20, (a, start, end - start), (b, start, end - start)]

    def step(s: int, zero: set[int]) -> list:
        t = 100.0 + s
        out = []
        for g in range(8):
            c = coll(g, t, 0.01)
            if g in zero:          # the receive started after the send had ended
                c[4], c[5] = (c[4][0], t, 0.001), (c[5][0], t + 0.005, 0.001)
            c[0] = s
            out.append(c)
        return out

    for s in range(15):
        assert mon.evaluate(s, step(s, set()), rank_host, 100.0 + s, 1.0) == []
    # Five of eight groups at zero cost: the faster-half reference was 0.
    assert mon.evaluate(15, step(15, {0, 1, 2, 3, 4}), rank_host, 115.0, 1.0) == []
    assert mon.evaluate(16, step(16, {0, 1, 2}), rank_host, 116.0, 1.0) == []


def test_a_detector_defect_skips_the_event_and_the_stream_goes_on(monkeypatch):
    """An unexpected error inside the Detector (a defect some input brings out) is
    counted and logged, and the batch goes on: a stream worker that raised would
    stop at the same event after every restart."""
    from failslow.models.job import JobState

    evs = synth(slow=3, onset=20)
    real = JobState.evaluate
    calls = {"n": 0}

    def flaky(self, s):
        calls["n"] += 1
        if calls["n"] == 5:
            raise ZeroDivisionError("float division by zero")
        return real(self, s)

    monkeypatch.setattr(JobState, "evaluate", flaky)
    det = Detector()
    incs = det.process_batch(evs) + det.flush()
    assert det.errors == 1
    assert det.last_error == "ZeroDivisionError: float division by zero"
    assert det.rejected == 0
    assert {(i["fault"], i["rank"]) for i in incs if i["severity"] != "info"} == {("slow_rank", 3)}
    again = Detector.from_state(det.state_dict())
    assert again.errors == 1


def test_a_rank_that_stops_reporting_does_not_stall_the_job():
    """A rank whose hook stopped sending (its steps and collectives) from step 15 on: once
    the others are a few steps further, its steps are judged without it, and the culprit
    is still found. A rank that keeps reporting, only late, is waited for instead
    (tests/test_models_generalize.py, host clocks steps apart)."""
    evs = [e for e in synth(slow=3, onset=25)
           if not (e.get("rank") == 11 and e.get("step", 0) >= 15)]
    det = Detector()
    incs = det.process_batch(evs)
    opened = [i for i in incs if i["status"] == "open"]
    assert {(i["fault"], i["rank"]) for i in opened} == {("slow_rank", 3)}
    job = det.jobs["j"]
    assert job.evaluated >= 55 and len(job.pending) <= job.cfg.lag_steps


@pytest.mark.parametrize("host,skew_s", [("h1", 0.1), ("h0", -0.1), ("h1", 1.0)])
def test_slow_link_found_when_a_host_clock_is_off(host, skew_s):
    """Transfers are timed across hosts (min end - max start), so 100 ms of clock skew is
    longer than the transfers themselves: the hosts' offsets are learned from the
    all-reduces (their members leave together) and transfers are timed on one clock."""
    from failslow.simulator import SCENARIOS, simulate

    events = []
    for e in simulate(SCENARIOS["slow_link_host_50"], seed=0).events():
        if e["host"] == host:
            e = dict(e, ts=e["ts"] - skew_s)
            if "start_ts" in e:
                e["start_ts"] -= skew_s
        events.append(e)
    events.sort(key=lambda e: e["ts"])
    incs = Detector().process_batch(events)
    paged = {(i["fault"], i.get("host")) for i in incs if i["severity"] != "info"}
    assert paged == {("slow_link", "h1")}
