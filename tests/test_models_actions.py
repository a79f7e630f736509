"""The mitigation planner (issue 32): shares from measured time per sample, whole units,
the policy (off / suggest / auto, per job pattern), one action per incident, refined on
the new shares, the rollback when the incident resolves (a closed-loop job through the
detector: the incident stays open while the fault does), an ``info`` straggler acted on
once it persisted, drains once per escalation; the ``[mitigate]`` table's errors."""

from __future__ import annotations

from statistics import median

import orjson
import pytest

from failslow.models.acting import ActingDetector
from failslow.models.actions import (
    ActionPlanner,
    MitigationConfig,
    MitigationConfigError,
    plan_shares,
    whole_counts,
)
from failslow.models.pipeline import Detector
from failslow.schema import validate

JOB = "train-7"


def steps(planner: ActionPlanner, first: int, n: int, slow: dict[int, float],
          world: int = 4, job: str = JOB, samples: list[int] | None = None) -> list[dict]:
    """``n`` steps of ``world`` ranks; rank r's compute is its samples x 1 ms x slow[r]."""
    out = []
    for s in range(first, first + n):
        for r in range(world):
            b = samples[r] if samples else 32
            ev = {"v": 1, "kind": "step", "ts": 1000.0 + s, "job_id": job, "rank": r,
                  "world_size": world, "host": f"h{r}", "step": s, "duration_s": 0.2,
                  "compute_s": 0.001 * b * slow.get(r, 1.0), "comm_s": 0.05, "samples": b}
            out += planner.observe(ev)
    return out


def incident(severity: str = "warning", mitigation: str = "rebalance_microbatches",
             status: str = "open", job: str = JOB, **extra) -> dict:
    return {"v": 1, "kind": "incident", "ts": 1010.0, "incident_id": f"{job}:slow_rank:2:5",
            "job_id": job, "status": status, "fault": "slow_rank", "severity": severity,
            "onset_ts": 1005.0, "detected_ts": 1010.0, "slowdown_pct": 40.0, "rank": 2,
            "host": "h2", "mitigation": mitigation, "root_cause": "gpu_thermal", **extra}


def test_shares_equalize_share_times_time_and_respect_the_floor():
    shares = plan_shares({0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0})
    assert shares[2] == pytest.approx(shares[0] / 2, abs=1e-3)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    floored = plan_shares({0: 1.0, 1: 1.0, 2: 50.0, 3: 1.0})
    assert floored[2] == pytest.approx(0.25 / 4)
    assert floored[0] == pytest.approx((1 - 0.0625) / 3, abs=1e-4)


@pytest.mark.parametrize("batch", [4, 7, 64, 1000])
def test_whole_counts_sum_to_the_batch_and_keep_the_floor(batch):
    counts = whole_counts([0.3, 0.3, 0.02, 0.38], batch)
    assert sum(counts) == batch and min(counts) >= max(1, batch * 0.25 / 4 - 1e-9)
    assert counts == whole_counts({0: 0.3, 1: 0.3, 2: 0.02, 3: 0.38}, batch)
    with pytest.raises(ValueError, match="smaller than the 4 ranks"):
        whole_counts([0.25] * 4, 3)


def test_nothing_in_the_job_s_first_steps():
    p = ActionPlanner(MitigationConfig(mode="auto"))
    steps(p, 0, 19, {2: 2.0})
    assert p.on_incident(incident()) == []
    steps(p, 19, 2, {2: 2.0})
    assert p.on_incident(incident())[0]["rank"] == 2


