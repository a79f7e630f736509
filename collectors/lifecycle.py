"""Clean stops: SIGTERM / SIGINT become an Event the collector loop watches.

The loop then returns normally and its ``finally`` closes the Publisher, which
flushes (and spools what the broker did not take), so a stop never loses
acknowledged samples. Previous handlers are restored on exit.

>>> with Shutdown() as stop:          # doctest: +SKIP
...     while not stop.wait(1.0):
...         publish(sample())
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)


class Shutdown:
    """Context manager: while active, the given signals set ``event`` instead of killing."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = signals
        self.event = threading.Event()
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received is None:
            log.info("received %s: flushing and stopping", signal.Signals(signum).name)
        self.received = signum
        self.event.set()

    def __enter__(self) -> Shutdown:
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True as soon as a stop was requested."""
        return self.event.wait(timeout)
