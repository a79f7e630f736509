"""The checks behind `failslow status`: broker, topics, consumer groups, components'
metrics endpoints, ClickHouse and its open incidents. Each check returns what it saw and
the problems that make the pipeline unhealthy; none raises, none waits longer than its
timeout.

Consumer lag (committed partitions only) is told in messages (committed offset vs the
broker's end offset) and in
seconds (the age of the oldest message the group has not consumed yet, read from the
topic). Tansu's end offsets can be too low (MEASURED.md), so a lag of 0 messages is
only as good as the broker; the age is read from the data itself.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

from failslow.schema import Topics
from failslow.schema.kafka_security import client_conf, reader_conf, refused

COMPONENTS = ("worker", "sink", "notify", "collect")
KNOWN_GROUPS = ("failslow-worker", "failslow-sink", "failslow-notify")  # the commands' defaults
# What each component's line shows: (label, metric name, how to fold label sets)
HEADLINES: dict[str, list[tuple[str, str, str]]] = {
    "worker": [("events", "failslow_stream_events_total", "sum"),
               ("lag s", "failslow_stream_consumer_lag_seconds", "max"),
               ("open incidents", "failslow_stream_open_incidents", "sum"),
               ("detector errors", "failslow_stream_detector_errors_total", "sum")],
    "sink": [("rows", "failslow_sink_rows_written_total", "sum"),
             ("write errors", "failslow_sink_write_errors_total", "sum"),
             ("failing writes", "failslow_sink_failing_writes", "max"),
             ("dead letters", "failslow_sink_deadletters_total", "sum")],
    "notify": [("delivered", "failslow_notify_delivered_total", "sum"),
               ("failed attempts", "failslow_notify_delivery_failures_total", "sum"),
               ("outbox", "failslow_notify_outbox_pending", "sum")],
    "collect": [("delivered", "failslow_collect_delivered_total", "sum"),
                ("spool bytes", "failslow_collect_spool_bytes", "sum")],
}
# A gauge by which a component says it is failing now (a counter since its start cannot:
# one error an hour ago would keep it unhealthy for good), and what the problem says.
FAILING_NOW: dict[str, tuple[str, str]] = {
    "sink": ("failslow_sink_failing_writes",
             "sink: ClickHouse refuses its writes ({n:.0f} failed tries in a row of one batch; "
             "nothing more is stored or committed until one succeeds; see the sink's log)"),
}
# Consumer-group states in which a group has members (Apache Kafka and Tansu name them so).
_GROUP_LIVE = ("STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE")


@dataclass
class Report:
    checked_ts: float
    broker: dict[str, Any] = field(default_factory=dict)
    topics: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)
    clickhouse: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, **asdict(self)}


def _kafka_error(exc: BaseException) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    if hasattr(exc.args[0] if exc.args else None, "str"):
        text = exc.args[0].str()
    return text.splitlines()[0][:200]


def check_kafka(report: Report, bootstrap: str, topics: Topics, timeout: float,
                max_lag_s: float) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    report.broker = {"bootstrap": bootstrap}
    conf = client_conf(bootstrap, {"socket.connection.setup.timeout.ms": int(timeout * 1000),
                                   "log_level": 0})
    admin = AdminClient(conf)
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        report.broker["ok"] = False
        wrong_login = refused(admin)  # wrong SASL credentials: say so, not "unreachable"
        report.broker["error"] = str(wrong_login) if wrong_login else _kafka_error(exc)
        report.problems.append(f"broker {bootstrap}{'' if wrong_login else ' unreachable'}: "
                               f"{report.broker['error']}")
        return
    report.broker.update(ok=True, brokers=len(meta.brokers))
    probe = Consumer(reader_conf(bootstrap, "failslow-status", {
        "socket.connection.setup.timeout.ms": int(timeout * 1000), "log_level": 0,
        "enable.partition.eof": True}))
    try:
        ends: dict[tuple[str, int], int] = {}
        newest_at: list[tuple[str, int, int]] = []
        for name in topics.all():
            t = meta.topics.get(name)
            if t is None or t.error is not None:
                report.topics.append({"topic": name, "exists": False})
                report.problems.append(f"topic {name} missing (failslow up / create it)")
                continue
            for p in sorted(t.partitions):
                try:
                    _, hi = probe.get_watermark_offsets(TopicPartition(name, p), timeout=timeout)
                except KafkaException:
                    hi = -1
                ends[(name, p)] = hi
                if hi > 0 and name in topics.inputs():
                    newest_at.append((name, p, hi - 1))
            report.topics.append({"topic": name, "exists": True, "partitions": len(t.partitions),
                                  "messages_end": sum(max(ends.get((name, p), 0), 0)
                                                      for p in t.partitions)})
        stamps = read_timestamps(probe, newest_at, timeout)
        now = time.time()
        for row in report.topics:
            ts = [stamps[k] for k in stamps if k[0] == row["topic"]]
            if ts:
                row["newest_age_s"] = round(max(0.0, now - max(ts)), 1)
        _groups(report, admin, probe, ends, set(topics.all()), timeout, max_lag_s)
    finally:
        probe.close()


def _groups(report: Report, admin: Any, probe: Any, ends: dict[tuple[str, int], int],
            ours: set[str], timeout: float, max_lag_s: float) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    try:
        listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout)
        names = {g.group_id for g in listed.valid}
    except Exception as exc:  # noqa: BLE001 - an admin API the broker lacks
        report.groups.append({"group": "n/a", "error": f"n/a (ListGroups failed: "
                              f"{_kafka_error(exc)})"})
        names = set()
    # Tansu lists a group only once it has committed: ask for the default ones by name.
    for name in sorted((names | set(KNOWN_GROUPS)) - {"failslow-status"}):
        try:
            fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(name)],
                                                    request_timeout=timeout)[name]
            parts = fut.result(timeout=timeout).topic_partitions
        except Exception as exc:  # noqa: BLE001
            report.groups.append({"group": name, "error": f"n/a (OffsetFetch failed: "
                                  f"{_kafka_error(exc)})"})
            continue
        parts = [tp for tp in parts if tp.topic in ours and tp.offset >= 0]
        if not parts:
            continue
        lag, behind = 0, []
        for tp in parts:
            end = ends.get((tp.topic, tp.partition), -1)
            if tp.offset >= 0 and end > tp.offset:
                lag += end - tp.offset
                behind.append((tp.topic, tp.partition, tp.offset))
        stamps = read_timestamps(probe, behind, timeout)
        age = round(max(0.0, time.time() - min(stamps.values())), 1) if stamps else 0.0
        row = {"group": name, "topics": sorted({tp.topic for tp in parts}), "lag_messages": lag,
               "oldest_unconsumed_age_s": age}
        report.groups.append(row)
        if age > max_lag_s:
            report.problems.append(f"consumer group {name} is {age:.0f} s behind "
                                   f"({lag} messages; --max-lag-s {max_lag_s:g})")


def read_timestamps(consumer: Any, where: list[tuple[str, int, int]],
                    timeout: float) -> dict[tuple[str, int, int], float]:
    """The Kafka timestamp (epoch s) of the message at each (topic, partition, offset)."""
    from confluent_kafka import TopicPartition

    out: dict[tuple[str, int, int], float] = {}
    rounds: list[list[tuple[str, int, int]]] = []
    for item in where:  # a partition can be read at one offset at a time
        spot = next((r for r in rounds if all(x[:2] != item[:2] for x in r)), None)
        if spot is None:
            rounds.append([item])
        else:
            spot.append(item)
    for batch in rounds:
        consumer.assign([TopicPartition(t, p, o) for t, p, o in batch])
        wanted = {(t, p): o for t, p, o in batch}
        deadline = time.monotonic() + timeout
        while wanted and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            key = (msg.topic(), msg.partition())
            if key not in wanted:
                continue
            if msg.error() is None:
                kind, ms = msg.timestamp()
                if kind and ms > 0:
                    out[(*key, wanted[key])] = ms / 1000.0
            del wanted[key]
        consumer.unassign()
    return out


def scrape(url: str, timeout: float) -> dict[str, list[float]]:
    """Prometheus text from ``url``: sample name -> its values (one per label set)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - http(s) only
        text = r.read().decode()
    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s.value)
    return out