def test_auto_rebalances_once_per_incident_and_rolls_back_when_it_resolves():
    p = ActionPlanner(MitigationConfig(mode="auto"))
    assert steps(p, 0, 24, {2: 2.0}) == []
    (act,) = p.on_incident(incident())
    validate(act)
    assert act["mode"] == "apply" and act["type"] == "rebalance_microbatches"
    assert act["apply_at_step"] == 23 + 2 and act["rank"] == 2
    assert act["shares"][2] == pytest.approx(act["shares"][0] / 2, abs=1e-3)
    assert "rank 2 takes" in act["reason"]
    assert p.on_incident(incident(severity="critical")) == []     # one per incident
    counts = whole_counts(act["shares"], 128)
    # the new shares measure the same speeds: nothing to refine, the action holds
    assert steps(p, 24, 30, {2: 2.0}, samples=counts) == [] and p.held(JOB) == act
    other = {**incident(status="resolved"), "incident_id": f"{JOB}:slow_rank:1:9", "rank": 1}
    assert p.on_incident(other) == []                             # not the one acted on
    (back,) = p.on_incident(incident(status="resolved"))
    validate(back)
    assert back["rollback"] is True and back["shares"] == [0.25] * 4
    assert back["version"] > act["version"] and p.held(JOB) is None
    assert p.on_incident(incident(status="resolved")) == []       # once


def test_a_plan_that_undershoots_is_refined_on_the_new_shares_a_bounded_number_of_times():
    """On shared cores a 2x rank measures 1.4x slower per sample while its peers wait
    (descheduled, they give it their core): the first plan gives it too much. On the new
    shares its time per sample says more; each refinement reads only steps on the shares
    in force, and there are at most ``refine`` of them."""
    p = ActionPlanner(MitigationConfig(mode="auto", refine=2))
    steps(p, 0, 24, {2: 1.4})
    (act,) = p.on_incident(incident())
    counts = whole_counts(act["shares"], 128)
    assert steps(p, 24, act["apply_at_step"] - 24 + 7, {2: 2.0}, samples=counts) == []
    (ref,) = steps(p, act["apply_at_step"] + 7, 1, {2: 2.0}, samples=counts)
    validate(ref)
    assert ref["incident_id"] == act["incident_id"] and ref["version"] > act["version"]
    assert ref["shares"][2] == pytest.approx(ref["shares"][0] / 2, abs=2e-3)
    assert ref["shares"][2] < act["shares"][2]
    assert ref["reason"].startswith("refined: rank 2 takes") and not ref.get("rollback")
    assert p.held(JOB) == ref and ref["step_s_before"] == act["step_s_before"]
    # measured on the refined shares the plan holds; a third plan would be over the bound
    counts = whole_counts(ref["shares"], 128)
    assert steps(p, ref["apply_at_step"], 20, {2: 2.0}, samples=counts) == []
    s = ref["apply_at_step"] + 20
    (again,) = steps(p, s, 20, {2: 4.0}, samples=counts)
    assert again["shares"][2] < ref["shares"][2]
    counts = whole_counts(again["shares"], 128)
    assert steps(p, s + 20, 40, {2: 8.0}, samples=counts) == []   # a third cut: over the bound
    # giving its share back only undoes: not bounded (it recovered: near equal again)
    (undo,) = steps(p, s + 60, 20, {}, samples=counts)
    assert undo["shares"][2] > again["shares"][2] and p.held(JOB) == undo


def test_an_info_straggler_is_rebalanced_once_its_incident_persisted_never_a_transient():
    """A compute straggler the paging policy keeps at ``info`` (too cheap to wake anyone)
    gets its rebalance once its incident stayed open ``persist_steps`` steps and it is
    ``min_gain`` slower per sample; one that resolves before never does."""
    p = ActionPlanner(MitigationConfig(mode="auto"))
    steps(p, 0, 24, {2: 1.5})
    assert p.on_incident(incident(severity="info")) == []
    assert steps(p, 24, 15, {2: 1.5}) == []
    assert p.on_incident(incident(severity="info", status="resolved")) == []
    assert steps(p, 39, 40, {2: 1.5}) == []                       # resolved: forgotten
    later = {**incident(severity="info"), "incident_id": f"{JOB}:slow_rank:2:80"}
    assert p.on_incident(later) == []
    assert steps(p, 79, 15, {2: 1.5}) == []
    (act,) = steps(p, 94, 1, {2: 1.5})
    assert act["mode"] == "apply" and act["incident_id"] == later["incident_id"]
    assert "open 16 steps" in act["reason"] and p.held(JOB) == act
    # suggest: one dry run for it, nothing held
    p = ActionPlanner(MitigationConfig())
    steps(p, 0, 24, {2: 1.5})
    p.on_incident(incident(severity="info"))
    dry = steps(p, 24, 40, {2: 1.5})
    assert [a["mode"] for a in dry] == ["dry_run"] and p.held(JOB) is None


