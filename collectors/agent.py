"""The host agent's loop: run the samplers every interval, publish, report once a minute.

Device samples (``gpu``, ``nic``, ``host``) are published on change plus a heartbeat
by default (``collectors.samplers.OnChange``: about half of them on the simulator's
scenarios, with the same incidents); ``on_change=False`` publishes every sample. With
``batch`` a cycle's GPU samples go as one ``gpu_batch`` per host, its NIC ports' as one
``nic_batch`` (a row per port) and the NCCL tailer's windows as one ``comm_batch`` per
job (``schema.batches``; consumers expand them). The training processes' windows reach
the publisher through ``collectors.relay.Relay``."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Protocol

from failslow.collectors.samplers import OnChange, OnChangeConfig
from failslow.schema.batches import to_batches
from failslow.schema.events import GpuEvent, HostEvent, NicEvent

# What a sampler returns: device samples (GpuEvent, NicEvent, HostEvent), or the comm /
# collective records of the NCCL Inspector tailer (CommEvent, CollectiveEvent).
Sample = GpuEvent | NicEvent | HostEvent | dict[str, Any]

log = logging.getLogger(__name__)


class Sampler(Protocol):
    name: str

    def sample(self) -> list[Any]: ...


class Agent:
    """Samples every ``interval_s`` seconds (on a fixed grid, not drifting with the work) and
    publishes; logs one line per ``report_s`` with counts per sampler and the publisher's.

    ``on_change``: publish device samples on change plus a heartbeat (True: the defaults
    of ``OnChangeConfig``; a config; False: every sample). ``batch``: publish the columnar
    batch kinds (one message per host per cycle). ``counts`` are samples taken,
    ``on_change.kept`` / ``.dropped`` what the filter did with device samples."""

    def __init__(self, samplers: list[Sampler], publisher: Any, interval_s: float = 1.0,
                 report_s: float = 60.0, on_change: OnChangeConfig | bool = True,
                 batch: bool = False) -> None:
        self.samplers = samplers
        self.publisher = publisher
        self.interval_s = interval_s
        self.report_s = report_s
        self.cycles = 0
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self._window: Counter[str] = Counter()
        self.batch = batch
        self.on_change: OnChange | None = None
        if on_change is not False:
            self.on_change = OnChange(on_change if isinstance(on_change, OnChangeConfig)
                                      else None)

    def cycle(self) -> int:
        """Sample every sampler once and publish; returns the number of events published."""
        events: list[Sample] = []
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
        if self.on_change is not None:
            events = self.on_change.filter(events)
        if events:
            self.publisher.publish(to_batches(events) if self.batch else events)
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
        oc = self.on_change
        kept = f"{sum(oc.kept.values())}/{sum(oc.kept.values()) + sum(oc.dropped.values())}" \
            if oc is not None else "all"
        log.info("collect: last %.0f s: events %s; device samples published (on change) "
                 "since start %s; publisher delivered=%d pending=%d "
                 "spooled=%d dropped=%d failed=%d; sampler errors=%d",
                 self.report_s, per, kept, st["delivered"], st["pending"], st["spooled"],
                 st["dropped"], st["failed"], sum(self.errors.values()))
        self._window.clear()
