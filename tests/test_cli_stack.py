"""`failslow up` / `down` through the real command line, and the CLI's contract:
every command has --help, bad input is one line and a non-zero exit."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from failslow import demo
from failslow.cli import COMMANDS
from failslow.config import BROKER, CLICKHOUSE, HOME, KAFKA_SECURITY, flag_sets
from failslow.stack import free_port, pid_alive, port_open
from failslow.storage.serve import find_owner


def fs(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "failslow.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


# one flag of each set, in --help exactly when the command reads that set
SET_FLAGS = {HOME: "--home", BROKER: "--bootstrap", KAFKA_SECURITY: "--kafka-sasl-mechanism",
             CLICKHOUSE: "--clickhouse"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_prints_help_with_only_the_flags_it_reads(command):
    out = fs(command, "--help")
    assert out.returncode == 0, out.stderr
    assert f"failslow {command}" in out.stdout
    for name, flag in SET_FLAGS.items():
        assert (f"{flag} " in out.stdout) == (name in flag_sets(command)), (command, flag)


def test_offline_commands_list_no_kafka_flags():
    assert not flag_sets("detect")
    assert KAFKA_SECURITY not in flag_sets("report") and BROKER not in flag_sets("report")
    assert CLICKHOUSE not in flag_sets("replay") and KAFKA_SECURITY in flag_sets("replay")


@pytest.mark.parametrize("args", [
    ["detect", "/nonexistent/trace.jsonl"],
    ["simulate", "no-such-scenario", "--out", "/tmp/x.jsonl"],
    ["demo", "--speed", "0"],
    ["query", "--clickhouse", "mysql://nope", "SELECT 1"],
])
def test_bad_input_is_one_line_and_nonzero(args):
    out = fs(*args)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"failslow {args[0]}:"), out.stderr


@pytest.mark.integration
def test_up_twice_then_query_then_down(tmp_path):
    home = tmp_path / "home"
    port = free_port()
    env = {"FAILSLOW_HOME": str(home)}
    try:
        first = fs("up", "--port", str(port), env=env)
        assert first.returncode == 0, first.stderr
        state = orjson.loads((home / "stack.json").read_bytes())
        assert state["port"] == port and pid_alive(state["pid"]) and port_open(port)
        second = fs("up", "--port", str(port), env=env)
        assert second.returncode == 0 and "already running" in second.stdout
        # `up` returns once the background sink owns the chdb folder with the schema
        # applied; `query` reads through it at once.
        out = fs("query", "--format", "json", "SELECT count() AS n FROM failslow.incidents",
                 env=env)
        assert out.returncode == 0, out.stderr
        assert orjson.loads(out.stdout.splitlines()[0]) == {"n": 0}
        assert find_owner(home / "chdb")["pid"] == state["db_pid"]
    finally:
        down = fs("down", env=env)
    assert down.returncode == 0 and "broker" in down.stdout
    assert not port_open(port) and not pid_alive(state["pid"]) and not pid_alive(state["db_pid"])
    assert not (home / "stack.json").exists()


@pytest.mark.integration
def test_up_refuses_a_taken_port(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        out = fs("up", "--port", str(s.getsockname()[1]), env={"FAILSLOW_HOME": str(tmp_path)})
    assert out.returncode == 2 and "already taken" in out.stderr


@pytest.mark.integration
def test_up_recovers_after_the_broker_was_killed(tmp_path):
    # kill -9 of the embedded broker leaves its sink running (it owns the chdb folder):
    # the next `up` stops that orphan and starts a whole stack, instead of failing on
    # the locked folder.
    import signal

    home = tmp_path / "home"
    env = {"FAILSLOW_HOME": str(home)}
    first = fs("up", "--port", "0", env=env)
    assert first.returncode == 0, first.stderr
    old = orjson.loads((home / "stack.json").read_bytes())
    try:
        os.kill(old["pid"], signal.SIGKILL)
        again = fs("up", "--port", "0", env=env)
        assert again.returncode == 0, again.stderr
        assert f"stopped the database (sink) pid {old['db_pid']}" in again.stdout
        new = orjson.loads((home / "stack.json").read_bytes())
        assert not pid_alive(old["db_pid"]) and pid_alive(new["db_pid"])
        out = fs("query", "--format", "json", "SELECT count() AS n FROM failslow.incidents",
                 env=env)
        assert out.returncode == 0, out.stderr
    finally:
        fs("down", env=env)
        for pid in (old["pid"], old["db_pid"]):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
def test_down_keeps_what_the_broker_acknowledged(tmp_path):
    # A collector publishes while `down` runs: every event the embedded broker
    # acknowledged must be in ClickHouse afterwards (the rest stays in the collector's
    # spool for the next `up`). The broker stops first, then the sink writes what it read.
    import threading
    import time

    from failslow.collectors.publisher import Publisher
    from failslow.schema import Topics
    from failslow.storage.client import connect

    home = tmp_path / "home"
    env = {"FAILSLOW_HOME": str(home)}
    up = fs("up", "--port", "0", env=env)
    assert up.returncode == 0, up.stderr
    state = orjson.loads((home / "stack.json").read_bytes())
    pub = Publisher(f"127.0.0.1:{state['port']}", Topics(), spool_dir=str(tmp_path / "spool"),
                    delivery_timeout_s=1.0, linger_ms=5)
    stop = threading.Event()

    def collect() -> None:
        i = 0
        while not stop.is_set():
            pub.publish([{"v": 1, "kind": "host", "ts": 1.7e9 + i * 0.01, "host": "h0",
                          "procs_running": i}])
            i += 1
            time.sleep(0.01)

    thread = threading.Thread(target=collect)
    thread.start()
    try:
        time.sleep(3)
        down = fs("down", env=env)
        assert down.returncode == 0, down.stderr
    finally:
        stop.set()
        thread.join()
    pub.close(timeout=2)
    delivered = pub.stats["delivered"]
    client = connect(f"chdb://{home / 'chdb'}", own=True)
    try:
        _, rows = client.query("SELECT count() FROM failslow.host")
    finally:
        client.close()
    assert delivered > 100
    # One sink fetch (100 ms) of events can be acknowledged and not yet read when the
    # broker stops; not the ~7 s its SIGTERM takes.
    assert rows[0][0] >= delivered - 30, (rows, delivered)


@pytest.mark.integration
def test_demo_ends_cleanly_with_commands_that_run_as_printed(tmp_path):
    # FAILSLOW_KAFKA_* describe a real (TLS) Kafka; the demo's embedded Tansu is plaintext,
    # for the demo process and for the worker it starts, as for `failslow up`.
    env = {**os.environ, "FAILSLOW_HOME": str(tmp_path / "home"),
           "FAILSLOW_KAFKA_SECURITY_PROTOCOL": "SSL"}
    # the console script `make demo` runs, with no virtualenv active: not on PATH
    script = Path(sys.executable).parent / "failslow"
    bin_dir = str(script.parent)
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d != bin_dir)
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "failslow.cli"]
    out = subprocess.run([*cmd, "demo", "--steps", "40", "--speed", "8"], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    assert "summary" in out.stdout and "error:" not in out.stdout
    # published as the 8 host agents would (a batch per host and window), stored per rank:
    # every rank's every step
    assert "published as its 8 hosts' agents publish" in out.stdout
    assert "rows in ClickHouse: steps 2,560," in out.stdout, out.stdout[-2000:]
    worker_log = (tmp_path / "home" / "demo" / "worker.log").read_text(errors="replace")
    assert "SSL" not in worker_log and "ssl" not in worker_log.lower(), worker_log[-2000:]
    # no librdkafka complaint (a client outliving the broker) anywhere, last line included
    assert "rdkafka" not in out.stdout + out.stderr, out.stderr[-2000:]
    lines = out.stdout.rstrip().splitlines()
    cmds = [ln.strip() for ln in lines[lines.index(next(
        ln for ln in lines if ln.startswith("where to look"))) + 1:]]
    assert len(cmds) >= 6 and all(c.startswith(cmd[0]) for c in cmds), cmds
    assert any(" report " in c and "--job" in c for c in cmds), cmds
    for c in cmds:
        ran = subprocess.run(["bash", "-c", c], capture_output=True, text=True, timeout=120,
                             env=env, cwd=tmp_path)
        assert ran.returncode == 0, (c, ran.stderr[-2000:])
        assert ran.stdout.strip() or "wrote failslow-report-" in ran.stderr, c
    assert (tmp_path / "failslow-report-job-llm-pretrain-7b.html").exists()


def test_printed_commands_name_the_console_script_that_runs(monkeypatch, tmp_path):
    # `make demo` from the clone: .venv/bin/failslow, no virtualenv active
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "failslow").write_text("#!/bin/sh\n")
    (bin_dir / "failslow").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [".venv/bin/failslow", "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert demo.cli_prefix() == ".venv/bin/failslow"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")      # an activated virtualenv
    assert demo.cli_prefix() == "failslow"
    monkeypatch.setattr(sys, "argv", ["/somewhere/failslow/cli.py"])  # python -m failslow.cli
    assert demo.cli_prefix().endswith(" -m failslow.cli")
    cmds = demo.next_commands(Path("/data/my demo/chdb"), {"job_ids": ["j 1"]},
                              [{"severity": "critical", "incident_id": "j 1:slow_rank:r3:9"}],
                              comm=True)
    assert all(shlex.split(c)[shlex.split(c).index("--clickhouse") + 1]
               == "chdb:///data/my demo/chdb" for c in cmds)
    assert shlex.split(cmds[-1])[-1] == "j 1:slow_rank:r3:9"
