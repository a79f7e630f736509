"""The routing policy: severity routes, info never pages, de-duplication, escalation,
resolve, rate limits with a summary. Pure: no I/O, the clock is an argument."""

from __future__ import annotations

import pytest

from failslow.alerting import AlertingError, Policy, RateLimit, Router
from failslow.alerting.router import IncidentState, TokenBucket
from failslow.commands.notify import parse_policy

ALL = ["console", "slack", "pagerduty", "webhook"]


def incident(**kw):
    ev = {"v": 1, "kind": "incident", "ts": 100.0, "incident_id": "job0:slow_rank:r5:20",
          "job_id": "job0", "status": "open", "fault": "slow_rank", "severity": "warning",
          "onset_ts": 90.0, "detected_ts": 100.0, "slowdown_pct": 25.0, "rank": 5,
          "host": "h0", "gpu": 5, "root_cause": "gpu_thermal", "mitigation": "migrate_node"}
    ev.update(kw)
    return ev


def dests(notes):
    return sorted(n.destination for n in notes)


def unlimited() -> Policy:
    return Policy(rates={})


def test_routes_by_severity():
    r = Router(unlimited(), ALL)
    assert dests(r.decide(incident(incident_id="a", severity="info"), 0)) == ["console", "webhook"]
    assert dests(r.decide(incident(incident_id="b", severity="warning"), 0)) == [
        "console", "slack", "webhook"]
    assert dests(r.decide(incident(incident_id="c", severity="critical"), 0)) == ALL[:1] + [
        "pagerduty", "slack", "webhook"]


def test_only_enabled_destinations_are_used():
    r = Router(unlimited(), ["slack"])
    assert dests(r.decide(incident(severity="critical"), 0)) == ["slack"]


def test_info_and_job_slowdown_never_page():
    with pytest.raises(AlertingError, match="never page"):
        Policy(routes={"info": ("pagerduty", "slack")})
    # A job-wide slowdown stays off PagerDuty even if something marks it critical.
    r = Router(unlimited(), ALL)
    notes = r.decide(incident(fault="job_slowdown", severity="critical", rank=None), 0)
    assert "pagerduty" not in dests(notes) and "slack" in dests(notes)


def test_updates_of_an_open_incident_are_silent():
    r = Router(unlimited(), ALL)
    assert len(r.decide(incident(), 0)) == 3
    for t in range(1, 20):
        assert r.decide(incident(ts=100.0 + t, slowdown_pct=25.0 + t), t) == []
    # A lower severity is an update too, not news.
    assert r.decide(incident(severity="info"), 30) == []


def test_escalation_notifies_the_new_severity_and_triggers_pagerduty():
    r = Router(unlimited(), ALL)
    r.decide(incident(severity="warning"), 0)
    notes = r.decide(incident(severity="critical"), 5)
    assert dests(notes) == ["console", "pagerduty", "slack", "webhook"]
    assert {n.action for n in notes} == {"escalate"}
    assert r.decide(incident(severity="critical"), 6) == []
    assert r.state["job0:slow_rank:r5:20"].severity == "critical"


def test_resolve_goes_to_those_told_and_only_once():
    r = Router(unlimited(), ALL)
    r.decide(incident(severity="critical"), 0)
    notes = r.decide(incident(status="resolved", resolved_ts=200.0), 10)
    assert dests(notes) == ["console", "pagerduty", "slack", "webhook"]
    assert {n.action for n in notes} == {"resolve"}
    assert r.decide(incident(status="resolved"), 11) == []


def test_resolve_of_a_warning_does_not_reach_pagerduty():
    r = Router(unlimited(), ALL)
    r.decide(incident(severity="warning"), 0)
    assert "pagerduty" not in dests(r.decide(incident(status="resolved"), 1))


def test_resolve_of_an_unseen_incident_skips_pagerduty():
    r = Router(unlimited(), ALL)
    notes = r.decide(incident(status="resolved", severity="critical"), 0)
    assert dests(notes) == ["console", "slack", "webhook"]


def test_a_resolved_incident_that_reopens_is_announced_again():
    r = Router(unlimited(), ALL)
    r.decide(incident(), 0)
    r.decide(incident(status="resolved"), 1)
    assert {n.action for n in r.decide(incident(), 2)} == {"open"}


def test_state_restored_after_restart_keeps_dedup():
    r = Router(unlimited(), ALL)
    r.decide(incident(severity="critical"), 0)
    saved = {k: IncidentState.from_dict(v.to_dict()) for k, v in r.take_dirty().items()}
    again = Router(unlimited(), ALL, saved)
    assert again.decide(incident(severity="critical"), 5) == []
    assert "pagerduty" in dests(again.decide(incident(status="resolved"), 6))


def test_rate_limit_holds_back_then_summarizes():
    r = Router(Policy(rates={"slack": RateLimit(2, 60.0)}), ["slack", "webhook"])
    sent = [r.decide(incident(incident_id=f"i{k}"), 0.0) for k in range(5)]
    assert [dests(n) for n in sent] == [["slack", "webhook"]] * 2 + [["webhook"]] * 3
    assert r.suppressed_total == 3
    assert r.summaries(1.0) == []  # no token yet: 2 per 60 s -> one token after 30 s
    (summary,) = r.summaries(31.0)
    assert summary.destination == "slack" and summary.action == "summary"
    assert summary.event["suppressed"] == 3
    assert summary.event["incident_ids"] == ["i2", "i3", "i4"]
    assert r.summaries(200.0) == []


def test_rate_limit_never_holds_back_a_resolve_of_a_told_incident():
    r = Router(Policy(rates={"slack": RateLimit(1, 3600.0)}), ["slack"])
    assert dests(r.decide(incident(incident_id="a"), 0)) == ["slack"]
    assert r.decide(incident(incident_id="b"), 1) == []  # held back
    assert dests(r.decide(incident(incident_id="a", status="resolved"), 2)) == ["slack"]
    # "b" was never announced on Slack, so neither is its end.
    assert r.decide(incident(incident_id="b", status="resolved"), 3) == []


def test_token_bucket_refills_at_its_rate():
    b = TokenBucket(RateLimit(3, 30.0))
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(5.0) is False and b.take(10.0) is True


def test_prune_forgets_old_resolved_incidents_only():
    r = Router(unlimited(), ALL)
    r.decide(incident(incident_id="old"), 0)
    r.decide(incident(incident_id="old", status="resolved"), 1)
    r.decide(incident(incident_id="open"), 1)
    assert r.prune(before_ts=100.0) == ["old"]
    assert set(r.state) == {"open"}


def test_command_line_policy_parsing():
    p = parse_policy(["warning=webhook"], ["slack=5/10", "webhook=off"])
    assert p.routes["warning"] == ("webhook",) and p.rates["slack"] == RateLimit(5, 10.0)
    assert p.rates["webhook"] is None
    for bad_routes, bad_rates, msg in [(["info=pagerduty"], [], "never page"),
                                       (["warning=email"], [], "unknown destination"),
                                       (["urgent=slack"], [], "severity"),
                                       ([], ["slack=fast"], "N/SECONDS"),
                                       ([], ["sms=1/1"], "unknown destination")]:
        with pytest.raises(AlertingError, match=msg):
            parse_policy(bad_routes, bad_rates)
