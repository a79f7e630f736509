"""`--metrics-port` of `failslow sink`, `notify` and `collect`: each real component, started
through the command line against the real Tansu broker, serves Prometheus text whose
counters move with the work it does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from http_receiver import HttpReceiver
from prometheus_client.parser import text_string_to_metric_families

from failslow.collectors.publisher import Publisher
from failslow.schema import encode
from failslow.stack import free_port

pytestmark = pytest.mark.integration


class Component:
    """`failslow ARGS --metrics-port P` in a subprocess, stopped by SIGTERM on exit."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = tmp / f"{args[0]}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "failslow.cli", *args, "--metrics-port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    def __enter__(self) -> Component:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def scrape(self) -> dict[tuple[str, tuple], float] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def wait_until(self, ok, timeout: float = 60.0) -> dict:
        """Scrape until ``ok(samples)`` holds; fail with the last scrape and the log."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            last = self.scrape()
            if last is not None and ok(last):
                return last
            time.sleep(0.2)
        raise AssertionError(f"metrics never satisfied the check; last scrape {last}\n"
                             f"{self.log.read_text()[-2000:]}")


def v(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _conn(broker, topics, tmp_path) -> list[str]:
    return ["--bootstrap", broker.bootstrap, "--topic-prefix", topics.prefix,
            "--home", str(tmp_path)]


def test_sink_counts_messages_rows_and_commits(broker, topics, tmp_path):
    conn = _conn(broker, topics, tmp_path)
    with Component(tmp_path, "sink", *conn, "--clickhouse", f"chdb://{tmp_path / 'chdb'}",
                   "--no-serve", "--group", "m-sink") as sink:
        first = sink.wait_until(lambda s: ("failslow_sink_rows_written_total", ()) in s)
        assert v(first, "failslow_sink_rows_written_total") == 0
        assert v(first, "failslow_sink_buffered_rows") == 0
        events = [{"v": 1, "kind": "host", "ts": 1_700_000_000.0 + i, "host": "h0",
                   "cpu_util_pct": 10.0} for i in range(50)]
        pub = Publisher(broker.bootstrap, topics)
        pub.publish(events)
        assert pub.close(timeout=30) == 0
        bad = Producer({"bootstrap.servers": broker.bootstrap})
        bad.produce(topics.for_kind("host"), key=b"h0", value=b"not json")  # dead-lettered
        assert bad.flush(10) == 0
        after = sink.wait_until(lambda s: v(s, "failslow_sink_events_total") >= 50
                                and v(s, "failslow_sink_commits_total") >= 1
                                and v(s, "failslow_sink_deadletters_total") >= 1)
        assert v(after, "failslow_sink_messages_total") >= 2
        assert v(after, "failslow_sink_rows_written_total") >= 51
        assert v(after, "failslow_sink_write_errors_total") == 0
        # `failslow status` reads the same endpoint
        out = subprocess.run([sys.executable, "-m", "failslow.cli", "status", *conn,
                              "--format", "json", "--sink-metrics", f"127.0.0.1:{sink.port}"],
                             capture_output=True, text=True, timeout=120)
        row = next(c for c in orjson.loads(out.stdout)["components"]
                   if c["component"] == "sink")
        assert row["alive"] is True and row["metrics"]["rows"] >= 51, row


def test_notify_counts_incidents_and_failed_deliveries_then_delivered(broker, topics, tmp_path):
    with HttpReceiver(default_status=500) as rx:
        env = {"FAILSLOW_WEBHOOK_URL": rx.url("/hook")}
        with Component(tmp_path, "notify", *_conn(broker, topics, tmp_path), "--state-dir",
                       str(tmp_path / "notify"), "--group", "m-notify", env=env) as notify:
            notify.wait_until(lambda s: ("failslow_notify_outbox_pending", ()) in s)
            p = Producer({"bootstrap.servers": broker.bootstrap})
            p.produce(topics.for_kind("incident"), key=b"job0", value=encode({
                "v": 1, "kind": "incident", "ts": 100.0, "incident_id": "job0:slow_rank:r5:1",
                "job_id": "job0", "status": "open", "fault": "slow_rank",
                "severity": "critical", "onset_ts": 90.0, "detected_ts": 100.0,
                "slowdown_pct": 20.0, "rank": 5, "host": "h0"}))
            assert p.flush(10) == 0
            failing = notify.wait_until(
                lambda s: v(s, "failslow_notify_delivery_failures_total") >= 1)
            assert v(failing, "failslow_notify_incidents_total") == 1
            assert v(failing, "failslow_notify_queued_total") >= 1
            assert v(failing, "failslow_notify_outbox_pending") >= 1
            assert v(failing, "failslow_notify_delivered_total", destination="webhook") == 0
            rx.default_status = 200                       # the endpoint is back
            done = notify.wait_until(
                lambda s: v(s, "failslow_notify_delivered_total", destination="webhook") >= 1
                and v(s, "failslow_notify_outbox_pending") == 0)
            assert v(done, "failslow_notify_rejected_total") == 0


def test_collect_counts_cycles_and_deliveries(broker, topics, tmp_path):
    with Component(tmp_path, "collect", *_conn(broker, topics, tmp_path), "--samplers",
                   "host", "--host", "hm", "--interval", "0.2", "--spool-dir",
                   str(tmp_path / "spool")) as collect:
        s = collect.wait_until(lambda s: v(s, "failslow_collect_delivered_total") >= 2)
        assert v(s, "failslow_collect_cycles_total") >= 2
        assert v(s, "failslow_collect_events_total", sampler="host") >= 2
        assert v(s, "failslow_collect_sampler_errors_total", sampler="host") == 0
        assert v(s, "failslow_collect_spool_bytes") == 0


def test_collect_spools_while_the_broker_is_down(tmp_path):
    dead = f"127.0.0.1:{free_port()}"                    # nothing listens there
    with Component(tmp_path, "collect", "--bootstrap", dead, "--home", str(tmp_path),
                   "--samplers", "host", "--host", "hm", "--interval", "0.2",
                   "--spool-dir", str(tmp_path / "spool")) as collect:
        s = collect.wait_until(lambda s: v(s, "failslow_collect_spooled_total") >= 1
                               and v(s, "failslow_collect_spool_bytes") > 0)
        assert v(s, "failslow_collect_delivered_total") == 0
        assert v(s, "failslow_collect_spool_events") >= 1
