"""The host agent's loop: run the samplers every interval, publish, report once a minute."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Sampler(Protocol):
    name: str

    def sample(self) -> list[dict]: ...


class Agent:
    """Samples every ``interval_s`` seconds (on a fixed grid, not drifting with the work) and
    publishes; logs one line per ``report_s`` with counts per sampler and the publisher's."""

    def __init__(self, samplers: list[Sampler], publisher: Any, interval_s: float = 1.0,
                 report_s: float = 60.0) -> None:
        self.samplers = samplers
        self.publisher = publisher
        self.interval_s = interval_s
        self.report_s = report_s
        self.cycles = 0
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self._window: Counter[str] = Counter()

    def cycle(self) -> int:
        """Sample every sampler once and publish; returns the number of events."""
        events: list[dict] = []
        got_by: Counter[str] = Counter()
        for s in self.samplers:
            try:
                got = s.sample()
            except Exception as exc:  # one broken source must not stop the others
                self.errors[s.name] += 1
                if self.errors[s.name] == 1 or self.errors[s.name] % 60 == 0:
                    log.exception("sampler %s failed (%d times): %s", s.name,
                                  self.errors[s.name], exc)
                continue
            got_by[s.name] += len(got)
            events += got
        if events:
            self.publisher.publish(events)
        self._window.update(got_by)
        self.counts.update(got_by)
        self.cycles += 1
        return len(events)

    def run(self, stop: Any, cycles: int | None = None) -> None:
        """Loop until ``stop.wait`` says stop (a ``lifecycle.Shutdown`` or threading.Event)."""
        next_tick = time.monotonic()
        next_report = next_tick + self.report_s
        while cycles is None or self.cycles < cycles:
            self.cycle()
            now = time.monotonic()
            if now >= next_report:
                self.report()
                next_report = now + self.report_s
            next_tick += self.interval_s
            if next_tick < now:  # fell behind (a slow sample): skip, do not burst
                next_tick = now + self.interval_s
            if stop.wait(max(0.0, next_tick - time.monotonic())):
                break

    def report(self) -> None:
        per = " ".join(f"{k}={v}" for k, v in sorted(self._window.items())) or "none"
        st = self.publisher.stats
        log.info("collect: last %.0f s: events %s; publisher delivered=%d pending=%d "
                 "spooled=%d dropped=%d failed=%d; sampler errors=%d",
                 self.report_s, per, st["delivered"], st["pending"], st["spooled"],
                 st["dropped"], st["failed"], sum(self.errors.values()))
        self._window.clear()
