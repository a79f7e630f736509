"""What each destination receives, how HTTP failures are classified, and that secrets
never reach a log, a repr or an error message. Against a real local HTTP server."""

from __future__ import annotations

import io
import logging

import pytest
from http_receiver import HttpReceiver

from failslow.alerting import (
    AlertingError,
    Backoff,
    ConsoleNotifier,
    Dispatcher,
    Notification,
    Outbox,
    PagerDutyNotifier,
    SlackNotifier,
    WebhookNotifier,
    build_notifiers,
)
from failslow.alerting.transport import parse_retry_after
from failslow.stack import free_port

SLACK_SECRET = "T000/B000/XXXXsecretSLACKtoken"
ROUTING_KEY = "R0UT1NGKEYsecret0123456789abcdef"


def incident(**kw):
    ev = {"v": 1, "kind": "incident", "ts": 1_700_000_100.0,
          "incident_id": "job0:slow_rank:r5:20", "job_id": "job0", "status": "open",
          "fault": "slow_rank", "severity": "critical", "onset_ts": 1_700_000_000.0,
          "detected_ts": 1_700_000_012.5, "slowdown_pct": 31.25, "rank": 5, "host": "h0",
          "gpu": 5, "root_cause": "gpu_thermal", "mitigation": "migrate_node",
          "evidence": {"rank_step_s": 1.3}}
    ev.update(kw)
    return ev


@pytest.fixture
def rx():
    with HttpReceiver() as r:
        yield r


def test_pagerduty_trigger_then_resolve_share_the_dedup_key(rx):
    pd = PagerDutyNotifier(ROUTING_KEY, rx.url("/v2/enqueue"))
    result = pd.send([Notification("pagerduty", "open", incident()),
                      Notification("pagerduty", "resolve",
                                   incident(status="resolved", resolved_ts=1_700_000_400.0))])
    assert result.delivered == [0, 1] and result.retry_from is None
    trigger, resolve = rx.bodies("/v2/enqueue")
    assert trigger["routing_key"] == ROUTING_KEY and trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == "job0:slow_rank:r5:20"
    payload = trigger["payload"]
    assert payload["severity"] == "critical" and payload["source"] == "h0"
    assert "slow_rank" in payload["summary"] and "rank 5" in payload["summary"]
    assert len(payload["summary"]) <= 1024
    assert payload["custom_details"]["root_cause"] == "gpu_thermal"
    assert payload["custom_details"]["slowdown_pct"] == 31.25
    assert "migrate_node" in payload["custom_details"]["mitigation_text"]
    assert payload["timestamp"] == "2023-11-14T22:13:32Z"
    assert resolve == {"routing_key": ROUTING_KEY, "event_action": "resolve",
                       "dedup_key": "job0:slow_rank:r5:20"}


def test_slack_message_reads_like_an_incident(rx):
    slack = SlackNotifier(rx.url("/services/" + SLACK_SECRET))
    slack.send([Notification("slack", "open", incident()),
                Notification("slack", "resolve",
                             incident(status="resolved", resolved_ts=1_700_000_400.0))])
    opened, resolved = (b["text"] for b in rx.bodies())
    for needle in ("CRITICAL", "slow_rank", "job0", "rank 5", "host h0", "GPU 5",
                   "gpu_thermal", "+31.2%", "migrate_node", "move this node's ranks",
                   "2023-11-14 22:13:20Z", "detected 2023-11-14 22:13:32Z (+12.5 s)",
                   "job0:slow_rank:r5:20"):
        assert needle in opened, needle
    assert "RESOLVED" in resolved and "after 6m40s" in resolved
    assert rx.bodies()[0]["blocks"][0]["type"] == "section"


