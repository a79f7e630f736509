"""Sub-step evidence (models/substep.py): inside a long step, the member a group waits for
window after window is confirmed in seconds; a short stall, a steady few-per-cent
imbalance and the step ends' gradient bursts never confirm."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.models.job import JobConfig, JobState
from failslow.simulator import SCENARIOS, simulate


def _feed(name: str, seed: int = 0, steps: int | None = None):
    """Every sub-step finding JobState returns for a scenario: (ts, step, rank, finding)."""
    trace = simulate(SCENARIOS[name], seed=seed, steps=steps)
    job = JobState("job0", JobConfig())
    out = []
    trace.starts = {}
    for ev in trace.events():
        if ev.get("job_id") != "job0":
            continue
        if ev["kind"] == "comm":
            for s, findings, ts in job.add_comm(ev):
                out.extend((ts, s, f.rank, f) for f in findings if f.evidence.get("substep"))
        elif ev["kind"] == "step":
            trace.starts[(ev["rank"], ev["step"])] = ev["ts"] - ev["duration_s"]
            job.add_step(ev)
    return trace, out


def _step_start(trace, rank: int, step: int) -> float:
    return trace.starts[(rank, step)]


def test_culprit_is_confirmed_inside_its_first_slow_step():
    trace, found = _feed("long8_power_25", steps=17)
    fault = trace.truth["faults"][0]
    assert found, "no sub-step finding"
    assert {r for _, _, r, _ in found} == {fault["rank"]}
    ts, s, _, f = found[0]
    start = _step_start(trace, fault["rank"], fault["onset_step"])
    assert s == fault["onset_step"]           # inside the step, not after it
    assert ts - start < 8.0
    assert f.confirmed and f.fault == "slow_rank" and f.key == f"slow_rank:r{fault['rank']}"
    assert 15.0 <= f.own_pct <= 40.0          # a 25 % slower GPU
    assert f.evidence["evidence"] == "change"


def test_far_outside_its_group_from_the_first_step():
    trace, found = _feed("first8_errors_30", steps=3)
    fault = trace.truth["faults"][0]
    assert found
    assert {r for _, _, r, _ in found} == {fault["rank"]}
    assert found[0][1] == 0                   # the job's very first step
    assert found[0][3].evidence["evidence"] == "far"


@pytest.mark.parametrize(("name", "steps"), [("long30_stalls", 9), ("long8_stalls", 24)])
def test_short_stalls_and_checkpoints_never_confirm(name, steps):
    trace, found = _feed(name, steps=steps)
    assert len([b for b in trace.truth["benign"] if b["kind"] in ("gc_spike", "checkpoint")
                and b["end_ts"] is not None]) >= 2
    assert found == []


def test_healthy_long_steps_confirm_nothing():
    _, found = _feed("long8_healthy", seed=1, steps=16)
    assert found == []


def _windows(slow: dict[int, float], ticks: int, seed: int, ops: int = 6, size: int = 4):
    """comm windows of one tensor-parallel group (ranks 0..size-1): ``ops`` all-reduces a
    second; member m computes (1 + slow[m]) times the others between two of them, with
    per-op noise; every op ends when its last member arrives."""
    rng = np.random.default_rng(seed)
    t = np.zeros(size)
    base = 1000.0
    evs = []
    for k in range(ticks):
        blocked = np.zeros(size)
        longest = np.zeros(size)
        shortest = np.full(size, np.inf)
        for _ in range(ops):
            work = 0.12 * np.array([1.0 + slow.get(m, 0.0) for m in range(size)]) \
                * rng.lognormal(0.0, 0.03, size)
            arrive = t + work
            end = arrive.max() + 0.02
            d = end - arrive
            blocked += d
            longest = np.maximum(longest, d)
            shortest = np.minimum(shortest, d)
            t = np.full(size, end)
        for m in range(size):
            evs.append({"v": 1, "kind": "comm", "ts": base + k + 1.0, "job_id": "j",
                        "rank": m, "host": "h0", "window_start_ts": base + k, "step": 1,
                        "step_end": False, "world_size": size,
                        "ops": [{"group": "tp0", "group_size": size, "op": "allreduce",
                                 "n": ops, "blocked_s": float(blocked[m]),
                                 "min_s": float(shortest[m]), "max_s": float(longest[m]),
                                 "bytes": 1000 * ops}]})
    return evs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steady_few_per_cent_from_the_first_op_is_not_a_fault(seed):
    job = JobState("j", JobConfig())
    hits = [j for ev in _windows({2: 0.06}, 40, seed) for j in job.add_comm(ev)]
    assert hits == []
    hits = [f.rank for ev in _windows({2: 0.06}, 40, seed) for j in job.add_comm(ev)
            for f in j[1]]
    assert hits == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tens_of_per_cent_from_the_first_op_is_a_fault(seed):
    job = JobState("j", JobConfig())
    hits = [(f.rank, f.evidence["evidence"]) for ev in _windows({3: 0.4}, 12, seed)
            for _, fs, _ in job.add_comm(ev) for f in fs]
    assert hits and {r for r, _ in hits} == {3}
    assert hits[0][1] == "far"


def test_far_from_peers_since_the_first_step_pages_within_five_steps_at_short_steps():
    """1 s steps, no sub-step evidence: peers judge from the job's second step."""
    from failslow.models.pipeline import Detector
    trace = simulate(SCENARIOS["first1_thermal_40"], seed=0, steps=12)
    det = Detector()
    incs = [i for ch in trace.batches() for i in det.process_batch(ch)]
    fault = trace.truth["faults"][0]
    paged = [i for i in incs if i["severity"] != "info"]
    assert paged and {i.get("rank") for i in paged} == {fault["rank"]}
    fifth = max(e["ts"] for e in trace.events() if e["kind"] == "step" and e["step"] == 4)
    assert paged[0]["ts"] <= fifth               # by the end of the job's fifth step


