"""`failslow migrate` / `query` / `sink` as processes, and reads of a folder owned by
another process through its query endpoint (chdb allows one process per folder)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from storage_support import ch, minimal_event, shared_folder  # noqa: F401 - fixture

from failslow.schema import encode
from failslow.storage.errors import QueryError
from failslow.storage.serve import QueryServer, RemoteClient, find_owner, owner_file
from failslow.storage.writer import Writer


def failslow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAILSLOW_HOME": "/nonexistent-failslow-home"}
    return subprocess.run([sys.executable, "-m", "failslow.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.integration
def test_migrate_and_query_on_a_fresh_folder(tmp_path: Path):
    url = f"chdb://{tmp_path / 'db'}"
    first = failslow("migrate", "--clickhouse", url)
    assert first.returncode == 0 and "applied migrations 1, 2, 3, 4" in first.stdout
    again = failslow("migrate", "--clickhouse", url)
    assert again.returncode == 0 and "up to date" in again.stdout
    out = failslow("query", "--clickhouse", url, "--format", "json",
                   "SELECT version, name FROM schema_migrations FINAL WHERE version = {v:UInt32}",
                   "--param", "v=2")
    assert out.returncode == 0, out.stderr
    assert [orjson.loads(line) for line in out.stdout.splitlines()] == [
        {"version": 2, "name": "incidents and incidents_current"}]
    bad = failslow("query", "--clickhouse", url, "SELEC 1 FROM nowhere")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("failslow query: ") and bad.stderr.count("\n") == 1


def test_query_goes_through_the_owner_of_a_busy_folder(ch):  # noqa: F811
    """This pytest process owns the shared folder; another process reads it via HTTP."""
    Writer(ch).write([minimal_event("host", i) for i in range(3)])
    server = QueryServer(ch).start()
    try:
        url = f"chdb://{shared_folder()}?database={ch.database}"
        out = failslow("query", "--clickhouse", url, "--format", "csv",
                       "SELECT host, ts FROM host ORDER BY ts")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [
            "host,ts", "host-0,2023-11-14 22:13:20.250", "host-1,2023-11-14 22:13:21.250",
            "host-2,2023-11-14 22:13:22.250"]
        bad = failslow("query", "--clickhouse", url, "SELECT nope FROM host")
        assert bad.returncode == 2 and "UNKNOWN_IDENTIFIER" in bad.stderr

        # The same endpoint in-process: typed results and inserts both ways.
        owner = find_owner(shared_folder())
        assert owner is not None and owner["port"] == server.port
        remote = RemoteClient(ch.url, owner)
        assert remote.insert("host", Writer(ch)._convert("host", [minimal_event("host", 9)])) == 1
        cols, rows = remote.query("SELECT count() AS n, max(ts) AS last FROM host")
        assert cols == ["n", "last"] and rows[0][0] == 4 and rows[0][1].year == 2023
        with pytest.raises(QueryError, match="UNKNOWN_TABLE"):
            remote.query("SELECT 1 FROM no_such_table")
    finally:
        server.stop()
    assert not owner_file(shared_folder()).exists()


def test_sink_process_stops_cleanly_on_sigterm(broker, topics, tmp_path: Path):
    url = f"chdb://{tmp_path / 'db'}"
    events = [minimal_event("step", i) for i in range(100)]
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(0, 100, 25):
        p.produce(topics.for_kind("step"), encode(events[i:i + 25]), key=b"job0")
    assert p.flush(15) == 0
    env = {**os.environ, "FAILSLOW_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "failslow.cli", "sink", "--clickhouse", url, "--bootstrap",
         broker.bootstrap, "--topic-prefix", topics.prefix, "--group", f"g{uuid.uuid4().hex}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # While the sink owns the folder, `failslow query` reads through it.
        deadline = time.monotonic() + 60
        count = None
        while time.monotonic() < deadline and count != "100":
            time.sleep(0.5)
            out = failslow("query", "--clickhouse", url, "--format", "csv",
                           "SELECT count() FROM steps")
            count = out.stdout.splitlines()[-1] if out.returncode == 0 else None
        assert count == "100"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert orjson.loads(stdout.splitlines()[-1])["sink"]["events"] == 100
    assert not owner_file(tmp_path / "db").exists()
    # The folder is free again: a new process opens it directly, the data is there.
    out = failslow("query", "--clickhouse", url, "--format", "csv", "SELECT count() FROM steps")
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "100"
