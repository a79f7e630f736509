"""What was done reaches people (issue 32): the Slack / PagerDuty / console text of an
incident carries ``evidence.action``; a configured drain command receives exactly one
call per escalation, none in dry run (a real command and a real local HTTP receiver)."""

from __future__ import annotations

import shlex
import sys

import pytest
from http_receiver import HttpReceiver

from failslow.alerting import Notification, PagerDutyNotifier, SlackNotifier
from failslow.alerting.drain import Drainer
from failslow.alerting.format import console_line
from failslow.models.actions import ActionPlanner, MitigationConfig

DONE = "rebalanced: rank 5 takes 31% less; job step 0.41 s -> 0.27 s"


def incident(**kw):
    ev = {"v": 1, "kind": "incident", "ts": 1_700_000_100.0, "incident_id": "job0:slow_rank:r5:20",
          "job_id": "job0", "status": "open", "fault": "slow_rank", "severity": "critical",
          "onset_ts": 1_700_000_000.0, "detected_ts": 1_700_000_012.5, "slowdown_pct": 31.25,
          "rank": 5, "host": "h0", "gpu": 5, "root_cause": "gpu_thermal",
          "mitigation": "rebalance_microbatches", "evidence": {"action": DONE}}
    ev.update(kw)
    return ev


def test_slack_pagerduty_and_console_say_what_was_done():
    with HttpReceiver() as rx:
        SlackNotifier(rx.url("/s")).send([
            Notification("slack", "resolve", incident(status="resolved",
                                                      resolved_ts=1_700_000_400.0))])
        PagerDutyNotifier("key", rx.url("/pd")).send([Notification("pagerduty", "open",
                                                                   incident())])
        assert f"*Done:* {DONE}" in rx.bodies("/s")[0]["text"]
        assert rx.bodies("/pd")[0]["payload"]["custom_details"]["done"] == DONE
    assert f"done: {DONE}" in console_line("open", incident())
    assert "done:" not in console_line("open", incident(evidence={}))


def _escalation(host: str, severity: str = "warning") -> dict:
    return incident(incident_id=f"job0:slow_rank:{host}:20", host=host, severity=severity,
                    mitigation="migrate_node", root_cause="gpu_errors", evidence={})


@pytest.fixture
def drain_cmd(tmp_path):
    log = tmp_path / "drained.log"
    script = "import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n')"
    cmd = shlex.join([sys.executable, "-c", script, str(log)]) + " {host} reason={reason}"
    return cmd, log


def test_a_drain_command_runs_once_per_escalation(drain_cmd):
    cmd, log = drain_cmd
    cfg = MitigationConfig(mode="auto", drain_command=cmd)
    planner, drainer = ActionPlanner(cfg), Drainer(command=cmd)
    # each incident escalates, is updated, and its action is delivered twice (at least once)
    for inc in (_escalation("h3"), _escalation("h3", "critical"), _escalation("h7")):
        for action in planner.on_incident(inc):
            drainer.handle(action)
            drainer.handle(dict(action))
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["h3", "h7"]
    assert "reason=migrate_node: gpu_errors on h3" in lines[0]
    assert drainer.stats["executed"] == 2 and drainer.stats["repeated"] == 2


def test_no_call_in_dry_run(drain_cmd):
    cmd, log = drain_cmd
    drainer = Drainer(command=cmd)
    for cfg in (MitigationConfig(mode="auto"),                       # no command configured
                MitigationConfig(mode="suggest", drain_command=cmd)):  # not opted in
        for action in ActionPlanner(cfg).on_incident(_escalation("h3")):
            assert action["mode"] == "dry_run"
            assert drainer.handle(action) is False
    assert not log.exists() and drainer.stats["dry_run"] == 2


def test_the_webhook_gets_the_action_once_and_a_restart_remembers(tmp_path):
    state = tmp_path / "drained"
    cfg = MitigationConfig(mode="auto", drain_webhook="http://x")
    (action,) = ActionPlanner(cfg).on_incident(_escalation("h3"))
    with HttpReceiver() as rx:
        assert Drainer(webhook=rx.url("/drain"), state_file=state).handle(action)
        assert not Drainer(webhook=rx.url("/drain"), state_file=state).handle(action)
        (req,) = rx.received("/drain")
        assert req.json()["host"] == "h3" and req.json()["type"] == "drain_host"


@pytest.mark.integration
def test_notify_s_drain_thread_executes_each_escalation_once_from_the_topic(broker, topics,
                                                                           drain_cmd):
    import threading
    import time

    from failslow.alerting.drain import run_drains
    from failslow.collectors.action_sources import KafkaActionSource
    from failslow.collectors.publisher import Publisher

    cmd, log = drain_cmd
    planner = ActionPlanner(MitigationConfig(mode="auto", drain_command=cmd))
    drains = [a for inc in (_escalation("h3"), _escalation("h9"))
              for a in planner.on_incident(inc)]
    pub = Publisher(broker.bootstrap, topics)
    pub.publish(drains + drains)          # delivered twice: at least once
    assert pub.flush(10) == 0
    pub.close()
    stop = threading.Event()
    source = KafkaActionSource(broker.bootstrap, None, topic=topics.for_kind("action"))
    thread = threading.Thread(target=run_drains, args=(source, Drainer(command=cmd), stop))
    thread.start()
    deadline = time.monotonic() + 30
    while (not log.exists() or len(log.read_text().splitlines()) < 2) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    stop.set()
    thread.join()
    source.close()
    assert sorted(line.split()[0] for line in log.read_text().splitlines()) == ["h3", "h9"]
