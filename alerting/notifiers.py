"""The destinations: Slack incoming webhook, PagerDuty Events API v2, a generic JSON
webhook and the console. Each turns one notification into one request (or line).

Secrets (webhook URLs, the routing key) live in private attributes, are left out
of ``repr`` and are scrubbed from every error message.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from failslow.alerting.base import (
    RESOLVE,
    SUMMARY,
    AlertingError,
    Notification,
    Notifier,
    SendResult,
    redact_url,
)
from failslow.alerting.format import (
    acted,
    console_line,
    cost,
    headline,
    mitigation,
    summary_text,
    timeline,
    utc,
    where,
)
from failslow.alerting.transport import HttpNotifier

SLACK, PAGERDUTY, WEBHOOK, CONSOLE = "slack", "pagerduty", "webhook", "console"
DESTINATIONS = (CONSOLE, SLACK, PAGERDUTY, WEBHOOK)

_EMOJI = {"critical": ":red_circle:", "warning": ":large_orange_circle:",
          "info": ":information_source:"}
# PagerDuty's payload.summary is limited to 1024 characters.
PD_SUMMARY_MAX = 1024
# One alert in PagerDuty collects every rate-limit summary, acknowledged once.
PD_SUMMARY_DEDUP_KEY = "failslow:rate-limited"


class SlackNotifier(HttpNotifier):
    """Slack incoming webhook: a ``text`` fallback plus blocks with the details."""

    name = SLACK

    def body(self, note: Notification) -> dict[str, Any]:
        ev = note.event
        if note.action == SUMMARY:
            text = f":warning: {summary_text(ev)}"
            return {"text": text, "blocks": [_section(text)]}
        emoji = ":white_check_mark:" if note.action == RESOLVE else _EMOJI.get(
            str(ev.get("severity")), ":grey_question:")
        title = f"{emoji} {headline(ev, note.action)}"
        lines = [f"*Where:* {where(ev)}",
                 f"*Root cause:* {ev.get('root_cause') or 'unknown'}",
                 f"*Job slowdown:* +{float(ev.get('slowdown_pct') or 0.0):.1f}%"]
        priced = cost(ev)
        if priced:
            lines.append(f"*Cost:* {priced} (world size x extra step time)")
        fix = mitigation(ev)
        if fix and note.action != RESOLVE:
            lines.append(f"*Mitigation:* {fix}")
        done = acted(ev)
        if done:
            lines.append(f"*Done:* {done}")
        lines.append(f"*When:* {timeline(ev)}")
        lines.append(f"*Incident:* `{ev.get('incident_id')}`")
        text = title + "\n" + "\n".join(lines)
        return {"text": text, "blocks": [_section(f"*{title}*"), _section("\n".join(lines))]}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}


class PagerDutyNotifier(HttpNotifier):
    """PagerDuty Events API v2: ``trigger`` on open/escalate, ``resolve`` on resolve,
    ``dedup_key`` = incident_id so PagerDuty folds every change into one alert."""

    name = PAGERDUTY

    def __init__(self, routing_key: str, url: str = "https://events.pagerduty.com/v2/enqueue",
                 timeout_s: float = 5.0) -> None:
        super().__init__(url, timeout_s)
        self._routing_key = routing_key

    def __repr__(self) -> str:
        return f"PagerDutyNotifier(url={redact_url(self._url)!r}, routing_key='***')"

    def _secrets(self) -> tuple[str | None, ...]:
        return (self._url, self._routing_key)

    def body(self, note: Notification) -> dict[str, Any]:
        ev = note.event
        if note.action == SUMMARY:
            return {"routing_key": self._routing_key, "event_action": "trigger",
                    "dedup_key": PD_SUMMARY_DEDUP_KEY,
                    "payload": {"summary": summary_text(ev)[:PD_SUMMARY_MAX],
                                "source": "failslow", "severity": "warning",
                                "custom_details": ev}}
        if note.action == RESOLVE:
            return {"routing_key": self._routing_key, "event_action": "resolve",
                    "dedup_key": ev["incident_id"]}
        details = {k: v for k, v in ev.items() if k not in ("v", "kind") and v is not None}
        fix = mitigation(ev)
        if fix:
            details["mitigation_text"] = fix
        done = acted(ev)
        if done:
            details["done"] = done
        details["timeline"] = timeline(ev)
        return {
            "routing_key": self._routing_key,
            "event_action": "trigger",
            "dedup_key": ev["incident_id"],
            "client": "failslow",
            "payload": {
                "summary": headline(ev, note.action)[:PD_SUMMARY_MAX],
                "source": str(ev.get("host") or ev.get("job_id")),
                "severity": ev.get("severity", "warning"),
                "timestamp": utc(ev.get("detected_ts")).replace(" ", "T"),
                "component": where(ev),
                "group": str(ev.get("job_id")),
                "class": str(ev.get("fault")),
                "custom_details": details,
            },
        }


class WebhookNotifier(HttpNotifier):
    """A generic JSON webhook: the incident event exactly as consumed; what changed goes
    in the ``X-Failslow-Action`` header (open, escalate, resolve, summary)."""

    name = WEBHOOK

    def body(self, note: Notification) -> dict[str, Any]:
        return note.event

    def headers(self, note: Notification) -> dict[str, str]:
        return {"X-Failslow-Action": note.action}


class ConsoleNotifier:
    """One readable line per incident change, on a text stream (stdout by default)."""

    name = CONSOLE

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, batch: list[Notification]) -> SendResult:
        stream = self._stream or sys.stdout
        with self._lock:
            for note in batch:
                stream.write(console_line(note.action, note.event) + "\n")
            stream.flush()
        return SendResult(delivered=list(range(len(batch))))

    def shutdown(self) -> None:
        """The stream belongs to the caller; only flush it."""
        (self._stream or sys.stdout).flush()


def build_notifiers(slack_webhook_url: str | None = None,
                    pagerduty_routing_key: str | None = None,
                    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue",
                    webhook_url: str | None = None, console: bool | TextIO = False,
                    timeout_s: float = 5.0) -> dict[str, Notifier]:
    """The configured destinations by name; an unset endpoint means that destination is off.

    ``console``: True for stdout, or a stream. Raises AlertingError when nothing is on.
    """
    out: dict[str, Notifier] = {}
    if console:
        out[CONSOLE] = ConsoleNotifier(None if console is True else console)
    if slack_webhook_url:
        out[SLACK] = SlackNotifier(slack_webhook_url, timeout_s)
    if pagerduty_routing_key:
        out[PAGERDUTY] = PagerDutyNotifier(pagerduty_routing_key, pagerduty_url, timeout_s)
    if webhook_url:
        out[WEBHOOK] = WebhookNotifier(webhook_url, timeout_s)
    if not out:
        raise AlertingError("no destination: set FAILSLOW_SLACK_WEBHOOK_URL, "
                            "FAILSLOW_PAGERDUTY_ROUTING_KEY or FAILSLOW_WEBHOOK_URL, "
                            "or pass --console")
    return out