def _sub_finding(sustained_s: float):
    from failslow.models.findings import Finding
    return Finding(key="slow_rank:r5", fault="slow_rank", confirmed=True, onset_ts=10.0,
                   onset_step=7, slowdown_pct=30.0, own_pct=30.0, rank=5, host="h0", gpu=5,
                   evidence={"substep": True, "sustained_s": sustained_s})


@pytest.mark.parametrize(("sustained_s", "first"), [(3.0, "warning"), (3.9, "warning"),
                                                    (2.9, "info"), (0.0, "info")])
def test_a_confirmation_sustained_for_page_sustained_s_pages_at_once(sustained_s, first):
    """In a job of long steps (8 s), evidence consistent across windows for
    ``page_sustained_s`` (3 s) pages when it opens (issue 30: the policy's in-step rule);
    shorter evidence opens as info and pages once it persisted ``page_steps`` steps."""
    from failslow.models.incidents import IncidentTracker
    tr = IncidentTracker()
    for k in range(6):
        tr.step("j", 8.0 * k, [])
    out = []
    for k in range(5):
        out += tr.step("j", 48.0 + 8.0 * k, [(_sub_finding(sustained_s), "gpu_thermal",
                                               "rebalance_microbatches", "", {})])
    assert out[0]["status"] == "open" and out[0]["severity"] == first
    assert out[-1]["severity"] != "info"     # the step rule still pages
    if first == "info":
        assert [e["ts"] for e in out if e["severity"] != "info"][0] == 48.0 + 8.0 * 2


def test_sub_step_confirmation_pages_inside_the_step_it_began():
    """8 s steps: the culprit's incident opens already paging, inside its first slow step,
    seconds after its first slowed op; no other incident is loud."""
    from failslow.models.pipeline import Detector
    trace = simulate(SCENARIOS["long8_power_25"], seed=0, steps=17)
    fault = trace.truth["faults"][0]
    det = Detector()
    starts = {}
    incs = []
    for chunk in trace.batches():
        for ev in chunk:
            if ev["kind"] == "step":
                starts[(ev["rank"], ev["step"])] = ev["ts"] - ev["duration_s"]
        incs.extend(det.process_batch(chunk))
    loud = [i for i in incs if i["severity"] != "info"]
    assert loud and {i.get("rank") for i in loud} == {fault["rank"]}
    # opened from its windows (2 s of them), paged once they span page_sustained_s (3 s)
    first = next(i for i in incs if i.get("rank") == fault["rank"])
    assert first["status"] == "open" and first["evidence"]["sustained_s"] >= 2.0
    page = next(i for i in loud if i.get("rank") == fault["rank"])
    assert page["evidence"]["rule"] == "substep-windows"
    assert page["evidence"]["policy"].startswith("sustained")
    start = starts[(fault["rank"], fault["onset_step"])]
    assert page["ts"] - start < 8.0                    # seconds, not the 8 s step's end


def test_two_second_steps_are_long_from_their_first_window():
    """A job whose steps last 2 windows: a member confirmed from a step's first window is
    judged inside the step (the job's step time says the step is long)."""
    trace, found = _feed("long2_thermal_30", steps=30)
    fault = trace.truth["faults"][0]
    assert found and {r for _, _, r, _ in found} == {fault["rank"]}
    ts, s, _, f = found[0]
    assert s == fault["onset_step"] + 1 or s == fault["onset_step"]
    assert ts - _step_start(trace, fault["rank"], fault["onset_step"]) < 4.0


