"""`failslow notify` end to end: real incidents from the real Tansu broker, delivered to a
local HTTP receiver; bad records to dead letters; offsets committed; nothing lost while
an endpoint is down, across a restart; SIGTERM stops the command cleanly."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from http_receiver import HttpReceiver
from waiting import wait_until

from failslow.alerting import (
    Backoff,
    ConsoleNotifier,
    NotifyService,
    PagerDutyNotifier,
    SlackNotifier,
    WebhookNotifier,
)
from failslow.schema import encode
from failslow.stack import free_port

ROOT = Path(__file__).resolve().parents[1]


def incident(iid, job="job0", **kw):
    ev = {"v": 1, "kind": "incident", "ts": 100.0, "incident_id": iid, "job_id": job,
          "status": "open", "fault": "slow_rank", "severity": "warning", "onset_ts": 90.0,
          "detected_ts": 100.0, "slowdown_pct": 20.0, "rank": 5, "host": "h0", "gpu": 5,
          "root_cause": "gpu_thermal", "mitigation": "rebalance_microbatches"}
    ev.update(kw)
    return ev


def produce(bootstrap, topic, records):
    p = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        p.produce(topic, key=key.encode(), value=value)
    assert p.flush(10) == 0


def read_raw(bootstrap, topic, n, timeout=15.0):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        msg = c.poll(0.2)
        if msg is not None and not msg.error():
            out.append(msg)
    c.close()
    return out


class Running:
    """A NotifyService in a thread, stopped (and joined) on exit."""

    def __init__(self, svc: NotifyService) -> None:
        self.svc, self.stop = svc, threading.Event()
        self.thread = threading.Thread(target=svc.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> NotifyService:
        self.thread.start()
        assert self.svc.ready.wait(10)
        return self.svc

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_incidents_from_kafka_reach_every_destination(broker, topics, tmp_path):
    a = "job0:slow_rank:r5:20"
    records = [
        ("job0", encode(incident(a))),
        ("job0", encode(incident(a, slowdown_pct=24.0))),          # update: silent
        ("job0", encode(incident(a, severity="critical"))),        # escalation: pages
        ("job1", encode(incident("job1:job_slowdown::7", job="job1", fault="job_slowdown",
                                 severity="info", rank=None, gpu=None, host=None))),
        ("job2", b"not json at all"),
        ("job2", orjson.dumps({"v": 1, "kind": "incident", "ts": 1.0})),
        ("job2", encode([incident("job2:slow_rank:r1:3", job="job2", rank=1),
                         {**incident("job2:x", job="job2"), "severity": "urgent"}])),
        ("job0", encode(incident(a, severity="critical", status="resolved", resolved_ts=300.0))),
    ]
    produce(broker.bootstrap, topics.for_kind("incident"), records)
    out = io.StringIO()
    with HttpReceiver() as rx:
        notifiers = {"slack": SlackNotifier(rx.url("/slack/T1/B1/secret")),
                     "pagerduty": PagerDutyNotifier("k" * 32, rx.url("/pd")),
                     "webhook": WebhookNotifier(rx.url("/hook")),
                     "console": ConsoleNotifier(out)}
        svc = NotifyService(broker.bootstrap, topics, notifiers, tmp_path,
                            group_id=f"notify-{topics.prefix}")
        with Running(svc):
            rx.wait_for(5, "/hook")
            rx.wait_for(4, "/slack/T1/B1/secret")
            rx.wait_for(2, "/pd")
            wait_until(lambda: svc.stats["deadletters"] >= 3, what="dead letters")
        pd = rx.bodies("/pd")
        slack = [b["text"] for b in rx.bodies("/slack/T1/B1/secret")]
        hook = [(r.headers["X-Failslow-Action"], r.json()["incident_id"])
                for r in rx.received("/hook")]

    assert [(b["event_action"], b["dedup_key"]) for b in pd] == [("trigger", a), ("resolve", a)]
    about_a = [t for t in slack if a in t]
    assert len(slack) == 4 and len(about_a) == 3
    assert "[WARNING]" in about_a[0] and "ESCALATED CRITICAL" in about_a[1]
    assert "RESOLVED" in about_a[2]
    assert ("open", "job2:slow_rank:r1:3") in hook and ("open", "job1:job_slowdown::7") in hook
    assert [x for x in hook if x[1] == a] == [("open", a), ("escalate", a), ("resolve", a)]
    assert len(hook) == 5 and len(out.getvalue().splitlines()) == 5
    assert svc.stats["deadletters"] == 3 and svc.stats["outbox_pending"] == 0

    dead = [orjson.loads(m.value()) for m in read_raw(broker.bootstrap, topics.deadletter, 3)]
    assert sorted(d["error"].split(":")[0] for d in dead) == ["[1] incident.severity",
                                                              "incident.incident_id", "value"]
    assert all(d["topic"] == topics.for_kind("incident") for d in dead)
    assert "not json at all" in [d["raw"] for d in dead]

    # Every consumed offset was committed: a new member of the group starts at the end.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"notify-{topics.prefix}"})
    committed = c.committed([TopicPartition(topics.for_kind("incident"), p) for p in range(4)],
                            timeout=10)
    c.close()
    assert sum(max(tp.offset, 0) for tp in committed) == len(records)


def test_nothing_lost_while_the_endpoint_is_down_across_a_restart(broker, topics, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    group = f"notify-{topics.prefix}"
    topic = topics.for_kind("incident")
    a = "job0:slow_host:h3:9"

    def service():
        return NotifyService(broker.bootstrap, topics,
                             {"webhook": WebhookNotifier(url, timeout_s=2)}, tmp_path,
                             group_id=group, backoff=Backoff(base_s=0.05, cap_s=0.2),
                             flush_timeout_s=1.0)

    produce(broker.bootstrap, topic, [("job0", encode(incident(a, fault="slow_host")))])
    with Running(service()) as svc:
        wait_until(lambda: svc.stats["queued"] == 1 and svc.stats["retries"] >= 1,
                   what="a retry")
    assert svc.stats["outbox_pending"] == 1 and svc.stats["delivered"] == 0

    # While nobody listens, the incident resolves; then the endpoint and the service return.
    produce(broker.bootstrap, topic, [("job0", encode(incident(a, fault="slow_host",
                                                               status="resolved")))])
    with HttpReceiver(port=port) as rx:
        with Running(service()) as svc2:
            rx.wait_for(2, "/hook")
            wait_until(lambda: svc2.stats["outbox_pending"] == 0, what="an empty outbox")
        # The service has stopped: a duplicate, if it sent one, is already here.
        got = [(r.headers["X-Failslow-Action"], r.json()["incident_id"])
               for r in rx.received("/hook")]
    assert got == [("open", a), ("resolve", a)]
    assert svc2.stats["consumed"] == 1  # the first run committed what it had stored


def test_the_command_stops_cleanly_on_sigterm(broker, topics, tmp_path):
    env = {**os.environ, "FAILSLOW_BOOTSTRAP": broker.bootstrap,
           "FAILSLOW_TOPIC_PREFIX": topics.prefix, "FAILSLOW_HOME": str(tmp_path)}
    for var in ("FAILSLOW_SLACK_WEBHOOK_URL", "FAILSLOW_PAGERDUTY_ROUTING_KEY",
                "FAILSLOW_WEBHOOK_URL"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "failslow.cli", "notify", "--console"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        produce(broker.bootstrap, topics.for_kind("incident"),
                [("job0", encode(incident("job0:slow_rank:r5:20", severity="critical")))])
        line = proc.stdout.readline()
        assert line.startswith("[CRITICAL] slow_rank in job0: rank 5")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "1 delivered" in err and "0 left in the outbox" in err
    assert (tmp_path / "notify" / "notify.sqlite").exists()


@pytest.mark.parametrize("argv,reason", [
    ([], "no destination"),
    (["--console", "--route", "info=pagerduty"], "never page"),
])
def test_the_command_refuses_bad_configuration(argv, reason, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_")}
    env["FAILSLOW_HOME"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-m", "failslow.cli", "notify", *argv], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and reason in r.stderr
    assert r.stderr.startswith("failslow notify:") and len(r.stderr.strip().splitlines()) == 1
