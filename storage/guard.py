"""What ``failslow query`` lets through, decided from the tokens of the SQL, not from
patterns over its text.

Read-only (the default): exactly one SELECT / WITH / SHOW / DESCRIBE / EXISTS / EXPLAIN
(of a SELECT) statement, no FORMAT, SETTINGS or INTO OUTFILE clause, a table function
only from ``READ_TABLE_FUNCTIONS`` (numbers(), values(), ...: nothing that reaches files,
the network or other servers), and no call anywhere of a function that does
(``OUTSIDE``: file(), url(), s3(), remote(), ...), however it is quoted. The engine's
own ``readonly=1`` comes on top: the server transport sends it with the query, the
embedded one appends ``SETTINGS readonly = 1`` (``readonly_sql``) — safe to append only
because the statement is known to be a query whose text ends where its last token does.
Debian's clickhouse-server 18.16 under that readonly=1 refuses every table function,
INSERT and SET (tests/test_storage_server.py): stricter than the allow-list, never looser.

``--write``: any one statement, still no call of an ``OUTSIDE`` function or engine, no
INTO OUTFILE / FROM INFILE, no BACKUP / RESTORE, and no SET / USE (on the embedded
database they would change the session the sink writes through).

The tokenizer knows ClickHouse's strings ('...', with backslash escapes and ''), quoted
identifiers ("..." and `...`), comments (-- to the end of the line, \r or \n, and /* */).
Where ClickHouse versions read text differently it refuses rather than guess: nested /*
comments, # comments, $ (heredoc strings) and non-ASCII characters outside quotes.

>>> one_statement("SELECT 1;  ")
'SELECT 1'
>>> one_statement("SELECT 1; DROP TABLE t")
Traceback (most recent call last):
...
failslow.storage.errors.QueryError: one SQL statement per call (found 2)
>>> readonly_sql('SELECT length("file"(\\'/etc/passwd\\'))')
Traceback (most recent call last):
...
failslow.storage.errors.QueryError: function file() reaches files or the network: not allowed here
"""

from __future__ import annotations

import re
from typing import NamedTuple

from failslow.storage.errors import QueryError

# Table functions (chdb 26.9's system.table_functions) and engines, dictionary sources and
# scalar functions that read or write outside the database itself; lower case.
OUTSIDE = frozenset({
    "file", "filecluster", "filesystem", "url", "urlcluster", "s3", "s3cluster", "gcs",
    "oss", "cosn", "azureblobstorage", "azureblobstoragecluster", "hdfs", "hdfscluster",
    "remote", "remotesecure", "cluster", "clusterallreplicas", "mysql", "postgresql",
    "mongodb", "redis", "sqlite", "jdbc", "odbc", "executable", "executablepool", "input",
    "dictionary", "hive", "iceberg", "icebergs3", "icebergs3cluster", "icebergazure",
    "icebergazurecluster", "iceberghdfs", "iceberghdfscluster", "iceberglocal",
    "iceberglocalcluster", "icebergcluster", "deltalake", "deltalakecluster",
    "deltalakeazure", "deltalakeazurecluster", "deltalakelocal", "deltalakes3",
    "deltalakes3cluster", "hudi", "hudicluster", "paimon", "paimonazure",
    "paimonazurecluster", "paimoncluster", "paimonhdfs", "paimonhdfscluster", "paimonlocal",
    "paimons3", "paimons3cluster", "python", "arrowstream", "ytsaurus", "bigquery", "eval",
    "prometheusquery", "prometheusqueryrange", "loop", "fuzzquery",
    # engines and dictionary sources
    "kafka", "rabbitmq", "nats", "filelog", "distributed", "s3queue", "azurequeue",
    "materializedpostgresql", "materializedmysql", "http", "clickhouse", "cassandra",
    "disk",
    # scalar functions
    "catboostevaluate", "modelevaluate",
})
# Table functions a read-only query may use: they make rows from their arguments or read
# tables of this database.
READ_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "values", "null", "view", "merge",
    "generateseries", "generate_series", "primes", "generaterandom", "format",
})
READ_STATEMENTS = frozenset({"select", "with", "show", "describe", "desc", "exists",
                             "explain"})
_EXPLAIN_WORDS = frozenset({"ast", "syntax", "query", "tree", "plan", "pipeline", "estimate",
                            "table", "override", "current", "transaction"})
_NEVER = frozenset({"set", "use", "backup", "restore"})
_CLAUSES = frozenset({"select", "from", "join", "where", "prewhere", "group", "order",
                      "having", "limit", "settings", "format", "union", "with", "on",
                      "using", "window", "qualify", "into", "except", "intersect", "array"})

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\n\r\f\v]+)
  | (?P<comment>--[^\r\n]*|/\*.*?\*/)
  | (?P<str>'(?:[^'\\]|\\.|'')*')
  | (?P<qid>"(?:[^"\\]|\\.|"")*"|`(?:[^`\\]|\\.|``)*`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<num>[0-9][A-Za-z0-9_.]*)
  | (?P<semi>;)
  | (?P<other>[-+*/%=<>!,.()\[\]{}:?^|&@~])
