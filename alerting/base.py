"""The notifier contract, its result type, the alerting errors and secret redaction.

A notifier delivers an ordered batch of notifications to one destination:
``send(batch) -> SendResult`` and ``shutdown()``. It never raises for a failing
endpoint; it reports what was delivered, what the endpoint refused for good
(a 4xx other than 429) and from which item on the batch must be retried.

>>> r = SendResult(delivered=[0], retry_from=1, error="HTTP 503")
>>> r.pending(3)
[1, 2]
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from failslow.schema.errors import FailslowError

# What a notification announces about its incident.
OPEN, ESCALATE, RESOLVE, SUMMARY = "open", "escalate", "resolve", "summary"
ACTIONS = (OPEN, ESCALATE, RESOLVE, SUMMARY)


class AlertingError(FailslowError):
    """Bad alerting configuration (unknown destination, a route that would page on info)."""


class DeliveryError(AlertingError):
    """One request to an endpoint failed; ``retryable`` says whether to try again.

    The message never carries the endpoint's secret (URL path, routing key).
    """

    def __init__(self, message: str, retryable: bool, retry_after_s: float | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.status = status


@dataclass(frozen=True, slots=True)
class Notification:
    """One message for one destination about one incident change (or a rate-limit summary).

    ``event`` is the CONTRACT.md incident event as consumed (for ``summary``: the
    summary record built by the router). ``key`` is the outbox row id, 0 before
    the notification is stored.
    """

    destination: str
    action: str
    event: dict[str, Any]
    key: int = 0


@dataclass(slots=True)
class SendResult:
    """What happened to a batch, by index into it.

    ``retry_from``: the first item that hit a transient failure (5xx, 429,
    timeout, connection refused); it and every later item were not delivered
    and must be retried, in order. ``retry_after_s``: the endpoint's Retry-After,
    seconds, when it gave one. ``error``: the redacted reason of the last failure.
    """

    delivered: list[int] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)
    retry_from: int | None = None
    retry_after_s: float | None = None
    error: str | None = None

    def pending(self, size: int) -> list[int]:
        """Indexes of the batch that still have to be delivered."""
        return [] if self.retry_from is None else list(range(self.retry_from, size))


class Notifier(Protocol):
    """One destination. ``name`` is the destination name used by the routing policy."""

    name: str

    def send(self, batch: list[Notification]) -> SendResult: ...

    def shutdown(self) -> None: ...


def redact_url(url: str | None) -> str:
    """Scheme and host only: webhook URLs carry their secret in the path and query."""
    if not url:
        return "<unset>"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/***"


def scrub(text: str, secrets: tuple[str | None, ...]) -> str:
    """``text`` with every occurrence of each secret (and each URL's path) replaced by ***."""
    for secret in secrets:
        if not secret:
            continue
        text = text.replace(secret, "***")
        parts = urlsplit(secret)
        # An endpoint may echo its path, or one token of it, back in an error body.
        pieces = [parts.path, parts.path.strip("/"), parts.query,
                  *(seg for seg in parts.path.split("/") if len(seg) >= 8)]
        for piece in sorted(filter(None, pieces), key=len, reverse=True):
            if len(piece) > 1:
                text = text.replace(piece, "***")
    # A routing key or token echoed back by an endpoint in some other form.
    return re.sub(r"\b[0-9a-fA-F]{32}\b", "***", text)


class MemoryNotifier:
    """Keeps what it is sent; for tests. ``fail_next(n)`` makes the next n items fail
    transiently (``retry_after_s`` as an endpoint's Retry-After), ``reject_next(n)``
    refuses them for good."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.sent: list[Notification] = []
        self.calls = 0
        self._lock = threading.Lock()
        self._fail = 0
        self._reject = 0
        self._retry_after: float | None = None
        self.closed = False

    def fail_next(self, n: int, retry_after_s: float | None = None) -> None:
        with self._lock:
            self._fail, self._retry_after = n, retry_after_s

    def reject_next(self, n: int) -> None:
        with self._lock:
            self._reject = n

    def send(self, batch: list[Notification]) -> SendResult:
        result = SendResult()
        with self._lock:
            self.calls += 1
            for i, note in enumerate(batch):
                if self._fail > 0:
                    self._fail -= 1
                    result.retry_from, result.retry_after_s = i, self._retry_after
                    result.error = "simulated transient failure"
                    break
                if self._reject > 0:
                    self._reject -= 1
                    result.rejected[i] = "simulated rejection"
                    continue
                self.sent.append(note)
                result.delivered.append(i)
        return result

    def shutdown(self) -> None:
        self.closed = True
