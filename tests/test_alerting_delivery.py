"""Delivery from the outbox: retries with backoff and Retry-After, order kept, 4xx dropped
to ``rejected``, nothing lost while an endpoint is down, across a restart."""

from __future__ import annotations

import random
import time

import pytest
from http_receiver import HttpReceiver

from failslow.alerting import (
    AlertingError,
    Backoff,
    Dispatcher,
    MemoryNotifier,
    Notification,
    Outbox,
    PagerDutyNotifier,
    WebhookNotifier,
)
from failslow.stack import free_port


def incident(iid="job0:slow_rank:r5:20", **kw):
    ev = {"v": 1, "kind": "incident", "ts": 100.0, "incident_id": iid, "job_id": "job0",
          "status": "open", "fault": "slow_rank", "severity": "critical", "onset_ts": 90.0,
          "detected_ts": 100.0, "slowdown_pct": 20.0, "rank": 5, "host": "h0"}
    ev.update(kw)
    return ev


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def outbox(tmp_path):
    box = Outbox(tmp_path / "notify.sqlite")
    yield box
    box.close()


def drain_until(d: Dispatcher, outbox: Outbox, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while outbox.pending() and time.monotonic() < deadline:
        d.drain()
        time.sleep(0.01)


def test_retries_5xx_and_429_until_delivered(outbox):
    with HttpReceiver() as rx:
        rx.script("/hook", 500, (429, {"Retry-After": "0"}), 503)
        outbox.record([Notification("webhook", "open", incident())], {}, 0.0)
        d = Dispatcher(outbox, {"webhook": WebhookNotifier(rx.url("/hook"))},
                       Backoff(base_s=0.01, cap_s=0.05))
        drain_until(d, outbox)
        assert outbox.pending() == 0
        assert [r.status for r in rx.received("/hook")] == [500, 429, 503, 200]
        assert d.stats["retries"] == 3 and d.stats["delivered"] == 1


def test_retry_after_is_honoured(outbox):
    clock = Clock()
    mem = MemoryNotifier("slack")
    mem.fail_next(1, retry_after_s=30.0)
    outbox.record([Notification("slack", "open", incident())], {}, clock.t)
    d = Dispatcher(outbox, {"slack": mem}, Backoff(base_s=1.0), clock=clock)
    assert d.drain() == 0
    assert outbox.head("slack").next_ts == pytest.approx(1030.0)
    clock.t = 1029.0
    assert d.drain() == 0 and mem.calls == 1  # not tried before Retry-After
    clock.t = 1030.5
    assert d.drain() == 1 and len(mem.sent) == 1


def test_backoff_grows_exponentially_with_jitter(outbox):
    clock = Clock()
    mem = MemoryNotifier("webhook")
    mem.fail_next(6)
    outbox.record([Notification("webhook", "open", incident())], {}, clock.t)
    d = Dispatcher(outbox, {"webhook": mem}, Backoff(base_s=2.0, cap_s=40.0), clock=clock,
                   seed=1)
    delays = []
    for _ in range(6):
        d.drain()
        head = outbox.head("webhook")
        delays.append(head.next_ts - clock.t)
        clock.t = head.next_ts
    for n, delay in enumerate(delays, start=1):
        full = min(40.0, 2.0 * 2 ** (n - 1))
        assert 0.5 * full <= delay <= full
    assert outbox.head("webhook").attempts == 6
    assert Backoff(2.0, 40.0).delay(3, random.Random(0)) != Backoff(2.0, 40.0).delay(
        3, random.Random(1))  # jittered
    d.drain()
    assert len(mem.sent) == 1 and outbox.pending() == 0


def test_a_resolve_never_overtakes_its_trigger(outbox):
    with HttpReceiver() as rx:
        rx.script("/pd", 502)
        pd = PagerDutyNotifier("k" * 32, rx.url("/pd"))
        outbox.record([Notification("pagerduty", "open", incident()),
                       Notification("pagerduty", "resolve", incident(status="resolved"))],
                      {}, 0.0)
        d = Dispatcher(outbox, {"pagerduty": pd}, Backoff(base_s=0.01, cap_s=0.02))
        drain_until(d, outbox)
        assert [b["event_action"] for b in rx.bodies("/pd")] == ["trigger", "resolve"]


def test_a_refused_notification_is_set_aside_and_the_rest_go_on(outbox):
    with HttpReceiver() as rx:
        rx.script("/hook", 400)
        outbox.record([Notification("webhook", "open", incident("a")),
                       Notification("webhook", "open", incident("b"))], {}, 0.0)
        d = Dispatcher(outbox, {"webhook": WebhookNotifier(rx.url("/hook"))})
        assert d.drain() == 1
        assert [b["incident_id"] for b in rx.bodies("/hook")] == ["b"]
        assert outbox.pending() == 0 and outbox.rejected_count() == 1 and d.stats["rejected"] == 1


def test_a_crashing_notifier_does_not_stop_the_others(outbox):
    class Broken(MemoryNotifier):
        def send(self, batch):
            raise ValueError("bug")

    good = MemoryNotifier("console")
    outbox.record([Notification("slack", "open", incident()),
                   Notification("console", "open", incident())], {}, 0.0)
    d = Dispatcher(outbox, {"slack": Broken("slack"), "console": good})
    d.drain()
    assert len(good.sent) == 1 and outbox.pending("slack") == 1 and d.stats["errors"] == 1


def test_endpoint_down_then_back_across_a_restart(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    box = Outbox(tmp_path / "notify.sqlite")
    box.record([Notification("webhook", "open", incident("a")),
                Notification("webhook", "resolve", incident("a", status="resolved")),
                Notification("webhook", "open", incident("b"))], {}, 0.0)
    d = Dispatcher(box, {"webhook": WebhookNotifier(url, timeout_s=2)}, Backoff(base_s=0.01))
    d.drain()
    d.drain()
    assert box.pending() == 3 and d.stats["delivered"] == 0
    box.close()  # the service stops (or dies) with the endpoint still down

    with HttpReceiver(port=port) as rx:
        box = Outbox(tmp_path / "notify.sqlite")
        assert box.pending() == 3 and box.head("webhook").attempts >= 1
        d = Dispatcher(box, {"webhook": WebhookNotifier(url)}, Backoff(base_s=0.01))
        drain_until(d, box)
        assert box.pending() == 0
        box.close()
        got = [(r.headers["X-Failslow-Action"], r.json()["incident_id"])
               for r in rx.received("/hook")]
    assert got == [("open", "a"), ("resolve", "a"), ("open", "b")]


def test_a_destination_no_longer_configured_keeps_its_rows(outbox):
    outbox.record([Notification("slack", "open", incident())], {}, 0.0)
    d = Dispatcher(outbox, {"console": MemoryNotifier("console")})
    assert d.drain() == 0 and outbox.pending("slack") == 1


def test_an_unusable_state_dir_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(AlertingError, match="outbox"):
        Outbox(tmp_path / "file" / "notify.sqlite")


class _Killed(BaseException):
    """Stands for the process dying (kill -9) at one instant: nothing after it runs."""


class _DyingPagerDuty(PagerDutyNotifier):
    """PagerDuty that dies just before posting its ``die_before``-th request."""

    def __init__(self, *args, die_before: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.die_before, self.posts = die_before, 0

    def headers(self, note):
        self.posts += 1
        if self.posts == self.die_before:
            raise _Killed
        return super().headers(note)


def test_a_kill_during_a_burst_pages_each_transition_once(tmp_path):
    # Ten triggers queued; the notify process dies right after PagerDuty accepted the
    # fourth. The next run must send only the six that were not accepted: the outbox
    # marks each notification as it is accepted, not a batch at the end.
    with HttpReceiver() as rx:
        box = Outbox(tmp_path / "notify.sqlite")
        box.record([Notification("pagerduty", "open", incident(f"job0:slow_rank:r{i}:20"))
                    for i in range(10)], {}, 0.0)
        pd = _DyingPagerDuty("0" * 32, url=rx.url("/enqueue"), die_before=5)
        with pytest.raises(_Killed):
            Dispatcher(box, {"pagerduty": pd}).drain()
        box.close()

        box = Outbox(tmp_path / "notify.sqlite")
        drain_until(Dispatcher(box, {"pagerduty": PagerDutyNotifier("0" * 32,
                                                                    url=rx.url("/enqueue"))}),
                    box)
        keys = [b["dedup_key"] for b in rx.bodies("/enqueue")]
        box.close()
    assert sorted(keys) == sorted(f"job0:slow_rank:r{i}:20" for i in range(10))
