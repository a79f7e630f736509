"""Delivery from the outbox: per destination, oldest first, with backoff on failure.

A transient failure (5xx, 429, timeout, endpoint down) blocks that destination
until its next attempt: ``Retry-After`` when the endpoint gave one, else an
exponential backoff with jitter. Other destinations keep going. A permanent
refusal (4xx other than 429) moves that one notification to ``rejected`` and
the rest continue. Each notification is marked delivered in the outbox as soon as
its endpoint accepted it, so a process killed in a burst re-sends at most the one
that was in flight.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from failslow.alerting.base import Notification, Notifier, SendResult
from failslow.alerting.outbox import Head, Outbox

log = logging.getLogger("failslow.alerting")


@dataclass(frozen=True)
class Backoff:
    """Delay before attempt n+1 after n failures: ``min(cap_s, base_s * 2**(n-1))``,
    times a jitter factor drawn from [0.5, 1.0) so many senders do not retry in step.

    >>> Backoff(base_s=1.0, cap_s=8.0).delay(10, random.Random(0)) <= 8.0
    True
    """

    base_s: float = 1.0
    cap_s: float = 300.0

    def delay(self, attempts: int, rng: random.Random) -> float:
        raw = min(self.cap_s, self.base_s * 2.0 ** max(attempts - 1, 0))
        return raw * (0.5 + 0.5 * rng.random())


class Dispatcher:
    """Sends what the outbox holds through the notifiers; counts what happened in ``stats``."""

    def __init__(self, outbox: Outbox, notifiers: Mapping[str, Notifier],
                 backoff: Backoff | None = None, batch_size: int = 50,
                 clock: Callable[[], float] = time.time, seed: int | None = None) -> None:
        self.outbox = outbox
        self.notifiers = dict(notifiers)
        self.backoff = backoff or Backoff()
        self.batch_size = batch_size
        self.clock = clock
        self.stats: Counter[str] = Counter()
        self._rng = random.Random(seed)

    def drain(self, budget_s: float = 2.0) -> int:
        """Deliver what is due, for at most about ``budget_s`` seconds; returns how many
        notifications were delivered. Never raises for a failing endpoint."""
        start = self.clock()
        done = 0
        progress = True
        while progress and self.clock() - start < budget_s:
            progress = False
            for dest in self.outbox.destinations():
                n = self._drain_one(dest)
                done += n
                progress = progress or n > 0
        return done

    def next_due(self) -> float | None:
        """When the earliest waiting destination may be tried again (epoch seconds)."""
        heads = [self.outbox.head(d) for d in self.outbox.destinations() if d in self.notifiers]
        return min((h.next_ts for h in heads if h is not None), default=None)

    def _drain_one(self, dest: str) -> int:
        notifier = self.notifiers.get(dest)
        head = self.outbox.head(dest)
        # A destination no longer configured keeps its rows until it is configured again.
        if notifier is None or head is None or head.next_ts > self.clock():
            return 0
        batch = self.outbox.batch(dest, self.batch_size)
        sent = 0
        for note in batch:
            # One at a time, each marked in the outbox as soon as its endpoint accepted it:
            # a process killed in the middle of a burst re-sends at most the one in flight
            # (one page per transition), not every notification of the batch.
            try:
                result = notifier.send([note])
            except Exception as exc:  # a notifier bug must not stop the service: retry later
                log.exception("notifier %s failed", dest)
                self.stats["errors"] += 1
                attempts = head.attempts if note.key == head.key else 0
                self._defer(dest, note.key, attempts, None, f"{type(exc).__name__}")
                break
            if not self._settle(dest, note, result, head):
                break
            sent += bool(result.delivered)
        return sent

    def _settle(self, dest: str, note: Notification, result: SendResult, head: Head) -> bool:
        """Record what happened to one notification; False when its destination must wait."""
        if result.delivered:
            self.outbox.delivered([note.key])
            self.stats["delivered"] += 1
            self.stats[f"delivered.{dest}"] += 1
            return True
        if result.rejected:
            reason = next(iter(result.rejected.values()))
            log.warning("%s refused %s of incident %s for good: %s", dest, note.action,
                        note.event.get("incident_id"), reason)
            self.outbox.reject(note.key, reason, self.clock())
            self.stats["rejected"] += 1
            return True
        attempts = head.attempts if note.key == head.key else 0
        self._defer(dest, note.key, attempts, result.retry_after_s, result.error)
        return False

    def _defer(self, dest: str, key: int, attempts: int, retry_after_s: float | None,
               error: str | None) -> None:
        attempts += 1
        delay = retry_after_s if retry_after_s is not None else \
            self.backoff.delay(attempts, self._rng)
        self.outbox.defer(key, attempts, self.clock() + delay, error)
        self.stats["retries"] += 1
        log.warning("%s: delivery failed (attempt %d, next in %.1f s): %s", dest, attempts,
                    delay, error)

    def shutdown(self) -> None:
        for notifier in self.notifiers.values():
            notifier.shutdown()
