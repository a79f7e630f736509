"""Pipeline health as Prometheus metrics (own registry, served on an HTTP port) and a
one-line summary for the log once a minute.

Consumer lag is measured from what the worker consumed, in seconds (now minus the
Kafka timestamp of the newest message taken from each topic): broker end offsets
are wrong on Tansu, so an offset lag computed from them would be too.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.events = Counter("failslow_stream_events_total", "Valid events processed",
                              ["topic"], registry=r)
        self.messages = Counter("failslow_stream_messages_total", "Kafka messages consumed",
                                ["topic"], registry=r)
        self.deadletters = Counter("failslow_stream_deadletters_total",
                                   "Records sent to the dead-letter topic", ["topic"], registry=r)
        self.duplicates = Counter("failslow_stream_duplicates_total",
                                  "Duplicate events dropped", registry=r)
        self.late = Counter("failslow_stream_late_events_total",
                            "Events that arrived behind the watermark (processed)", registry=r)
        self.late_samples = Counter("failslow_stream_late_samples_total",
                                    "Device samples that reached the Detector after the steps "
                                    "they should have explained (applied late)", registry=r)
        self.detector_errors = Counter("failslow_stream_detector_errors_total",
                                       "Events the Detector failed on (skipped, logged): a "
                                       "defect to report", registry=r)
        self.jobs_ended = Counter("failslow_stream_jobs_ended_total",
                                  "Jobs closed after --job-idle seconds without events: open "
                                  "incidents resolved (job ended), state dropped", registry=r)
        self.clock_ahead = Counter("failslow_stream_clock_ahead_events_total",
                                   "Events stamped ahead of the worker's clock (a producer "
                                   "clock off, issue 33): action=judged past the warning "
                                   "skew, action=dead_lettered past --max-clock-ahead",
                                   ["action"], registry=r)
        self.judged = Counter("failslow_stream_judged_rank_steps_total",
                              "Ranks' steps the Detector judged (one per rank of each judged "
                              "step), all jobs", registry=r)
        self.capped = Counter("failslow_stream_capped_events_total",
                              "Events dropped by an input cap (streams.limits): more distinct "
                              "jobs, hosts, or ranks / groups / hosts in one job than allowed",
                              ["cap"], registry=r)
        self.unmapped = Counter("failslow_stream_unmapped_telemetry_total",
                                "Telemetry messages sent to every partition: their host's "
                                "job was not known yet", registry=r)
        self.incidents = Counter("failslow_stream_incidents_total", "Incident events emitted",
                                 ["status"], registry=r)
        self.open_incidents = Gauge("failslow_stream_open_incidents",
                                    "Incidents currently open", registry=r)
        self.buffered = Gauge("failslow_stream_buffered_events",
                              "Events held for ordering", registry=r)
        self.pooled = Gauge("failslow_stream_pooled_events",
                            "Events waiting at the input caps: jobs on probation, samples "
                            "of hosts no tracked job runs on", registry=r)
        self.lag = Gauge("failslow_stream_consumer_lag_seconds",
                         "Now minus the timestamp of the newest message consumed", ["topic"],
                         registry=r)
        self.latency = Histogram("failslow_stream_processing_latency_seconds",
                                 "Wall time from an input message's produce time to its events "
                                 "being processed", registry=r,
                                 buckets=(.01, .025, .05, .1, .25, .5, 1, 2, 5, 10, 30))
        self.snapshot_bytes = Gauge("failslow_stream_snapshot_bytes",
                                    "Size of the newest state snapshot", ["partition"], registry=r)
        # issue 16 (streams/loopprobe.py): how late the event loop woke a 0.05 s sleep
        # loop="worker": the agents' and timers' loop; loop="consumer": the Kafka consumer
        # thread's loop (fetches, heartbeats)
        self.loop_blocked = Histogram("failslow_stream_loop_blocked_seconds",
                                      "How late an event loop of the worker woke a 0.05 s "
                                      "sleep: how long what runs on it (agents, timers, sends, "
                                      "rebalance callbacks; the consumer's fetches and "
                                      "heartbeats) waited", ["loop"], registry=r,
                                      buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2, 5, 10))
        self.loop_blocked_max = Gauge("failslow_stream_loop_blocked_max_seconds",
                                      "An event loop's longest block in the last minute",
                                      ["loop"], registry=r)
        self.client_errors = Counter("failslow_stream_kafka_client_errors_total",
                                     "Kafka client error lines held back as repeats (a broker "
                                     "outage: rises while it lasts)", registry=r)
        self._last_log = time.monotonic()
        # issue 31: a topic's labelled children, looked up once (``labels`` takes a lock
        # and builds its key at each call: three calls per input message, ~130,000 a
        # 4,096-rank job's 12 s); prometheus keeps each child until it is removed, which
        # nothing here does
        self._messages_of: dict[str, Any] = {}
        self._lag_of: dict[str, Any] = {}
        self._events_of: dict[str, Any] = {}
        self._last_counts: dict[str, float] = {}
        self._last_buckets: dict[float, float] = {}

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    def seen(self, topic: str, kafka_ts: float | None, now: float) -> None:
        """One message from ``topic`` with Kafka timestamp ``kafka_ts`` (epoch s) taken at ``now``."""
        child = self._messages_of.get(topic)
        if child is None:
            child = self._messages_of[topic] = self.messages.labels(topic)
        child.inc()
        if kafka_ts:
            lag = self._lag_of.get(topic)
            if lag is None:
                lag = self._lag_of[topic] = self.lag.labels(topic)
            lag.set(max(0.0, now - kafka_ts))

    def seen_many(self, topic: str, count: int, kafka_ts: float | None, now: float) -> None:
        """``count`` messages from ``topic`` taken at ``now``, the last of them (that had
        one) with Kafka timestamp ``kafka_ts``: the counts and the lag ``seen`` leaves
        after each of them, in one update (issue 31: two locked updates an input message)."""
        child = self._messages_of.get(topic)
        if child is None:
            child = self._messages_of[topic] = self.messages.labels(topic)
        child.inc(count)
        if kafka_ts:
            lag = self._lag_of.get(topic)
            if lag is None:
                lag = self._lag_of[topic] = self.lag.labels(topic)
            lag.set(max(0.0, now - kafka_ts))

    def events_of(self, topic: str) -> Any:
        """``events.labels(topic)``, looked up once per topic."""
        child = self._events_of.get(topic)
        if child is None:
            child = self._events_of[topic] = self.events.labels(topic)
        return child

    def summary(self, now: float | None = None) -> str | None:
        """One log line, at most once a minute: events/s per topic and processing latency
        (p50 / p99, bucket bounds) since the previous line; consumer lag, dead letters,
        detector errors, open incidents and buffered events now."""
        now = time.monotonic() if now is None else now
        if now - self._last_log < 60.0:
            return None
        span, self._last_log = now - self._last_log, now
        totals: dict[str, float] = {}
        lags: dict[str, float] = {}
        buckets: list[tuple[float, float]] = []
        dead = 0.0
        for metric in self.registry.collect():
            for x in metric.samples:
                if x.name == "failslow_stream_events_total":
                    totals[x.labels["topic"]] = x.value
                elif x.name == "failslow_stream_consumer_lag_seconds":
                    lags[x.labels["topic"]] = x.value
                elif x.name == "failslow_stream_deadletters_total":
                    dead += x.value
                elif x.name == "failslow_stream_processing_latency_seconds_bucket":
                    buckets.append((float(x.labels["le"]), x.value))
        rates = ", ".join(f"{t}={(v - self._last_counts.get(t, 0.0)) / span:.0f}/s"
                          for t, v in sorted(totals.items()))
        self._last_counts = totals
        new = [(le, c - self._last_buckets.get(le, 0.0)) for le, c in buckets]
        self._last_buckets = dict(buckets)
        lag = max(lags.values(), default=0.0)
        return (f"events {rates or 'none'}; processing latency "
                f"{_quantile(new, 0.5)} / {_quantile(new, 0.99)} (p50 / p99); "
                f"consumer lag {lag:.1f} s; dead letters {dead:.0f}; "
                f"detector errors {self.detector_errors._value.get():.0f}; "
                f"open incidents {self.open_incidents._value.get():.0f}; "
                f"buffered {self.buffered._value.get():.0f}")


def _quantile(buckets: list[tuple[float, float]], q: float) -> str:
    """The upper bound of the histogram bucket holding quantile ``q`` ('-' if empty)."""
    total = max((c for _, c in buckets), default=0.0)
    if total <= 0:
        return "-"
    ordered = sorted(buckets)
    le = next(le for le, c in ordered if c >= q * total)
    if le == float("inf"):
        return f"> {ordered[-2][0]:g} s" if len(ordered) > 1 else "-"
    return f"<= {le:g} s"