def test_slack_names_both_ends_of_a_slow_link_and_the_mitigation_reason(rx):
    slack = SlackNotifier(rx.url("/s"))
    ev = incident(fault="slow_link", rank=3, host="h0", gpu=None, peer_rank=12,
                  peer_host="h1", root_cause="nic_congestion", mitigation="adjust_pipeline",
                  evidence={"mitigation_reason": "stage 2 -> 3 link is 40% slower"})
    slack.send([Notification("slack", "open", ev)])
    text = rx.bodies()[0]["text"]
    assert "link rank 3 (host h0) <-> rank 12 (host h1)" in text
    assert "adjust_pipeline (stage 2 -> 3 link is 40% slower)" in text


def test_webhook_posts_the_incident_as_is(rx):
    ev = incident()
    WebhookNotifier(rx.url("/hook")).send([Notification("webhook", "escalate", ev)])
    (req,) = rx.received("/hook")
    assert req.json() == ev and req.headers["X-Failslow-Action"] == "escalate"


def test_console_prints_one_line_per_change():
    out = io.StringIO()
    ConsoleNotifier(out).send([Notification("console", "open", incident()),
                               Notification("console", "resolve",
                                            incident(status="resolved"))])
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[CRITICAL] slow_rank in job0: rank 5") and "migrate_node" in lines[0]
    assert lines[1].startswith("[RESOLVED]")


def test_failures_are_classified(rx):
    rx.script("/x", 500, (429, {"Retry-After": "7"}), 400, 503)
    hook = WebhookNotifier(rx.url("/x"))
    one = [Notification("webhook", "open", incident())]
    r = hook.send(one)
    assert r.retry_from == 0 and r.retry_after_s is None and "HTTP 500" in r.error
    r = hook.send(one)
    assert r.retry_from == 0 and r.retry_after_s == 7.0
    r = hook.send(one)
    assert r.retry_from is None and 0 in r.rejected and "HTTP 400" in r.rejected[0]
    # A transient failure stops the batch so later items keep their order.
    r = hook.send(one * 3)
    assert r.delivered == [] and r.pending(3) == [0, 1, 2]


def test_an_endpoint_that_is_down_is_transient():
    r = WebhookNotifier(f"http://127.0.0.1:{free_port()}/x", timeout_s=2).send(
        [Notification("webhook", "open", incident())])
    assert r.retry_from == 0 and r.error


def test_retry_after_accepts_seconds_and_http_dates():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after("99999") == 3600.0


def test_secrets_never_reach_logs_reprs_or_errors(rx, tmp_path, caplog):
    rx.script("/services/" + SLACK_SECRET, (500, {}, SLACK_SECRET.encode()), 404)
    rx.script("/pd/" + ROUTING_KEY, (400, {}, f'{{"routing_key": "{ROUTING_KEY}"}}'.encode()))
    down = f"http://127.0.0.1:{free_port()}/services/{SLACK_SECRET}"
    notifiers = {"slack": SlackNotifier(rx.url("/services/" + SLACK_SECRET)),
                 "pagerduty": PagerDutyNotifier(ROUTING_KEY, rx.url("/pd/" + ROUTING_KEY)),
                 "webhook": WebhookNotifier(down, timeout_s=2)}
    outbox = Outbox(tmp_path / "o.sqlite")
    outbox.record([Notification(d, "open", incident()) for d in notifiers], {}, 0.0)
    caplog.set_level(logging.DEBUG)
    d = Dispatcher(outbox, notifiers, Backoff(base_s=0.0))
    for _ in range(3):
        d.drain()
    assert d.stats["retries"] >= 2 and d.stats["rejected"] >= 1
    shown = caplog.text + "".join(repr(n) for n in notifiers.values())
    shown += repr(build_notifiers(slack_webhook_url=down, pagerduty_routing_key=ROUTING_KEY))
    assert SLACK_SECRET not in shown and ROUTING_KEY not in shown
    assert "127.0.0.1" in caplog.text  # the endpoint is still named, by host only
    rejected = outbox._db.execute("SELECT reason FROM rejected").fetchall()
    assert rejected and all(ROUTING_KEY not in r[0] for r in rejected)
    outbox.close()


def test_no_destination_is_a_config_error():
    with pytest.raises(AlertingError, match="no destination"):
        build_notifiers()
