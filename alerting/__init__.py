"""Incidents -> Slack, PagerDuty, a JSON webhook or the console: routing by severity,
de-duplication, rate limits, retries with backoff and a durable outbox.

>>> from alerting import MemoryNotifier, Policy, Router
>>> r = Router(Policy(), enabled=["webhook", "pagerduty"])
>>> ev = {"incident_id": "j:job_slowdown::3", "status": "open", "severity": "info",
...       "fault": "job_slowdown"}
>>> [n.destination for n in r.decide(ev, now=0.0)]     # info never pages
['webhook']
"""

from failslow.alerting.base import (
    ACTIONS,
    AlertingError,
    DeliveryError,
    MemoryNotifier,
    Notification,
    Notifier,
    SendResult,
    redact_url,
)
from failslow.alerting.dispatch import Backoff, Dispatcher
from failslow.alerting.notifiers import (
    DESTINATIONS,
    ConsoleNotifier,
    PagerDutyNotifier,
    SlackNotifier,
    WebhookNotifier,
    build_notifiers,
)
from failslow.alerting.outbox import Outbox
from failslow.alerting.router import DEFAULT_RATES, DEFAULT_ROUTES, Policy, RateLimit, Router
from failslow.alerting.service import NotifyService

__all__ = [
    "ACTIONS",
    "DEFAULT_RATES",
    "DEFAULT_ROUTES",
    "DESTINATIONS",
    "AlertingError",
    "Backoff",
    "ConsoleNotifier",
    "DeliveryError",
    "Dispatcher",
    "MemoryNotifier",
    "Notification",
    "Notifier",
    "NotifyService",
    "Outbox",
    "PagerDutyNotifier",
    "Policy",
    "RateLimit",
    "Router",
    "SendResult",
    "SlackNotifier",
    "WebhookNotifier",
    "build_notifiers",
    "redact_url",
]
