"""Keeping a broker outage to a handful of log lines, and a stop that never hangs.

While Kafka is unreachable, aiokafka logs every failed connect, metadata refresh, fetch
and coordinator lookup: ~5,000 lines a minute from one worker (measured), which buries
the one line that matters and fills disks. ``RepeatFilter`` lets the first line of each
kind through, then holds its repeats for ``window_s`` and reports how many there were
when the next one is let through. A kind is the logger plus the message with its numbers
taken out (node ids, ports, addresses), so "connect to node 1 failed" and "... node 2
..." are one kind. Each held line is counted in ``suppressed`` (a metric).

``stop_deadline`` bounds a shutdown: faust's stop waits for the consumer and producer,
which wait for a broker that is gone. After ``timeout_s`` the process exits anyway; the
input it had not committed is read again by the next worker (at-least-once, and the
snapshots de-duplicate), so nothing acknowledged is lost.

>>> f = RepeatFilter(window_s=60.0, clock=lambda: 0.0)
>>> rec = lambda msg: logging.LogRecord("aiokafka", logging.ERROR, "", 0, msg, None, None)
>>> [f.filter(rec(f"connect to node {i} failed")) for i in range(3)]
[True, False, False]
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable

_NUMBERS = re.compile(r"\d+")
# Loggers whose lines repeat for as long as the broker is down.
NOISY = ("aiokafka", "kafka", "faust.transport", "mode")
# librdkafka's own lines (confluent-kafka clients' "logger" setting) go through logging
# under this name, so the same filter holds their repeats back.
RDKAFKA_LOG = logging.getLogger("kafka.rdkafka")


class RepeatFilter(logging.Filter):
    """Let the first record of a kind through per ``window_s``; count and summarize the rest."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 prefixes: tuple[str, ...] = NOISY,
                 on_suppress: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.on_suppress = on_suppress
        self.window_s = window_s
        self.clock = clock
        self.prefixes = prefixes
        self.suppressed = 0
        self._seen: dict[tuple[str, int, str], list[float | int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes) or record.levelno >= logging.CRITICAL:
            return True
        key = (record.name, record.levelno, _NUMBERS.sub("N", str(record.msg))[:120])
        now = self.clock()
        with self._lock:
            if len(self._seen) > 1000:   # a flood of distinct messages: start over
                self._seen.clear()
            seen = self._seen.get(key)
            if seen is not None and now - float(seen[0]) < self.window_s:
                seen[1] = int(seen[1]) + 1
                self.suppressed += 1
                if self.on_suppress is not None:
                    self.on_suppress()
                return False
            held = int(seen[1]) if seen is not None else 0
            self._seen[key] = [now, 0]
        if held:
            record.msg = f"{record.msg} [and {held} more like it in the last " \
                         f"{self.window_s:.0f} s]"
        return True


def install(window_s: float = 60.0, on_suppress: Callable[[], object] | None = None
            ) -> RepeatFilter:
    """Put one ``RepeatFilter`` on every handler of the root logger; returns it."""
    f = RepeatFilter(window_s, on_suppress=on_suppress)
    for handler in logging.getLogger().handlers:
        handler.addFilter(f)
    return f


def stop_deadline(timeout_s: float, exit_code: int, log: logging.Logger) -> threading.Timer:
    """Start a timer that ends the process with ``exit_code`` if it is still stopping after
    ``timeout_s`` seconds (daemon: a stop that finishes first simply lets it die)."""

    def expire() -> None:
        log.error("did not stop within %.0f s (is the broker unreachable?): exiting now; "
                  "uncommitted input will be read again by the next worker", timeout_s)
        logging.shutdown()
        os._exit(exit_code)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    return timer
