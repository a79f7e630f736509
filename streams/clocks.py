"""Producer clocks far ahead of the worker's (issue 33): contained to their own events.

Event time comes from the producers' clocks, and one partition carries many producers.
An event stamped far ahead moved the whole partition's time: the watermark went with it
(every later event of every job there was handed over out of time order), the Detector's
clock jumped past every job's ``--job-idle`` (their open incidents resolved "job ended",
then re-opened under a new id: a second page), and the snapshots carried it all over
restarts. No event can have happened after the worker reads it, so the worker's own
clock is the reference, whatever the other producers' clocks or a backlog say:

- ahead by more than ``warn_s`` (``CLOCK_WARN_S``): judged as usual, counted
  (``skewed``) and warned about, once per (host, job) every ``WARN_EVERY_S``: a clock
  that far off is broken, and its own job's timing suffers from it;
- ahead by more than ``max_ahead_s`` (``CLOCK_MAX_AHEAD_S``, and at most a quarter of
  ``--job-idle``): not judged, counted (``ahead``), dead-lettered with the reason, and
  warned about the same way. Below that bound an event can move the partition's time
  by less than a quarter of the idle time, so no job ends early because of it.

Clocks behind are not screened here: their events are late, handed to the Detector at
once (steps are matched by step number), and they never move another job's time.
A worker whose own clock is behind its cluster's by more than ``max_ahead_s`` would
dead-letter good events: run NTP on the workers too (every WARNING names the skew).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from operator import itemgetter

from failslow.schema.batches import BATCH_KINDS, expand
from failslow.streams.rows import max_ts, subset

log = logging.getLogger("failslow.worker")
CLOCK_WARN_S = 5.0          # s ahead of the worker's clock: warned, still judged
CLOCK_MAX_AHEAD_S = 60.0    # s ahead: dead-lettered, not judged
WARN_EVERY_S = 600.0        # wall s between two warnings about one (host, job)
_WARNED_MAX = 1024          # (host, job) pairs remembered for the warnings' rate limit
_EV_TS = itemgetter("ts")


class ClockGuard:
    """Screens a partition's events against the worker's clock (``clock``, epoch s)."""

    def __init__(self, warn_s: float = CLOCK_WARN_S, max_ahead_s: float = CLOCK_MAX_AHEAD_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.warn_s = warn_s
        self.max_ahead_s = max(max_ahead_s, warn_s)
        self.clock = clock
        self.skewed = 0   # events warned about and judged
        self.ahead = 0    # events rejected
        self._warned: dict[tuple[str, str], float] = {}
        # id of a rejected row cut from a batch -> the batch (its message's topic and key)
        self.origin: dict[int, dict] = {}

    def screen(self, events: list[dict]) -> tuple[list[dict], list[tuple[str, dict]]]:
        """``events`` less those too far ahead, and those as (reason, event)."""
        if not events:
            return events, []
        now = self.clock()
        stamps = list(map(_EV_TS, events))
        # a batch's ts may be a column: its newest row's
        newest = max(map(max_ts, events)) if list in map(type, stamps) else max(stamps)
        if newest <= now + self.warn_s:
            return events, []
        kept: list[dict] = []
        rejected: list[tuple[str, dict]] = []
        for ev in events:
            if ev["kind"] in BATCH_KINDS:
                # issue 31: a batch's rows screened from its ts column; the rows too far
                # ahead are cut out (dead-lettered), the rest go on
                self._screen_batch(ev, now, kept, rejected)
                continue
            ahead = ev["ts"] - now
            if ahead <= self.warn_s:
                kept.append(ev)
                continue
            host, job = ev.get("host", "?"), ev.get("job_id", "-")
            if ahead > self.max_ahead_s:
                self.ahead += 1
                why = (f"{ev['kind']} event of host {host} (job {job}) stamped {ahead:,.0f} s "
                       f"ahead of the worker's clock (more than {self.max_ahead_s:g} s): its "
                       "producer's clock is wrong; not judged")
                rejected.append((why, ev))
            else:
                self.skewed += 1
                kept.append(ev)
            self._warn(host, job, ahead, now)
        return kept, rejected

    def _screen_batch(self, ev: dict, now: float, kept: list[dict],
                      rejected: list[tuple[str, dict]]) -> None:
        if max_ts(ev) <= now + self.warn_s:
            kept.append(ev)
            return
        rows = expand(ev)
        good, bad = self.screen(rows)
        if not bad:
            kept.append(ev)
            return
        for _, row in bad:
            self.origin[id(row)] = ev
        rejected += bad
        ids = set(map(id, good))
        kept += subset(ev, [i for i, row in enumerate(rows) if id(row) in ids])

    def _warn(self, host: str, job: str, ahead: float, now: float) -> None:
        key = (host, job)
        if now - self._warned.get(key, -math.inf) < WARN_EVERY_S:
            return
        if len(self._warned) >= _WARNED_MAX:
            self._warned.clear()
        self._warned[key] = now
        action = ("dead-lettered, not judged" if ahead > self.max_ahead_s
                  else "judged, its job's timing may suffer")
        log.warning("clock of host %s (job %s) is %.0f s ahead of this worker's: its events "
                    "are %s (warned above %g s, dead-lettered above %g s; fix the host's "
                    "NTP)", host, job, ahead, action, self.warn_s, self.max_ahead_s)
