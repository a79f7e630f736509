"""JSON over HTTP POST with the stdlib, and the failure classification every HTTP
notifier shares: 2xx delivered; 429, 5xx, timeouts and connection errors are
transient (retry, honouring Retry-After); any other status is a permanent refusal.
"""

from __future__ import annotations

import abc
import email.utils
import http.client
import logging
import time
import urllib.error
import urllib.request
from typing import Any

import orjson

from failslow.alerting.base import DeliveryError, Notification, SendResult, redact_url, scrub

log = logging.getLogger("failslow.alerting")

MAX_RETRY_AFTER_S = 3600.0
USER_AGENT = "failslow-notify/1"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), capped at 1 h.

    >>> parse_retry_after("7")
    7.0
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = when - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def post_json(url: str, body: Any, timeout_s: float, headers: dict[str, str] | None = None,
              secrets: tuple[str | None, ...] = ()) -> int:
    """POST ``body`` as JSON; return the 2xx status or raise DeliveryError (redacted)."""
    data = orjson.dumps(body)
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": USER_AGENT, **(headers or {})})
    where = redact_url(url)
    secrets = (url, *secrets)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        detail = scrub(_read_snippet(exc), secrets)
        status = exc.code
        retryable = status == 429 or status >= 500
        retry_after = parse_retry_after(exc.headers.get("Retry-After")) if exc.headers else None
        raise DeliveryError(f"{where}: HTTP {status} {detail}".rstrip(), retryable,
                            retry_after, status) from None
    except urllib.error.URLError as exc:
        reason = scrub(str(exc.reason), secrets)
        raise DeliveryError(f"{where}: {reason}", retryable=True) from None
    except (TimeoutError, http.client.HTTPException, OSError) as exc:
        reason = scrub(f"{type(exc).__name__} {exc}", secrets)
        raise DeliveryError(f"{where}: {reason}", retryable=True) from None


def _read_snippet(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read(200).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


class HttpNotifier(abc.ABC):
    """Posts one JSON document per notification, in order; subclasses build the body.

    A transient failure stops the batch (later items wait, so a resolve never
    overtakes its trigger); a permanent refusal drops only that item.
    """

    name = "http"

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self._url = url
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={redact_url(self._url)!r})"

    def _secrets(self) -> tuple[str | None, ...]:
        return (self._url,)

    @abc.abstractmethod
    def body(self, note: Notification) -> Any:
        """The JSON document to post for one notification."""

    def headers(self, note: Notification) -> dict[str, str]:
        return {}

    def send(self, batch: list[Notification]) -> SendResult:
        result = SendResult()
        for i, note in enumerate(batch):
            try:
                post_json(self._url, self.body(note), self.timeout_s, self.headers(note),
                          self._secrets())
            except DeliveryError as exc:
                result.error = str(exc)
                if exc.retryable:
                    result.retry_from, result.retry_after_s = i, exc.retry_after_s
                    break
                result.rejected[i] = str(exc)
                continue
            result.delivered.append(i)
        return result

    def shutdown(self) -> None:
        """Nothing to release: every request opens and closes its own connection."""
        return None
