"""The native-protocol transport against a real ClickHouse server, when one is installed.

The only server installable here is Debian's clickhouse-server 18.16 (2018). It runs
what it can: connect, columnar inserts over the native protocol, plain queries; the
failslow schema itself needs >= 23.3 and `migrate` says so. Skipped without the binary.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from failslow.stack import free_port, port_open
from failslow.storage.client import connect
from failslow.storage.errors import QueryError, StorageError
from failslow.storage.migrations import migrate

BINARY = shutil.which("clickhouse-server")
needs_server = pytest.mark.skipif(BINARY is None, reason="clickhouse-server is not installed")

CONFIG = """<yandex>
  <logger><level>warning</level><console>1</console></logger>
  <tcp_port>{tcp}</tcp_port><http_port>{http}</http_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{root}/data/</path><tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <users_config>/etc/clickhouse-server/users.xml</users_config>
  <default_profile>default</default_profile><default_database>default</default_database>
  <mark_cache_size>536870912</mark_cache_size>
</yandex>
"""


@pytest.fixture(scope="module")
def server_url(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("clickhouse-server")
    tcp = free_port()
    (root / "config.xml").write_text(CONFIG.format(tcp=tcp, http=free_port(), root=root))
    proc = subprocess.Popen([BINARY, f"--config-file={root / 'config.xml'}"],
                            stdout=(root / "out.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not port_open(tcp) and time.monotonic() < deadline:
            assert proc.poll() is None, Path(root / "out.log").read_text()
            time.sleep(0.1)
        yield f"clickhouse://default@127.0.0.1:{tcp}/failslow"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_server
def test_native_insert_and_query(server_url):
    client = connect(server_url)
    try:
        client.execute("CREATE DATABASE IF NOT EXISTS failslow")
        client.execute("CREATE TABLE IF NOT EXISTS failslow.t (ts DateTime, host String, "
                       "gpu Nullable(Int32), xid Array(Int64)) ENGINE = MergeTree ORDER BY ts")
        n = client.insert("t", {"ts": [_dt(0), _dt(1), _dt(2)], "host": ["a", "b", "c"],
                                "gpu": [0, None, 2], "xid": [[], [79], [13, 48]]})
        assert n == 3
        client.insert("t", [{"ts": _dt(3), "host": "d", "gpu": None, "xid": []}])
        cols, rows = client.query("SELECT host, gpu, xid FROM failslow.t ORDER BY ts")
        assert cols == ["host", "gpu", "xid"]
        assert rows == [("a", 0, [], ), ("b", None, [79]), ("c", 2, [13, 48]), ("d", None, [])]
        with pytest.raises(QueryError, match="Unknown identifier|UNKNOWN_IDENTIFIER|Missing"):
            client.query("SELECT nope FROM failslow.t")
    finally:
        client.close()


@needs_server
def test_schema_refuses_an_old_server_with_a_clear_reason(server_url):
    client = connect(server_url)
    try:
        with pytest.raises(StorageError, match=r"too old: the failslow schema needs ClickHouse >= 23"):
            migrate(client)
    finally:
        client.close()


@needs_server
def test_query_guard_and_the_servers_readonly_profile_agree(server_url):
    """`failslow query` on the native transport: the guard refuses the attacks that worked
    on chdb (issue 33 item 2) before the server sees them; under the readonly=1 the command
    sends, 18.16 refuses what the guard's allow-list still lets through (table functions
    at all) and every write or SET; a plain SELECT runs."""
    import os
    import sys

    env = {**os.environ, "FAILSLOW_HOME": "/nonexistent-failslow-home"}
    client = connect(server_url)
    try:
        client.execute("CREATE TABLE IF NOT EXISTS default.h (host String) ENGINE = Memory")
    finally:
        client.close()

    def query(sql: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "failslow.cli", "query", "--clickhouse",
                               server_url, "--format", "csv", sql], capture_output=True,
                              text=True, timeout=120, env=env)

    for sql, reason in (("SELECT length(\"file\"('/etc/passwd'))", "file()"),
                        ("INSERT INTO default.h (host) FORMAT TSV", "readonly"),
                        ("SELECT 1 SETTINGS readonly = 0", "SETTINGS"),
                        ("SELECT * FROM numbers(2)", "Table functions are forbidden in readonly"),
                        ("SELECT * FROM system.one, file('/etc/passwd', TSV, 'a String')",
                         "file()")):
        out = query(sql)
        assert out.returncode == 2 and reason in out.stderr, (sql, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stdout == ""
    out = query("SELECT count() AS n FROM default.h")
    assert out.returncode == 0 and out.stdout.splitlines() == ["n", "0"], out.stderr


def test_unreachable_server_is_one_clear_error():
    client = connect(f"clickhouse://default@127.0.0.1:{free_port()}/failslow")
    with pytest.raises(StorageError, match="failed"):
        client.query("SELECT 1")


def _dt(seconds: int):
    import datetime as dt

    return dt.datetime(2025, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)
