"""End to end on the real parts: simulator -> publisher -> Tansu -> faust worker -> incidents
-> sink -> chdb -> `failslow query`. A 16-rank job with one rank 30 % slower from step 20
must give exactly one incident, for the right job and rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest
from waiting import wait_until

from failslow.collectors.publisher import Publisher
from failslow.simulator import FaultSpec, JobSpec, Scenario, simulate
from failslow.stack import free_port

pytestmark = pytest.mark.integration

SLOW_RANK = 11
JOB = "e2e-job"


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "failslow.cli", *args],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            return -9
    return proc.returncode


def _query(conn: list[str], sql: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "failslow.cli", "query", *conn, "--format",
                          "json", sql], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode().strip()
    return [orjson.loads(line) for line in text.splitlines()] if text else []


def _metric(port: int, name: str) -> float:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:  # not listening yet
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.fixture
def trace():
    scenario = Scenario(
        "e2e", "16 ranks, one 30 % slower from step 20",
        (JobSpec(job_id=JOB, hosts=2, step_s=1.0),),
        faults=(FaultSpec("gpu_clock", 20.0, None, 0.3, rank=SLOW_RANK, job=JOB),), steps=60)
    return simulate(scenario, seed=3)


def test_slow_rank_found_through_kafka_worker_sink_and_query(broker, topics, trace, tmp_path):
    conn = ["--bootstrap", broker.bootstrap, "--topic-prefix", topics.prefix,
            "--home", str(tmp_path), "--clickhouse", f"chdb://{tmp_path / 'chdb'}"]
    port = free_port()
    worker = _spawn(["worker", *conn, "--group", "e2e-worker", "--log-level", "warning",
                     "--metrics-port", str(port)], tmp_path / "worker.log")
    sink = _spawn(["sink", *conn, "--group", "e2e-sink"], tmp_path / "sink.log")
    try:
        events = list(trace.events())
        steps = sum(1 for e in events if e["kind"] == "step")
        pub = Publisher(broker.bootstrap, topics)
        pub.publish(events)
        assert pub.close(timeout=30) == 0

        state: dict = {}

        def everything_landed() -> bool:
            # The worker judged every event and the sink stored every step and every
            # incident event the worker emitted.
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
            assert sink.poll() is None, (tmp_path / "sink.log").read_text()[-2000:]
            if not (tmp_path / "chdb.owner.json").exists():
                return False
            judged = _metric(port, "failslow_stream_events_total")
            emitted = _metric(port, "failslow_stream_incidents_total")
            state["stored"] = _query(conn, "SELECT count() AS n FROM failslow.steps")[0]["n"]
            stored_incidents = _query(conn, "SELECT count() AS n FROM failslow.incidents")[0]["n"]
            return (judged >= len(events) and emitted > 0 and stored_incidents >= emitted
                    and state["stored"] == steps)

        wait_until(everything_landed, timeout=120, interval=1.0,
                   what="the worker to judge every event and the sink to store its incidents")
        stored = state["stored"]
        rows = _query(conn, "SELECT incident_id, job_id, status, fault, severity, rank, host, "
                            "root_cause FROM failslow.incidents_current")
    finally:
        worker_rc = _stop(worker)
        sink_rc = _stop(sink)

    assert stored == steps, f"sink stored {stored} of {steps} step events"
    paged = [r for r in rows if r["severity"] != "info"]
    assert paged, f"no incident found; worker log:\n{(tmp_path / 'worker.log').read_text()[-3000:]}"
    assert {(r["job_id"], r["fault"], r["rank"]) for r in paged} == {(JOB, "slow_rank", SLOW_RANK)}
    assert len({r["incident_id"] for r in paged}) == 1
    assert worker_rc == 0 and sink_rc == 0