def test_two_second_steps_judge_their_tensor_parallel_group_inside_the_first_slow_step():
    """At 2 s steps the tensor-parallel group has ops in the two windows a step closes on
    time (the third, cut by the step's end, holds the gradient buckets): it counts as
    spread over the step (``MIN_SPREAD`` counts windows closed on time), so the culprit is
    confirmed inside its first slowed step, about two windows after its first slowed op."""
    trace, found = _feed("long2_thermal_30", steps=30)
    fault = trace.truth["faults"][0]
    ts, s, _, f = found[0]
    assert s == fault["onset_step"]
    assert ts - _step_start(trace, fault["rank"], fault["onset_step"]) < 2.6
    assert f.evidence["sustained_s"] >= 2.0


def test_gradient_buckets_at_the_step_end_give_no_value():
    """A group whose ops come only in the windows a step's end cuts (and at most one before
    it) is a burst: its ticks give no value, whoever blocks least."""
    from failslow.models.substep import SubStep

    sub = SubStep(JobConfig())
    out = []
    t = 0.0
    for step in range(12):
        for k, end in ((0, False), (1, False), (2, True)):
            for r in range(4):
                # the DP group's ops only in the step-end window; rank 3 blocks least
                ops = [{"group": "dp", "group_size": 4, "op": "all_reduce", "n": 4,
                        "blocked_s": 0.05 if r == 3 else 0.2, "max_s": 0.06, "bytes": 1 << 20,
                        "min_s": 0.01, "peer": None}] if end else [
                    {"group": "other", "group_size": 1, "op": "all_reduce", "n": 1,
                     "blocked_s": 0.0, "max_s": 0.0, "bytes": 1, "min_s": 0.0, "peer": None}]
                ev = {"rank": r, "ts": t + k + (0.5 if end else 1.0), "window_start_ts": t + k,
                      "step_end": end, "ops": ops}
                out.extend(sub.add(ev, step))
        t += 2.5
    assert not any(conf for _, conf, _ in out)
    g = sub.groups["dp"]
    assert np.isnan(g.raw.vals).all() or not g.ts


def _paged(name: str, seed: int):
    """Every incident event of a scenario through the Detector, and each (rank, step)'s
    start (its first op)."""
    from failslow.models.pipeline import Detector
    trace = simulate(SCENARIOS[name], seed=seed)
    det = Detector()
    starts, ends, incs = {}, {}, []
    for chunk in trace.batches():
        for ev in chunk:
            if ev["kind"] == "step":
                starts[(ev["job_id"], ev["rank"], ev["step"])] = ev["ts"] - ev["duration_s"]
                ends[(ev["job_id"], ev["rank"], ev["step"])] = ev["ts"]
        incs.extend(det.process_batch(chunk))
    return trace, starts, ends, incs + det.flush()


@pytest.mark.parametrize("seed", [0, 1])
def test_short_steps_a_tensor_parallel_culprit_pages_inside_its_second_slowed_step(seed):
    """1 s steps (tp2): the culprit is far outside its peers over its first slowed step, and
    its tensor-parallel partner still waits for it in the first window of the next: it
    opens there, before that step ends (the step rule alone opens at its end); at short
    steps it pages once it persisted ``page_steps`` (4) slowed steps (issue 30)."""
    trace, starts, ends, incs = _paged("thermal_two_jobs", seed)
    fault = trace.truth["faults"][0]
    key = (fault["job_id"], fault["rank"], fault["onset_step"])
    first = next(i for i in incs if i["job_id"] == fault["job_id"]
                 and i.get("rank") == fault["rank"])
    assert first["status"] == "open" and first["severity"] == "info"
    assert first["evidence"]["substep"] is True
    assert first["evidence"]["sustained_s"] >= 2.0
    second_end = ends[(key[0], key[1], key[2] + 1)]
    assert starts[key] < first["ts"] < second_end
    page = next(i for i in incs if i["job_id"] == fault["job_id"]
                and i.get("rank") == fault["rank"] and i["severity"] != "info")
    assert ends[(key[0], key[1], key[2] + 3)] <= page["ts"] < ends[(key[0], key[1], key[2] + 5)]
    assert not [i for i in incs if i["severity"] != "info" and i.get("rank") != fault["rank"]
                and i["job_id"] == fault["job_id"] and i["ts"] < second_end + 10]


def test_short_steps_a_host_fault_is_not_split_into_ranks():
    """A host whose ranks slow together (cpu contention, tp4): its ranks' groups wait for
    them window after window, but the host is the culprit: no rank incident is loud."""
    trace, _, _, incs = _paged("cpu_contention_30", 2)
    loud = {(i["fault"], i.get("host"), i.get("rank")) for i in incs if i["severity"] != "info"}
    assert loud == {("slow_host", trace.truth["faults"][0]["host"], None)}


