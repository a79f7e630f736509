"""ClickHouse security: TLS to a real server (Debian's clickhouse-server 18.16 serves TLS on
its secure native port), the password from a variable or a file, `failslow query`
read-only by default on both transports, and secrets masked in errors and stack.json."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import orjson
import pytest
from tls_support import make_ca

from failslow.stack import free_port, port_open

BINARY = shutil.which("clickhouse-server")
needs_server = pytest.mark.skipif(BINARY is None, reason="clickhouse-server is not installed")
PASSWORD = "hunter2-ch"

USERS = """<yandex><profiles><default/></profiles><quotas><default/></quotas>
<users><app><password>{password}</password><networks><ip>127.0.0.1</ip></networks>
<profile>default</profile><quota>default</quota></app></users></yandex>
"""
CONFIG = """<yandex>
  <logger><level>warning</level><console>1</console></logger>
  <tcp_port_secure>{tcp}</tcp_port_secure><http_port>{http}</http_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{root}/data/</path><tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile><default_database>default</default_database>
  <mark_cache_size>536870912</mark_cache_size>
  <openSSL><server><certificateFile>{cert}</certificateFile><privateKeyFile>{key}</privateKeyFile>
    <verificationMode>none</verificationMode><loadDefaultCAFile>false</loadDefaultCAFile>
    <disableProtocols>sslv2,sslv3</disableProtocols></server></openSSL>