def test_suggest_publishes_dry_runs_and_off_publishes_nothing():
    cfg = MitigationConfig.from_mapping({"jobs": {"train-*": "off", "eval-*": "auto"}})
    p = ActionPlanner(cfg)
    for job in (JOB, "dev-1", "eval-3"):
        steps(p, 0, 24, {2: 2.0}, job=job)
    assert p.on_incident(incident(job=JOB)) == []
    (dry,) = p.on_incident(incident(job="dev-1"))
    assert dry["mode"] == "dry_run" and p.held("dev-1") is None
    assert p.on_incident(incident(job="eval-3"))[0]["mode"] == "apply"


@pytest.mark.parametrize("inc", [
    incident(severity="info"),                      # not paged: it must persist first
    incident(mitigation="ignore"),
    incident(severity="info", evidence={"imbalance": True, "rule": "imbalance"}),
    incident(fault="slow_link"),
])
def test_never_acts_on_transients_ignore_or_steady_imbalance(inc):
    p = ActionPlanner(MitigationConfig(mode="auto"))
    steps(p, 0, 24, {2: 2.0})
    assert p.on_incident(inc) == []


def test_steady_imbalance_only_when_opted_in_and_only_when_slower_per_sample():
    p = ActionPlanner(MitigationConfig(mode="auto", steady=True))
    steps(p, 0, 24, {2: 1.05})      # 5 % per sample: below min_gain, nothing to move
    steady = incident(severity="info", evidence={"imbalance": True})
    assert p.on_incident(steady) == []
    steps(p, 24, 10, {2: 1.6})
    assert p.on_incident(steady)[0]["mode"] == "apply"


def test_drain_goes_out_once_per_escalation_and_is_a_dry_run_unless_configured():
    esc = incident(mitigation="migrate_node")
    p = ActionPlanner(MitigationConfig(mode="auto"))
    (dry,) = p.on_incident(esc)
    assert dry["type"] == "drain_host" and dry["mode"] == "dry_run" and dry["host"] == "h2"
    cfg = MitigationConfig(mode="auto", drain_command="scontrol update nodename={host}")
    p = ActionPlanner(cfg)
    (drain,) = p.on_incident(esc)
    validate(drain)
    assert drain["mode"] == "apply" and drain["shares"] == []
    assert p.on_incident(esc) == [] and p.on_incident({**esc, "severity": "critical"}) == []


@pytest.mark.parametrize(("table", "why"), [
    ({"mod": "auto"}, "mitigate: unknown key 'mod'"),
    ({"mode": "yes"}, "mitigate.mode: 'yes' is not one of off, suggest, auto"),
    ({"jobs": {"a*": "on"}}, "mitigate.jobs.'a*': 'on' is not one of"),
    ({"floor": "0.3"}, "mitigate.floor: '0.3' is not a number"),
    ({"floor": 2.0}, "mitigate.floor: 2.0 is not in (0, 1]"),
    ({"lead_steps": 0}, "mitigate.lead_steps: 0 is not an integer >= 1"),
    ({"steady": "yes"}, "mitigate.steady: 'yes' is not a bool"),
    ({"persist_steps": 0}, "mitigate.persist_steps: 0 is not an integer >= 1"),
    ({"refine": -1}, "mitigate.refine: -1 is not an integer >= 0"),
    ({"refine_z": -1}, "mitigate.refine_z: -1 is not a number >= 0"),
    ({"refine_blocks": 0}, "mitigate.refine_blocks: 0 is not an integer >= 1"),
])
def test_config_errors_are_one_line(table, why):
    with pytest.raises(MitigationConfigError) as err:
        MitigationConfig.from_mapping(table)
    assert str(err.value).startswith(why) and "\n" not in str(err.value)