def metrics_url(text: str) -> str:
    if text.startswith(("http://", "https://")):
        return text if "/metrics" in text else text.rstrip("/") + "/metrics"
    host, sep, port = text.rpartition(":")
    return f"http://{host if sep else '127.0.0.1'}:{port}/metrics"


def check_component(report: Report, name: str, url: str, timeout: float) -> None:
    row: dict[str, Any] = {"component": name, "endpoint": url}
    try:
        values = scrape(url, timeout)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        row.update(alive=False, error=str(reason)[:200])
        report.problems.append(f"{name} metrics endpoint {url} not answering: {row['error']}")
    else:
        row["alive"] = True
        row["metrics"] = {label: (max if how == "max" else sum)(values.get(metric, [0.0]))
                          for label, metric, how in HEADLINES[name]}
        if name in FAILING_NOW:
            metric, problem = FAILING_NOW[name]
            n = max(values.get(metric, [0.0]))
            if n > 0:
                row["failing"] = True
                report.problems.append(problem.format(n=n))
    report.components.append(row)


def check_worker_group(report: Report, bootstrap: str, group: str, timeout: float) -> None:
    """Without a worker endpoint: is anyone in the worker's consumer group? No worker means
    no incident can ever be detected, so none is a problem, not `n/a`."""
    from confluent_kafka.admin import AdminClient

    row: dict[str, Any] = {"component": "worker", "endpoint": f"consumer group {group}"}
    report.components.append(row)
    if not report.broker.get("ok"):
        row.update(alive=None, error="broker unreachable")
        return  # the broker's problem says it already
    admin = AdminClient(client_conf(bootstrap, {
        "socket.connection.setup.timeout.ms": int(timeout * 1000), "log_level": 0}))
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group]
        state = desc.result(timeout=timeout).state.name
    except Exception as exc:  # noqa: BLE001 - a broker without DescribeGroups
        row.update(alive=None, error=f"DescribeGroups failed: {_kafka_error(exc)}")
        report.problems.append(f"worker: cannot tell whether one runs ({row['error']}); "
                               "name its endpoint with --worker-metrics HOST:PORT")
        return
    row.update(alive=state in _GROUP_LIVE, group_state=state.lower())
    if not row["alive"]:
        row["error"] = f"no member in consumer group {group} ({state.lower()})"
        report.problems.append(f"no worker running (consumer group {group} is "
                               f"{state.lower()}): no incident can be detected; start "
                               "`failslow worker`, or name its endpoint: --worker-metrics")