""", re.VERBOSE | re.DOTALL)


class Token(NamedTuple):
    kind: str   # word, qid, str, num, semi, other
    text: str
    pos: int

    @property
    def name(self) -> str:
        """A word or quoted identifier as ClickHouse names it, lower case."""
        if self.kind == "qid":
            return self.text[1:-1].replace(self.text[0] * 2, self.text[0]).lower()
        return self.text.lower()


def tokens(sql: str) -> list[Token]:
    """The tokens of ``sql`` (no whitespace, no comments), or QueryError for text that
    ClickHouse versions may read differently."""
    out = []
    pos = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        ch = sql[pos]
        if (m is None and ch in "'\"`") or (sql.startswith("/*", pos)
                                            and m is not None and m.lastgroup != "comment"):
            raise QueryError("unterminated quote or comment in SQL")
        if m is None:
            raise QueryError(f"character {ch!r} outside quotes is not allowed here "
                             "(# comments, $ heredocs and non-ASCII text are refused)")
        kind = m.lastgroup or "other"
        if kind == "comment" and "/*" in m.group()[2:]:
            raise QueryError("nested /* comments are not allowed here")
        if kind not in ("ws", "comment"):
            out.append(Token(kind, m.group(), m.start()))
        pos = m.end()
    return out


def _split(toks: list[Token]) -> list[Token]:
    statements: list[list[Token]] = [[]]
    for tok in toks:
        if tok.kind == "semi":
            statements.append([])
        else:
            statements[-1].append(tok)
    body = [s for s in statements if s]
    if len(body) != 1:
        raise QueryError(f"one SQL statement per call (found {len(body)})")
    return body[0]


def _first_word(toks: list[Token]) -> str:
    for tok in toks:
        if tok.text != "(":
            return tok.name if tok.kind == "word" else tok.text
    return ""


def _check_explained(toks: list[Token]) -> None:
    """EXPLAIN [kind] [setting = value, ...] must explain a query."""
    i = 1
    while i < len(toks) and toks[i].kind == "word" and toks[i].name in _EXPLAIN_WORDS:
        i += 1
    while i + 2 < len(toks) and toks[i].kind == "word" and toks[i + 1].text == "=":
        i += 3
        if i < len(toks) and toks[i].text == ",":
            i += 1
    if _first_word(toks[i:]) not in ("select", "with"):
        raise QueryError("EXPLAIN explains a SELECT here")


def _check_calls(toks: list[Token], write: bool) -> None:
    clause = ["select"]  # the clause at each parenthesis depth
    for i, tok in enumerate(toks):
        prev = toks[i - 1] if i else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if tok.text == "(":
            clause.append("select")
        elif tok.text == ")" and len(clause) > 1:
            clause.pop()
        if tok.kind == "word":
            word = tok.name
            if word == "outfile" and prev is not None and prev.name == "into":
                raise QueryError("INTO OUTFILE writes files: not allowed here")
            if word == "infile" and prev is not None and prev.name == "from":
                raise QueryError("FROM INFILE reads files: not allowed here")
            if word in _CLAUSES and (nxt is None or nxt.text != "("):
                if not (word == "join" and prev is not None and prev.name == "array"):
                    clause[-1] = word
                if not write and word in ("format", "settings"):
                    raise QueryError(f"{word.upper()} clause not allowed here (the output "
                                     "format is --format's; the query runs under readonly=1)")
        if tok.kind not in ("word", "qid") or nxt is None or nxt.text != "(":
            continue
        if tok.kind == "qid" and "\\" in tok.text:
            raise QueryError("a quoted function name with escapes is not allowed here")
        name = tok.name
        if name in OUTSIDE:
            raise QueryError(f"function {name}() reaches files or the network: "
                             "not allowed here")
        in_from = prev is not None and (prev.name in ("from", "join") or (
            prev.text == "," and clause[-1] in ("from", "join")))
        if in_from and not (i >= 2 and toks[i - 2].name == "array") and \
                not write and name not in READ_TABLE_FUNCTIONS:
            raise QueryError(f"table function {name}() is not allowed here (only "
                             f"{', '.join(sorted(READ_TABLE_FUNCTIONS))})")


def check(sql: str, write: bool = False) -> str:
    """``sql`` as exactly one statement that ``failslow query`` may run (a trailing ``;``
    and comments after the last token dropped), or QueryError saying why not."""
    toks = _split(tokens(sql))
    first = _first_word(toks)
    if first in _NEVER:
        raise QueryError(f"{first.upper()} is not allowed here")
    if not write:
        if first not in READ_STATEMENTS:
            raise QueryError(f"only SELECT, WITH, SHOW, DESCRIBE, EXISTS or EXPLAIN without "
                             f"--write (got {first.upper() or 'nothing'}; the database is "
                             "readonly here)")
        if first == "explain":
            _check_explained(toks)
    _check_calls(toks, write)
    last = toks[-1]
    return sql[: last.pos + len(last.text)].strip()


def one_statement(sql: str) -> str:
    """``sql`` as one statement that may change data (``--write``): ``check(sql, True)``."""
    return check(sql, write=True)


def readonly_sql(sql: str) -> str:
    """One read-only statement under the engine's ``readonly = 1`` (for transports that take
    settings only inside the SQL)."""
    return check(sql) + "\nSETTINGS readonly = 1"
