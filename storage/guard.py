"""What ``failslow query`` lets through: one statement, no table function (or INTO
OUTFILE) that reaches files or the network, and read-only unless asked otherwise.

Read-only is the engine's own ``readonly`` setting, not a guess from the SQL text: the
server transport sends it with the query, the embedded one appends a ``SETTINGS
readonly=1`` clause (on a line of its own, so a trailing comment cannot swallow it).
The scan here only splits statements and finds function names; it knows ClickHouse's
quoting ('...', "...", `...`) and comments (--, #, /* */).

>>> one_statement("SELECT 1;  ")
'SELECT 1'
>>> one_statement("SELECT 1; DROP TABLE t")
Traceback (most recent call last):
...
storage.errors.QueryError: one SQL statement per call (found 2)
>>> one_statement("SELECT * FROM url('http://x', CSV)")
Traceback (most recent call last):
...
storage.errors.QueryError: table function url() reaches files or the network: not allowed here
"""

from __future__ import annotations

import re

from failslow.storage.errors import QueryError

# Table functions (and engines) that read or write outside the database itself.
OUTSIDE = frozenset({
    "file", "url", "urlcluster", "s3", "s3cluster", "gcs", "oss", "cosn", "azureblobstorage",
    "azureblobstoragecluster", "hdfs", "hdfscluster", "remote", "remotesecure", "cluster",
    "clusterallreplicas", "mysql", "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc",
    "executable", "input", "dictionary", "hive", "iceberg", "icebergs3", "icebergazure",
    "icebergcluster", "deltalake", "deltalakecluster", "hudi", "hudicluster", "filecluster",
    "python", "arrowstream", "ytsaurus",
})
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|\#[^\n]*|/\*.*?\*/)
  | (?P<str>'(?:[^'\\]|\\.|'')*')
  | (?P<qid>"(?:[^"\\]|\\.|"")*"|`(?:[^`\\]|\\.|``)*`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<semi>;)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


def _tokens(sql: str) -> list[tuple[str, str, int]]:
    out = []
    pos = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None or (m.lastgroup == "other" and sql[pos] in "'\"`/"
                         and (sql[pos] != "/" or sql.startswith("/*", pos))):
            raise QueryError("unterminated quote or comment in SQL")
        kind = m.lastgroup or "other"
        if kind not in ("ws", "comment"):
            out.append((kind, m.group(), m.start()))
        pos = m.end()
    return out


def one_statement(sql: str) -> str:
    """``sql`` as exactly one statement (a trailing ``;`` dropped), or QueryError."""
    toks = _tokens(sql)
    statements = [[]]  # type: list[list[tuple[str, str, int]]]
    for tok in toks:
        if tok[0] == "semi":
            statements.append([])
        else:
            statements[-1].append(tok)
    body = [s for s in statements if s]
    if len(body) != 1:
        raise QueryError(f"one SQL statement per call (found {len(body)})")
    words = body[0]
    for i, (kind, text, _) in enumerate(words):
        if kind != "word":
            continue
        nxt = words[i + 1][1] if i + 1 < len(words) else ""
        if nxt == "(" and text.lower() in OUTSIDE:
            raise QueryError(f"table function {text}() reaches files or the network: "
                             "not allowed here")
        if text.lower() == "outfile" and i and words[i - 1][1].lower() == "into":
            raise QueryError("INTO OUTFILE writes files: not allowed here")
    last = words[-1]
    return sql[: last[2] + len(last[1])].strip()


def readonly_sql(sql: str) -> str:
    """One statement under the engine's ``readonly=1`` (for transports that take settings
    only inside the SQL). A statement that already has a SETTINGS clause fails to parse
    rather than run with its own settings."""
    return one_statement(sql) + "\nSETTINGS readonly = 1"