def test_two_members_compare_with_each_other_at_short_steps():
    """A pair (tp2) at 1 s steps (one window closed on time a step): the first tick of a
    step keeps one observation; the slower member's lateness is its gap to the other, not
    half of it (the median of two is their mean)."""
    from failslow.models.substep import SubStep

    sub = SubStep(JobConfig())
    t = 0.0
    for step in range(3):
        for end in (False, True):
            for r in range(2):
                per_op = 0.01 if r == 1 else 0.05       # rank 1 arrives last, 0.04 s per op
                ops = [{"group": "tp", "group_size": 2, "op": "allreduce", "n": 6,
                        "blocked_s": 6 * per_op, "max_s": per_op, "min_s": per_op,
                        "bytes": 1 << 20}]
                ev = {"rank": r, "ts": t + (1.0 if not end else 1.3),
                      "window_start_ts": t + (0.0 if not end else 1.0), "step_end": end,
                      "ops": ops}
                sub.add(ev, step)
        t += 1.3
    obs = sub.groups["tp"].obs
    assert [o[0] for o in obs] == [1, 2]                 # the last two steps' first ticks
    late, fast = obs[-1][2][1][0], obs[-1][2][0][0]
    assert fast == 0.0
    # 0.04 s late per op over the faster member's work per op ((1.0 - 5 x 0.05) / 5)
    assert late == pytest.approx(0.04 / 0.15, rel=1e-6)


def test_a_short_step_job_whose_culprit_makes_its_steps_long_pages_in_the_second():
    """1 s steps, a GPU throttled to 3x: its steps last over 2 windows; the culprit far
    outside its peers over its first slowed step, waited for as much in the first window of
    the second, opens there (the step rule, whose second step fades against the first,
    opened at the end of the third); it pages once it persisted 4 slowed steps."""
    trace, starts, ends, incs = _paged("gpu_thermal_3x_short", 0)
    fault = trace.truth["faults"][0]
    key = (fault["job_id"], fault["rank"], fault["onset_step"])
    first = next(i for i in incs if i.get("rank") == fault["rank"])
    assert first["severity"] == "info" and first["evidence"]["substep"] is True
    assert starts[(key[0], key[1], key[2] + 1)] < first["ts"] < ends[(key[0], key[1], key[2] + 1)]
    page = next(i for i in incs if i.get("rank") == fault["rank"] and i["severity"] != "info")
    assert page["ts"] == pytest.approx(ends[(key[0], key[1], key[2] + 3)], abs=0.5)


def _may_pass_loop(w, rows, half, scales):
    """``_may_pass`` as every trailing window's sum, the newest value first, NaN skipped."""
    floor = half - 1e-9
    for v in w.vals[rows, -min(max(scales), w.width):].tolist():
        tot, cnt = 0.0, 0
        for k, x in enumerate(reversed(v), 1):
            if x == x:
                tot += x
                cnt += 1
            if k in scales and cnt and tot > floor * cnt:
                return True
    return False


def test_may_pass_answers_as_summing_every_window_does():
    """The tick's shortcut (no test when no trailing mean can pass) answers as summing each
    window does: values far under the bar, at it to the last bit, NaN, every row NaN."""
    from failslow.models.evidence import Windows
    from failslow.models.substep import _may_pass

    rng = np.random.default_rng(7)
    answers = set()
    for _ in range(3000):
        w = Windows(32)
        rows = w.rows_for(list(range(int(rng.integers(1, 10)))))
        half = float(rng.uniform(0.02, 0.3))
        for _ in range(int(rng.integers(0, 40))):
            x = rng.normal(rng.uniform(-0.1, 0.3), 0.05, rows.size)
            x[rng.random(rows.size) < 0.15] = np.nan
            if rng.random() < 0.1:       # at the bar: means that round either way
                x[:] = half - 1e-9 + float(rng.choice([-1e-15, 0.0, 1e-15]))
            w.push(rows, x)
        scales = tuple(sorted({int(s) for s in rng.integers(1, 40, 3)}))
        want = _may_pass_loop(w, rows, half, scales)
        assert _may_pass(w, rows, half, scales) is want
        answers.add(want)
    assert answers == {True, False}


def test_lower_half_sigma_is_lower_half_refs_bit_for_bit():
    from failslow.models.peers import lower_half_ref
    from failslow.models.substep import _lower_half_sigma

    rng = np.random.default_rng(3)
    for n in range(1, 20):
        for _ in range(200):
            xs = np.log1p(rng.uniform(-0.9, 1.0, n))
            xs[rng.random(n) < 0.2] = float(rng.choice([0.0, -0.0, xs[0]]))
            assert _lower_half_sigma(xs.tolist()) == lower_half_ref(xs)[1]
    xs = [0.1, float("nan"), 0.2]
    assert np.isnan(_lower_half_sigma(xs)) == np.isnan(lower_half_ref(np.array(xs))[1])
