"""`failslow query` is read-only and stays inside the database (issue 33 item 2): the guard
decides from the tokens of the SQL, and the two attacks that worked on the embedded
database (a data line smuggled by INSERT ... FORMAT, file() behind a quoted name) fail."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from failslow.storage.errors import QueryError
from failslow.storage.guard import check, one_statement, readonly_sql, tokens
from failslow.storage.presets import PRESETS

REFUSED_READONLY = [
    ("INSERT INTO failslow.host (host) FORMAT TSV", "readonly"),
    ("insert into failslow.host select now(), 'x'", "readonly"),
    ("  ( DROP TABLE failslow.host)", "readonly"),
    ("SELECT length(\"file\"('/etc/passwd'))", "file()"),
    ("SELECT length(`file`('/etc/passwd'))", "file()"),
    ("SELECT FILE /* a comment between */ ('/etc/passwd')", "file()"),
    ("SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')", "url()"),
    ("SELECT * FROM failslow.host, s3('http://x/y')", "s3()"),
    ("SELECT * FROM \"remoteSecure\"('h:9440', system.one)", "remotesecure()"),
    ("SELECT * FROM filesystem('/')", "filesystem()"),
    ("SELECT * FROM python(x)", "python()"),
    ("SELECT * FROM a_future_table_function('x')", "table function"),
    ("SELECT * FROM numbers(1) AS n JOIN somethingNew(2) AS m ON 1", "table function"),
    ("SELECT 1 FORMAT TSV", "FORMAT"),
    ("SELECT 1 SETTINGS readonly = 0", "SETTINGS"),
    ("SELECT * FROM (SELECT 1 SETTINGS readonly = 0)", "SETTINGS"),
    ("SELECT 1 INTO OUTFILE '/tmp/x.csv'", "OUTFILE"),
    ("EXPLAIN SYNTAX INSERT INTO failslow.host (host) FORMAT TSV", "EXPLAIN"),
    ("SELECT 1; SELECT 2", "one SQL statement"),
    ("SELECT 1 /* /* */ 'x */ , file('/etc/passwd') -- '", "nested"),
    ("SELECT 1 # comment", "'#'"),
    ("SELECT 1 -- a line comment ends at a carriage return too\r, file('/etc/passwd')", "file()"),
    ("SELECT $$abc$$", "'$'"),
    ("SELECT 1\u00a0", "non-ascii"),
    ("SELECT 'unterminated", "unterminated"),
    ("SELECT 1 /* unterminated", "unterminated"),
    ("SELECT \"fi\\le\"('x')", "escapes"),
    ("SET readonly = 0", "SET"),
]

ALLOWED_READONLY = [
    "SELECT * FROM numbers(3)",
    "select format('{}-{}', 1, 2) AS s, 'file(' AS f, \"url\" FROM t -- file('/etc/passwd')",
    "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SELECT arr FROM t ARRAY JOIN arrayMap(x -> x * 2, a) AS arr",
    "SELECT * FROM t, numbers(2) WHERE t.a = {a:Int32}",
    "SHOW TABLES FROM failslow",
    "DESCRIBE TABLE failslow.steps",
    "EXISTS TABLE failslow.steps",
    "EXPLAIN PLAN header = 1 SELECT count() FROM failslow.steps",
    "SELECT 1;",
]


@pytest.mark.parametrize(("sql", "reason"), REFUSED_READONLY)
def test_readonly_refuses(sql, reason):
    with pytest.raises(QueryError) as err:
        readonly_sql(sql)
    assert reason.lower() in str(err.value).lower(), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("sql", ALLOWED_READONLY)
def test_readonly_allows_queries(sql):
    out = readonly_sql(sql)
    assert out.endswith("\nSETTINGS readonly = 1")
    assert out.startswith(sql.rstrip(";").split(" --")[0].rstrip())


def test_every_preset_passes_the_readonly_guard():
    for preset in PRESETS.values():
        assert check(preset.sql).startswith(preset.sql.strip()[:20]), preset.name


def test_write_allows_changes_but_never_the_outside():
    assert one_statement("INSERT INTO t SELECT * FROM generateRandom('a UInt8') LIMIT 1")
    assert one_statement("CREATE TABLE t (a UInt8) ENGINE = Memory;") == \
        "CREATE TABLE t (a UInt8) ENGINE = Memory"
    for sql, reason in (
        ("CREATE TABLE t (a String) ENGINE = File(CSV)", "file()"),
        ("CREATE TABLE t (a String) ENGINE = URL('http://x', CSV)", "url()"),
        ("INSERT INTO FUNCTION file('/tmp/x', CSV) SELECT 1", "file()"),
        ("INSERT INTO t FROM INFILE '/etc/passwd' FORMAT LineAsString", "INFILE"),
        ("CREATE DICTIONARY d (k UInt64) PRIMARY KEY k SOURCE(HTTP(url 'http://x' "
         "format 'TSV')) LAYOUT(FLAT()) LIFETIME(0)", "http()"),
        ("BACKUP TABLE t TO Disk('backups', '1.zip')", "BACKUP"),
        ("USE system", "USE"),
        ("SET readonly = 0", "SET"),
    ):
        with pytest.raises(QueryError, match="(?i)" + reason.replace("(", r"\(")
                           .replace(")", r"\)")):
            check(sql, write=True)


def test_tokens_keep_strings_and_quoted_names_whole():
    toks = tokens("SELECT 'it''s -- not a comment', \"a \"\"b\"\"\" FROM t /* c */ -- d")
    assert [t.kind for t in toks] == ["word", "str", "other", "qid", "word", "word"]
    assert toks[3].name == 'a "b"'


def _failslow(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAILSLOW_HOME": "/nonexistent-failslow-home"}
    return subprocess.run([sys.executable, "-m", "failslow.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.integration
def test_query_on_chdb_neither_writes_a_smuggled_row_nor_reads_files(tmp_path):
    url = f"chdb://{tmp_path / 'db'}"
    assert _failslow("migrate", "--clickhouse", url).returncode == 0
    # The data line of INSERT ... FORMAT TSV was the appended SETTINGS line: it wrote a row.
    out = _failslow("query", "--clickhouse", url, "INSERT INTO failslow.host (host) FORMAT TSV")
    assert out.returncode == 2 and "readonly" in out.stderr, out.stderr
    out = _failslow("query", "--clickhouse", url, "SELECT length(\"file\"('/etc/passwd')) AS n")
    assert out.returncode == 2 and "file()" in out.stderr and out.stdout == "", out.stdout
    out = _failslow("query", "--clickhouse", url, "--format", "csv",
                    "SELECT count() AS n FROM failslow.host")
    assert out.returncode == 0 and out.stdout.splitlines() == ["n", "0"], out.stderr