def test_acting_detector_state_survives_a_snapshot():
    cfg = MitigationConfig(mode="auto")
    det = ActingDetector(Detector(), ActionPlanner(cfg))
    steps(det.planner, 0, 24, {2: 2.0})
    det.planner.on_incident(incident())
    det.telemetry_delay_s = 3.0
    assert det.inner.telemetry_delay_s == 3.0
    state = orjson.loads(orjson.dumps(det.state_dict()))   # snapshots are JSON
    back = ActingDetector.restore(state, Detector.from_state, cfg)
    assert back.planner.held(JOB)["rank"] == 2
    bare = ActingDetector.restore(Detector().state_dict(), Detector.from_state, cfg)
    assert bare.planner.held(JOB) is None


def closed_loop(factor: float, onset: int, recover: int, n: int = 200, world: int = 4,
                batch: int = 128, seed: int = 0, fixed: float = 0.0,
                noise: float = 0.02) -> dict:
    """A synchronous job whose ranks apply the actions they get, through the worker's
    detector and planner: rank 2's time per sample x ``factor`` over [onset, recover).
    A rank's compute is ``fixed`` (seconds a step, whatever its share) + 4 ms a sample."""
    import random

    rnd = random.Random(seed)
    det = ActingDetector(Detector(), ActionPlanner(MitigationConfig(mode="auto")))
    shares: list[float] | None = None
    pending: list[dict] = []
    ts, out = 1000.0, {"actions": [], "incidents": [], "step_s": {}, "switches": []}
    for s in range(n):
        due = [a for a in pending if a["apply_at_step"] <= s]
        if due:
            shares = due[-1]["shares"]
            pending = [a for a in pending if a["apply_at_step"] > s]
            out["switches"].append((s, shares))
        counts = whole_counts(shares, batch) if shares else [batch // world] * world
        slow = factor if onset <= s < recover else 1.0
        compute = [(fixed + 0.004 * c * (slow if r == 2 else 1.0)) * rnd.gauss(1.0, noise)
                   for r, c in enumerate(counts)]
        step_s = max(compute) + 0.02
        ts += step_s
        out["step_s"][s] = step_s
        evs = [{"v": 1, "kind": "step", "ts": ts, "job_id": JOB, "rank": r,
                "world_size": world, "host": f"h{r}", "step": s, "duration_s": step_s,
                "compute_s": compute[r], "comm_s": step_s - compute[r], "samples": counts[r]}
               for r in range(world)]
        for e in det.process_batch(evs):
            e["_step"] = s
            if e["kind"] == "action":
                validate({k: v for k, v in e.items() if k != "_step"})
                pending.append(e)
                out["actions"].append(e)
            elif e["kind"] == "incident":
                out["incidents"].append(e)
    return out


def test_closed_loop_the_incident_stays_open_while_rebalanced_and_the_rollback_follows_its_resolve():
    """Judged per sample (steps carry ``samples``), a rebalanced straggler's incident stays
    open as long as the fault does; the shares return to equal within 10 steps of its
    resolve and the step time to its base."""
    run = closed_loop(2.0, onset=40, recover=120)
    go = run["actions"][0]
    assert go["rank"] == 2 and go["shares"][2] < 0.2 and not go.get("rollback")
    mine = [i for i in run["incidents"] if i["incident_id"] == go["incident_id"]]
    page = next(i["_step"] for i in mine if i["severity"] != "info")
    switch = next(s for s, sh in run["switches"] if sh[2] < 0.25)
    assert 40 <= page and switch - page <= 10
    resolved = [i["_step"] for i in mine if i["status"] == "resolved"]
    assert resolved and resolved[0] >= 120, "open while the fault is there, rebalanced"
    (back,) = [a for a in run["actions"] if a.get("rollback")]
    assert back["incident_id"] == go["incident_id"]
    assert back["apply_at_step"] - resolved[0] <= 10
    assert [sh for _, sh in run["switches"]][-1] == [0.25] * 4
    steps_s = run["step_s"]
    base = median(steps_s[s] for s in range(20, 40))
    slowed = median(steps_s[s] for s in range(switch - 8, switch))
    balanced = median(steps_s[s] for s in range(switch + 2, 120))
    after = median(steps_s[s] for s in range(back["apply_at_step"] + 1, 200))
    assert balanced < base + 0.6 * (slowed - base)
    assert after == pytest.approx(base, rel=0.05)
    assert len([a for a in run["actions"] if a["incident_id"] == go["incident_id"]]) <= 2 + 3


def test_no_rebalance_from_a_partial_view_a_job_whose_steps_it_never_saw():
    """A job larger than one shard: ``ActingDetector`` hands the planner none of its steps
    (each partition sees only its ranks), so its incidents, paged or persisted, plan
    nothing; a drain, which names one host, still goes out."""
    p = ActionPlanner(MitigationConfig(mode="auto"))
    steps(p, 0, 60, {2: 2.0}, job="another-job")
    assert p.on_incident(incident(severity="critical")) == []
    assert p.on_incident(incident(severity="info")) == []
    assert steps(p, 60, 40, {2: 2.0}, job="another-job") == []
    (drain,) = p.on_incident(incident(mitigation="migrate_node"))
    assert drain["type"] == "drain_host" and p.held(JOB) is None


@pytest.mark.parametrize(("factor", "fixed"), [(2.0, 0.03), (2.0, 0.045), (1.5, 0.03)])
def test_closed_loop_a_recovered_rank_on_a_small_share_resolves_within_10_steps(factor, fixed):
    """A step's cost that does not scale with the share (here 20-26 % of a rank's work at
    an equal share: the optimizer, the all-reduce's CPU) made a recovered rank still on
    its small share look slower per sample by ``fixed / samples``: it resolved 25 steps
    after its recovery, or never, and healthy ranks carried its work until then. The
    detector estimates the fixed cost from the job's steps on different shares
    (``models.shares``): the incident resolves within 10 steps of the recovery, the
    shares return to equal within 10 steps of the resolve, the step time to its base."""
    run = closed_loop(factor, onset=40, recover=120, fixed=fixed, noise=0.01)
    go = run["actions"][0]
    assert go["rank"] == 2 and go["shares"][2] < 0.25 and not go.get("rollback")
    assert {i["incident_id"] for i in run["incidents"]} == {go["incident_id"]}
    resolved = [i["_step"] for i in run["incidents"] if i["status"] == "resolved"]
    assert resolved and 120 <= resolved[0] <= 120 + 10, resolved
    (back,) = [a for a in run["actions"] if a.get("rollback")]
    assert back["apply_at_step"] - resolved[0] <= 10
    assert [sh for _, sh in run["switches"]][-1] == [0.25] * 4
    steps_s = run["step_s"]
    base = median(steps_s[s] for s in range(20, 40))
    assert median(steps_s[s] for s in range(back["apply_at_step"] + 1, 200)) == \
        pytest.approx(base, rel=0.03)


@pytest.mark.parametrize("refine_z", [0.0, 3.0])
def test_a_refinement_must_exceed_the_window_s_own_noise(refine_z):
    """On shared cores a rank's speed comes in load episodes of several steps: one
    window's median swung the culprit's share +-30 % (0.19 -> 0.10 -> 0.17 ...). A
    refinement is sent only when the share moves by ``refine_z`` standard errors of the
    planned share, measured from the spread of the window's blocks (``refine_blocks`` per
    ``window_steps``); a move the whole window agrees on still goes out."""
    p = ActionPlanner(MitigationConfig(mode="auto", refine_z=refine_z))
    steps(p, 0, 24, {2: 2.0})
    (act,) = p.on_incident(incident())
    counts = whole_counts(act["shares"], 128)
    s = 24
    # load episodes of 5 steps, 30 % slower, then 25 % faster: a window's median lands
    # on one or the other (its share 20-30 % off), the blocks say it is noise
    out = []
    for slow in (2.6, 1.5) * 4:
        out += steps(p, s, 5, {2: slow}, samples=counts)
        s += 5
    assert (out == [] and p.held(JOB) == act) is bool(refine_z)
    if refine_z:
        # every block agrees: 3x, the share is cut
        (ref,) = steps(p, s, 16, {2: 3.0}, samples=counts)
        assert ref["shares"][2] < act["shares"][2] * 0.8
