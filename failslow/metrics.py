"""Prometheus metrics of `failslow sink`, `notify` and `collect` (`--metrics-port`).

Each component already keeps its counts (``Sink.stats``, ``NotifyService.stats``, the
publisher's and the agent's): a collector reads them when Prometheus scrapes, so the hot
paths pay nothing and the numbers are the ones the components log. Served on
ADDR:PORT/metrics from a daemon thread (127.0.0.1 unless ``--metrics-addr``), like
`failslow worker --metrics-port` (streams/metrics.py).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from failslow.errors import ConfigError

log = logging.getLogger("failslow.metrics")


@dataclass(frozen=True)
class Stat:
    name: str            # metric name (counters end in _total)
    key: str             # the stats key it reads; a key ending in '.' reads every 'key.LABEL'
    help: str
    gauge: bool = False
    label: str = ""      # label name for a 'key.' family


SINK = (
    Stat("failslow_sink_messages_total", "messages", "Kafka records consumed"),
    Stat("failslow_sink_rows_written_total", "rows",
         "Rows ClickHouse acknowledged (all tables, dead letters included)"),
    Stat("failslow_sink_events_total", "events", "CONTRACT events written to their tables"),
    Stat("failslow_sink_deadletters_total", "dead_letters",
         "Records or events this sink rejected (written to dead_letters)"),
    Stat("failslow_sink_write_errors_total", "write_errors",
         "Failed ClickHouse writes; each batch is retried until it is acknowledged"),
    Stat("failslow_sink_failing_writes", "failing_writes",
         "Failed tries in a row of the batch being written (0 once ClickHouse acknowledged it)",
         gauge=True),
    Stat("failslow_sink_commits_total", "commits", "Offset commits after acknowledged batches"),
    Stat("failslow_sink_kafka_errors_total", "kafka_errors", "Kafka consumer errors"),
    Stat("failslow_sink_buffered_rows", "buffered", "Rows buffered, not yet written",
         gauge=True),
)

NOTIFY = (
    Stat("failslow_notify_messages_total", "consumed", "Incident topic records consumed"),
    Stat("failslow_notify_incidents_total", "incidents", "Incident events routed"),
    Stat("failslow_notify_deadletters_total", "deadletters",
         "Incident records sent to the dead-letter topic (invalid)"),
    Stat("failslow_notify_queued_total", "queued", "Notifications put in the outbox"),
    Stat("failslow_notify_delivered_total", "delivered.",
         "Notifications an endpoint accepted", label="destination"),
    Stat("failslow_notify_rejected_total", "rejected",
         "Notifications an endpoint refused for good (not retried)"),
    Stat("failslow_notify_delivery_failures_total", "retries",
         "Failed delivery attempts (each is retried with backoff)"),
    Stat("failslow_notify_notifier_errors_total", "errors",
         "Notifier exceptions (a defect; the notification is retried)"),
    Stat("failslow_notify_rate_limited_total", "suppressed",
         "Notifications held back by a destination's rate limit"),
    Stat("failslow_notify_outbox_pending", "outbox_pending",
         "Notifications in the outbox waiting for delivery", gauge=True),
)

COLLECT = (
    Stat("failslow_collect_cycles_total", "cycles", "Sample cycles run"),
    Stat("failslow_collect_events_total", "events.", "Events sampled, per sampler",
         label="sampler"),
    Stat("failslow_collect_sampler_errors_total", "errors.",
         "Samples that raised, per sampler (the others go on)", label="sampler"),
    Stat("failslow_collect_published_total", "published", "Events handed to the publisher"),
    Stat("failslow_collect_delivered_total", "delivered", "Events the broker acknowledged"),
    Stat("failslow_collect_failed_total", "failed",
         "Events lost: not delivered and not spooled"),
    Stat("failslow_collect_spooled_total", "spooled",
         "Events written to the on-disk spool (broker unreachable)"),
    Stat("failslow_collect_spool_dropped_total", "dropped",
         "Events evicted from a full spool (the oldest first)"),
    Stat("failslow_collect_replayed_total", "replayed", "Spooled events replayed to the broker"),
    Stat("failslow_collect_pending_events", "pending", "Events not yet delivered", gauge=True),
    Stat("failslow_collect_spool_events", "spool_events", "Events in the spool now",
         gauge=True),
    Stat("failslow_collect_spool_bytes", "spool_bytes", "Size of the spool on disk",
         gauge=True),
)


class StatsCollector(Collector):
    """Reads ``read()`` (a flat mapping of counts) at every scrape."""

    def __init__(self, read: Callable[[], Mapping[str, Any]], stats: tuple[Stat, ...]) -> None:
        self.read = read
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        values = self._snapshot()
        for s in self.stats:
            family: GaugeMetricFamily | CounterMetricFamily
            labels = [s.label] if s.key.endswith(".") else None
            if s.gauge:
                family = GaugeMetricFamily(s.name, s.help, labels=labels)
            else:
                family = CounterMetricFamily(s.name, s.help, labels=labels)
            if labels:
                for key, value in sorted(values.items()):
                    if key.startswith(s.key):
                        family.add_metric([key[len(s.key):]], float(value))
            else:
                family.add_metric([], float(values.get(s.key, 0)))
            yield family

    def _snapshot(self) -> dict[str, Any]:
        for _ in range(3):  # a counter dict may grow while it is copied
            try:
                return dict(self.read())
            except RuntimeError:
                continue
        return {}


def add_metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics on ADDR:PORT/metrics [off]")
    parser.add_argument("--metrics-addr", default="127.0.0.1",
                        help="address the metrics endpoint binds to [127.0.0.1]; 0.0.0.0 in "
                        "a container")


def serve_metrics(args: argparse.Namespace, read: Callable[[], Mapping[str, Any]],
                  stats: tuple[Stat, ...]) -> None:
    """Serve ``stats`` read from ``read`` when ``--metrics-port`` was given."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        return
    if not 0 < port < 65536:
        raise ConfigError(f"--metrics-port {port}: not a TCP port")
    registry = CollectorRegistry()
    registry.register(StatsCollector(read, stats))
    try:
        start_http_server(port, addr=args.metrics_addr, registry=registry)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {port}: cannot listen on {args.metrics_addr} "
                          f"({exc.strerror or exc})") from None
    log.info("metrics on http://%s:%d/metrics", args.metrics_addr, port)
