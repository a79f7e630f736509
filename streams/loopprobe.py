"""How long the worker's event loop goes without yielding (issue 16).

The agents, the timers, the sends and the rebalance callbacks share one asyncio loop:
while one of them runs synchronous work, the others wait, and the group's rebalance
(whose callbacks run on this loop) waits with them. ``LoopProbe`` sleeps 0.05 s again
and again and records how late it wakes: the longest block and the 99th percentile of
each minute go to the log, every wake to ``failslow_stream_loop_blocked_seconds``, and
the longest of the last minute to ``failslow_stream_loop_blocked_max_seconds``. One
probe watches the worker's loop (``loop="worker"``), one the loop of faust's consumer
thread (``loop="consumer"``: aiokafka's fetches and the group heartbeats run there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from failslow.streams.metrics import Metrics

log = logging.getLogger("failslow.worker")
PERIOD_S = 0.05
WINDOW_S = 60.0


class LoopProbe:
    def __init__(self, metrics: Metrics, name: str = "worker", period_s: float = PERIOD_S,
                 window_s: float = WINDOW_S) -> None:
        self.name = name
        self.hist = metrics.loop_blocked.labels(name)
        self.gauge = metrics.loop_blocked_max.labels(name)
        self.period_s = period_s
        self.window_s = window_s
        self.recent: deque[tuple[float, float]] = deque()  # (when, how late) in the window
        self.minute: list[float] = []   # how late, since the last log line
        self.logged = time.monotonic()
        self.worst = 0.0   # since the start

    def record(self, late: float, now: float) -> None:
        """One wake ``late`` seconds after it was due, at monotonic ``now``."""
        late = max(0.0, late)
        self.worst = max(self.worst, late)
        self.hist.observe(late)
        recent = self.recent
        recent.append((now, late))
        while recent and recent[0][0] < now - self.window_s:
            recent.popleft()
        self.gauge.set(max(x for _, x in recent))
        self.minute.append(late)
        if now - self.logged >= self.window_s:
            line = self.summary(now)
            log.info("%s", line)

    def summary(self, now: float) -> str:
        """The minute's line (and start a new minute)."""
        lates = sorted(self.minute)
        span, self.logged, self.minute = now - self.logged, now, []
        p99 = lates[min(len(lates) - 1, int(0.99 * len(lates)))] if lates else 0.0
        return (f"event loop blocked ({self.name}): longest {lates[-1] if lates else 0.0:.3f} s, p99 "
                f"{p99:.3f} s over {len(lates)} wakes in {span:.0f} s")

    async def run(self) -> None:
        """Sleep ``period_s`` and record the delay, for as long as the worker runs."""
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.period_s)
            now = time.monotonic()
            self.record(now - t0 - self.period_s, now)
