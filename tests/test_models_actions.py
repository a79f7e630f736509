"""The mitigation planner (issue 32): shares from measured time per sample, whole units,
the policy (off / suggest / auto, per job pattern), one action per incident, the rollback
when the culprit recovers, drains once per escalation; the ``[mitigate]`` table's errors."""

from __future__ import annotations

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


def test_auto_rebalances_once_per_incident_and_rolls_back_when_the_culprit_recovers():
    p = ActionPlanner(MitigationConfig(mode="auto"))
    assert steps(p, 0, 24, {2: 2.0}) == []
    (act,) = p.on_incident(incident())
    validate(act)
    assert act["mode"] == "apply" and act["type"] == "rebalance_microbatches"
    assert act["apply_at_step"] == 23 + 2 and act["rank"] == 2
    assert act["shares"][2] == pytest.approx(act["shares"][0] / 2, abs=1e-3)
    assert "rank 2 takes" in act["reason"]
    assert p.on_incident(incident(severity="critical")) == []     # one per incident
    assert p.on_incident(incident(status="resolved")) == []       # resolve alone: still slow
    counts = whole_counts(act["shares"], 128)
    assert steps(p, 24, 10, {2: 2.0}, samples=counts) == []       # still slow per sample
    (back,) = steps(p, 34, 8, {}, samples=counts)
    validate(back)
    assert back["rollback"] is True and back["shares"] == [0.25] * 4
    assert back["version"] > act["version"] and p.held(JOB) is None


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
    incident(severity="info"),                                    # not paged: a blip
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