def check_pid(report: Report, name: str, pid: int) -> None:
    from failslow.stack import pid_alive

    alive = pid_alive(pid)
    report.components.append({"component": name, "endpoint": f"pid {pid} (failslow up)",
                              "alive": alive})
    if not alive:
        report.problems.append(f"{name} of the embedded stack (pid {pid}) is not running "
                               "(`failslow up` starts it again)")


def check_clickhouse(report: Report, url: str, masked: str, limit: int = 10) -> None:
    from failslow.storage.client import connect

    report.clickhouse = {"url": masked}
    try:
        client = connect(url)
        try:
            cols, rows = client.query(
                "SELECT incident_id, job_id, fault, severity, rank, host, root_cause, "
                "slowdown_pct, toFloat64(onset_ts) AS onset_ts FROM "
                f"{client.database}.incidents_current WHERE status = 'open' "
                "ORDER BY severity = 'critical' DESC, slowdown_pct DESC")
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - any failure is the answer: not usable
        error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        report.clickhouse.update(ok=False, error=error)
        report.problems.append(f"ClickHouse {masked}: {error}")
        return
    incidents = [dict(zip(cols, r, strict=True)) for r in rows]
    by_sev: dict[str, int] = {}
    for i in incidents:
        by_sev[i["severity"]] = by_sev.get(i["severity"], 0) + 1
    report.clickhouse.update(ok=True, open_incidents=len(incidents), by_severity=by_sev,
                             top=incidents[:limit])