</yandex>
"""


def failslow(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "FAILSLOW_HOME": "/nonexistent-failslow-home", **(env or {})}
    return subprocess.run([sys.executable, "-m", "failslow.cli", *args], capture_output=True,
                          text=True, timeout=120, env=full)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("clickhouse-tls")
    ca = make_ca(root / "ca")
    tcp = free_port()
    (root / "users.xml").write_text(USERS.format(password=PASSWORD))
    (root / "config.xml").write_text(CONFIG.format(tcp=tcp, http=free_port(), root=root,
                                                   cert=ca.server_cert, key=ca.server_key))
    proc = subprocess.Popen([BINARY, f"--config-file={root / 'config.xml'}"],
                            stdout=(root / "out.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not port_open(tcp) and time.monotonic() < deadline:
            assert proc.poll() is None, (root / "out.log").read_text()
            time.sleep(0.1)
        yield ca, tcp
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_server
def test_tls_with_password_from_variable_or_file(tls_server, tmp_path):
    ca, port = tls_server
    pw_file = tmp_path / "pw"
    pw_file.write_text(PASSWORD + "\n")
    for url, env, extra in (
        (f"clickhouses://app@localhost:{port}/default", {"FAILSLOW_CLICKHOUSE_PASSWORD": PASSWORD},
         ["--clickhouse-ca-file", str(ca.ca)]),
        (f"clickhouse://app@127.0.0.1:{port}/default?secure=1",
         {"FAILSLOW_CLICKHOUSE_CA_FILE": str(ca.ca)}, ["--clickhouse-password-file", str(pw_file)]),
    ):
        out = failslow("query", "--clickhouse", url, *extra, "--format", "json",
                       "SELECT version() AS v", env=env)
        assert out.returncode == 0, out.stderr
        assert orjson.loads(out.stdout)["v"].startswith("18.16")
    # A CA that did not sign the server's certificate: refused, one line, no password.
    out = failslow("query", "--clickhouse", f"clickhouses://app:{PASSWORD}@localhost:{port}/default",
                   "--clickhouse-ca-file", str(ca.other_ca), "SELECT 1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert PASSWORD not in out.stderr and "***" in out.stderr
    # Verification off (documented as unsafe) connects with any CA.
    out = failslow("query", "--clickhouse", f"clickhouses://app@localhost:{port}/default",
                   "--clickhouse-no-verify", "SELECT 1",
                   env={"FAILSLOW_CLICKHOUSE_PASSWORD": PASSWORD})
    assert out.returncode == 0, out.stderr


@needs_server
def test_query_is_readonly_on_the_server_unless_write(tls_server):
    ca, port = tls_server
    conn = ["--clickhouse", f"clickhouses://app@localhost:{port}/default", "--clickhouse-ca-file",
            str(ca.ca)]
    env = {"FAILSLOW_CLICKHOUSE_PASSWORD": PASSWORD}
    refused = failslow("query", *conn, "CREATE TABLE default.t (a UInt8) ENGINE = Memory", env=env)
    assert refused.returncode == 2 and "readonly" in refused.stderr.lower()
    made = failslow("query", *conn, "--write", "CREATE TABLE default.t (a UInt8) ENGINE = Memory",
                    env=env)
    assert made.returncode == 0, made.stderr
    assert failslow("query", *conn, "DROP TABLE default.t", env=env).returncode == 2
    exists = failslow("query", *conn, "--format", "csv", "EXISTS TABLE default.t", env=env)
    assert exists.stdout.splitlines()[-1] == "1"
    assert failslow("query", *conn, "--write", "DROP TABLE default.t", env=env).returncode == 0


@pytest.mark.integration
def test_query_on_chdb_is_readonly_one_statement_and_stays_inside(tmp_path):
    url = f"chdb://{tmp_path / 'db'}"
    assert failslow("migrate", "--clickhouse", url).returncode == 0
    (tmp_path / "secret.csv").write_text("top secret\n")
    for sql, reason in (
        ("DROP TABLE failslow.host", "readonly"),
        ("INSERT INTO failslow.host (ts, host) SELECT now(), 'x'", "readonly"),
        ("SELECT 1; DROP TABLE failslow.host", "one SQL statement"),
        (f"SELECT * FROM file('{tmp_path / 'secret.csv'}', 'LineAsString')", "file()"),
        ("SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')", "url()"),
        ("SELECT 1 INTO OUTFILE '/tmp/x.csv'", "OUTFILE"),
        ("SELECT 1 -- a trailing comment cannot hide the setting", None),
    ):
        out = failslow("query", "--clickhouse", url, sql)
        if reason is None:
            assert out.returncode == 0, out.stderr
            continue
        assert out.returncode == 2 and reason.lower() in out.stderr.lower(), (sql, out.stderr)
    tables = failslow("query", "--clickhouse", url, "--format", "csv",
                      "SELECT count() FROM system.tables WHERE database = 'failslow' AND name = 'host'")
    assert tables.stdout.splitlines()[-1] == "1"
    # --write allows changes, still one statement and still no outside table functions.
    assert failslow("query", "--clickhouse", url, "--write",
                    "CREATE TABLE failslow.scratch (a UInt8) ENGINE = Memory").returncode == 0
    assert failslow("query", "--clickhouse", url, "--write",
                    f"SELECT * FROM file('{tmp_path / 'secret.csv'}', 'LineAsString')").returncode == 2


@pytest.mark.integration
def test_secrets_are_masked_and_state_is_private(tmp_path):
    bad = failslow("query", "--clickhouse", f"clickhouse://u:{PASSWORD}@127.0.0.1:{free_port()}/db",
                   "SELECT 1")
    assert bad.returncode == 2 and PASSWORD not in bad.stderr
    bad = failslow("query", "--clickhouse", f"clickhouse://u:{PASSWORD}@127.0.0.1:notaport/db",
                   "SELECT 1")
    assert bad.returncode == 2 and PASSWORD not in bad.stderr and "bad port" in bad.stderr
    home = tmp_path / "home"
    env = {"FAILSLOW_HOME": str(home),
           "FAILSLOW_CLICKHOUSE": f"clickhouse://u:{PASSWORD}@127.0.0.1:9000/failslow"}
    up = failslow("up", "--port", "0", env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert PASSWORD not in up.stdout + up.stderr
        state = home / "stack.json"
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
        assert PASSWORD not in state.read_text() and "u:***@" in state.read_text()
    finally:
        assert failslow("down", env=env).returncode == 0


def test_write_state_is_never_readable_by_others(tmp_path):
    from failslow.stack import write_state

    old = os.umask(0)
    try:
        write_state(tmp_path / "h", {"port": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "h" / "stack.json").stat().st_mode) == 0o600
    assert orjson.loads((tmp_path / "h" / "stack.json").read_bytes()) == {"port": 1}
