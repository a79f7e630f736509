"""`failslow status` against the real embedded stack (`failslow up`: Tansu + the sink owning
chdb): healthy exits 0 and shows topics, groups, the sink, ClickHouse and open incidents;
a broker that is down, a component endpoint that does not answer, exit non-zero with
the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from failslow.embedded import PLAINTEXT_FLAGS
from failslow.schema import Topics, encode
from failslow.stack import free_port, stop_pid
from failslow.storage.serve import RemoteClient, find_owner
from failslow.storage.url import parse
from failslow.worker_process import WorkerProcess

pytestmark = pytest.mark.integration


def fs(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "failslow.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


@pytest.fixture
def stack(tmp_path):
    env = {"FAILSLOW_HOME": str(tmp_path / "home")}
    up = fs("up", "--port", "0", env=env)
    assert up.returncode == 0, up.stderr
    try:
        yield env, orjson.loads((tmp_path / "home" / "stack.json").read_bytes())
    finally:
        fs("down", env=env)


def _status(env: dict, *args: str) -> tuple[int, dict]:
    out = fs("status", "--format", "json", *args, env=env)
    assert out.stdout, out.stderr
    return out.returncode, orjson.loads(out.stdout)


def test_healthy_stack_exits_0_and_shows_the_pipeline(stack, tmp_path):
    env, state = stack
    bootstrap = f"127.0.0.1:{state['port']}"
    topics = Topics()
    worker = WorkerProcess(bootstrap, topics, log_path=tmp_path / "worker.log",
                           extra=["--home", env["FAILSLOW_HOME"], *PLAINTEXT_FLAGS])
    try:
        _healthy_stack(env, state, bootstrap, topics)
    finally:
        assert worker.stop() == 0, (tmp_path / "worker.log").read_text()[-2000:]


def _healthy_stack(env: dict, state: dict, bootstrap: str, topics: Topics) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topics.for_kind("host"), key=b"h0", value=encode(
        {"v": 1, "kind": "host", "ts": time.time(), "host": "h0", "cpu_util_pct": 5.0}))
    p.produce(topics.for_kind("incident"), key=b"job0", value=encode({
        "v": 1, "kind": "incident", "ts": time.time(), "incident_id": "job0:slow_rank:r5:1",
        "job_id": "job0", "status": "open", "fault": "slow_rank", "severity": "critical",
        "onset_ts": time.time() - 30, "detected_ts": time.time(), "slowdown_pct": 21.5,
        "rank": 5, "host": "h0", "root_cause": "gpu_thermal"}))
    assert p.flush(10) == 0
    del p
    deadline = time.monotonic() + 60
    while True:     # the sink writes within a second or so; wait for it, not a fixed time
        rc, report = _status(env)
        committed = any(g["group"] == "failslow-sink" for g in report["groups"])
        worker = next(c for c in report["components"] if c["component"] == "worker")
        if report["clickhouse"].get("open_incidents") == 1 and committed and worker["alive"] \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rc == 0 and report["healthy"] and report["problems"] == [], report["problems"]
    assert report["broker"]["ok"] and report["broker"]["bootstrap"] == bootstrap
    by_topic = {t["topic"]: t for t in report["topics"]}
    assert set(by_topic) == set(topics.all()) and all(t["exists"] for t in by_topic.values())
    assert by_topic[topics.for_kind("host")]["newest_age_s"] < 600
    assert "newest_age_s" not in by_topic[topics.for_kind("gpu")]     # nothing produced there
    sink_group = next(g for g in report["groups"] if g["group"] == "failslow-sink")
    assert topics.for_kind("host") in sink_group["topics"]
    sink = next(c for c in report["components"] if c["component"] == "sink")
    assert sink["alive"] is True and str(state["sink_metrics_port"]) in sink["endpoint"]
    assert sink["metrics"]["rows"] >= 1                               # what the sink wrote
    assert worker["alive"] is True and worker["endpoint"] == "consumer group failslow-worker"
    ch = report["clickhouse"]
    assert ch["ok"] and ch["open_incidents"] == 1 and ch["by_severity"] == {"critical": 1}
    assert ch["top"][0]["incident_id"] == "job0:slow_rank:r5:1"

    text = fs("status", env=env)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "HEALTHY" in text.stdout and "UNHEALTHY" not in text.stdout
    assert "job0:slow_rank:r5:1" in text.stdout and "failslow-sink" in text.stdout


def test_a_silent_component_endpoint_is_unhealthy(stack):
    env, _ = stack
    port = free_port()                       # nothing listens there
    rc, report = _status(env, "--notify-metrics", f"127.0.0.1:{port}")
    assert rc == 1 and not report["healthy"]
    assert any(p.startswith(f"notify metrics endpoint http://127.0.0.1:{port}/metrics not "
                            "answering") for p in report["problems"]), report["problems"]


def test_broker_down_exits_nonzero_with_the_reason(stack):
    env, state = stack
    stop_pid(int(state["pid"]), 10)                    # the broker dies, the sink stays
    out = fs("status", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "UNHEALTHY" in out.stdout
    assert f"broker 127.0.0.1:{state['port']} unreachable" in out.stdout
    rc, report = _status(env)
    assert rc == 1 and report["broker"]["ok"] is False and report["topics"] == []


def test_a_group_behind_shows_its_lag_and_fails_max_lag(broker, topics, tmp_path):
    from confluent_kafka import Consumer

    p = Producer({"bootstrap.servers": broker.bootstrap})
    topic = topics.for_kind("host")
    for i in range(10):
        p.produce(topic, key=b"h0", value=b"%d" % i, partition=0)
        p.flush(10)                    # one batch each: Tansu's end offsets stay exact
    del p
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lagging",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 3000, "fetch.wait.max.ms": 100})
    c.subscribe([topic])
    deadline, got = time.monotonic() + 60, []
    while len(got) < 4 and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg)
    assert len(got) == 4
    c.commit(message=got[-1], asynchronous=False)   # 4 read, 6 left
    c.close()
    env = {"FAILSLOW_HOME": str(tmp_path), "FAILSLOW_BOOTSTRAP": broker.bootstrap,
           "FAILSLOW_TOPIC_PREFIX": topics.prefix}
    rc, report = _status(env, "--max-lag-s", "0")
    lagging = next(g for g in report["groups"] if g["group"] == "lagging")
    assert lagging["lag_messages"] == 6 and lagging["topics"] == [topic]
    assert lagging["oldest_unconsumed_age_s"] >= 0
    assert rc == 1 and any(p.startswith("consumer group lagging is ") for p in report["problems"])
    rc, report = _status(env, "--max-lag-s", "3600")
    assert not any("consumer group lagging" in p for p in report["problems"])


def test_no_worker_is_unhealthy_with_a_one_line_reason(stack):
    # Without a worker nothing is ever detected: "worker n/a" and HEALTHY hid that.
    env, _ = stack
    rc, report = _status(env)
    assert rc == 1 and not report["healthy"]
    worker = next(c for c in report["components"] if c["component"] == "worker")
    assert worker["alive"] is False
    assert [p for p in report["problems"] if "worker" in p] == [
        "no worker running (consumer group failslow-worker is empty): no incident can be "
        "detected; start `failslow worker`, or name its endpoint: --worker-metrics"]
    text = fs("status", env=env)
    assert text.returncode == 1 and "UNHEALTHY" in text.stdout
    assert "  - no worker running" in text.stdout


def _sink_problems(env: dict) -> tuple[list[str], dict]:
    _, report = _status(env, "--max-lag-s", "3600")    # lag is not what is judged here
    sink = next(c for c in report["components"] if c["component"] == "sink")
    return [p for p in report["problems"] if p.startswith("sink")], sink


def test_database_write_errors_make_status_unhealthy_at_once_and_clear_after(stack):
    env, state = stack
    home = Path(env["FAILSLOW_HOME"])
    url = parse(f"chdb://{home / 'chdb'}")
    owner = RemoteClient(url, find_owner(home / "chdb"))
    # A view in the table's place: ClickHouse refuses every write of steps, as a full disk
    # or a broken table would, while the sink keeps running and retrying.
    owner.execute("DROP TABLE failslow.steps_1m_mv")
    owner.execute("DROP TABLE failslow.steps")
    owner.execute("CREATE VIEW failslow.steps AS SELECT now64(3) AS ts")
    p = Producer({"bootstrap.servers": f"127.0.0.1:{state['port']}"})
    p.produce(Topics().for_kind("step"), key=b"job0", value=encode(
        {"v": 1, "kind": "step", "ts": time.time(), "job_id": "job0", "rank": 0,
         "world_size": 1, "host": "h0", "step": 1, "duration_s": 1.0}))
    assert p.flush(10) == 0
    del p
    deadline = time.monotonic() + 30      # the sink tries within a second; 60 s of lag later
    problems, sink = _sink_problems(env)
    while not problems and time.monotonic() < deadline:
        time.sleep(0.5)
        problems, sink = _sink_problems(env)
    assert len(problems) == 1 and problems[0].startswith(
        "sink: ClickHouse refuses its writes ("), problems
    assert sink["alive"] is True and sink["metrics"]["failing writes"] >= 1

    owner.execute("DROP VIEW failslow.steps")    # the sink recreates the table and writes
    deadline = time.monotonic() + 60
    while problems and time.monotonic() < deadline:
        time.sleep(0.5)
        problems, sink = _sink_problems(env)
    assert problems == [] and sink["metrics"]["failing writes"] == 0
    assert sink["metrics"]["write errors"] >= 1           # the counter keeps the history
    _, rows = owner.query("SELECT count() FROM failslow.steps")
    assert rows[0][0] == 1
