"""`failslow query SQL`: run SQL against the configured ClickHouse and print the result.

`failslow query --preset NAME [--param K=V ...]` runs one of the ready-made questions
of storage.presets (its parameters checked and bound, never pasted into the SQL);
`--list-presets` names them.

One statement per call, read-only unless ``--write``, never a function that reaches
files or the network: storage.guard tokenizes the SQL and decides.

With a chdb URL the query goes through the folder's owner (the running sink) when
there is one, else the folder is opened directly (see storage.client.connect).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
from typing import Any

import orjson

from failslow.errors import ConfigError

HELP = "run SQL against the configured ClickHouse"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", nargs="?", help="one SQL statement; unqualified tables are "
                        "in the configured database, e.g. \"SELECT * FROM incidents_current\"")
    parser.add_argument("--preset", metavar="NAME",
                        help="run a ready-made query instead of SQL (--list-presets)")
    parser.add_argument("--list-presets", action="store_true",
                        help="name each preset with its parameters, one line each, and exit")
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table",
                        help="table (default), json (one object per line) or csv")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="value for a {NAME:Type} placeholder in SQL, or a preset's "
                        "parameter (repeatable)")
    parser.add_argument("--write", action="store_true",
                        help="allow statements that change data or schema (default: the "
                        "engine's readonly=1; `failslow migrate` is the way to change the schema)")


def _params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"--param wants NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return str(value)


def render_table(columns: list[str], rows: list[tuple], out: Any) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    out.write("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for r in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def render(columns: list[str], rows: list[tuple], fmt: str, out: Any = sys.stdout) -> None:
    if fmt == "json":
        for row in rows:
            out.write(orjson.dumps(dict(zip(columns, row, strict=True)), default=str,
                                   option=orjson.OPT_NAIVE_UTC).decode() + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else _cell(v) for v in row] for row in rows])
    elif columns:
        render_table(columns, rows, out)


def list_presets(out: Any = sys.stdout) -> None:
    from failslow.storage.presets import PRESETS

    width = max(len(name) for name in PRESETS)
    for p in PRESETS.values():
        args = " ".join(f"{x.name}=" + ("..." if x.default is None else f"[{x.default}]")
                        for x in p.params)
        out.write(f"{p.name:<{width}}  {p.summary}  ({args})\n")


def _statement(args: argparse.Namespace) -> tuple[str, dict[str, Any] | None]:
    from failslow.storage.presets import bind, get

    if args.preset:
        if args.sql:
            raise ConfigError("give SQL or --preset, not both")
        if args.write:
            raise ConfigError("presets only read: --write does not apply")
        preset = get(args.preset)
        return preset.sql.strip(), bind(preset, _params(args.param))
    if not args.sql:
        raise ConfigError("give one SQL statement, --preset NAME or --list-presets")
    return args.sql, _params(args.param) or None


def run(args: argparse.Namespace) -> int:
    from failslow.config import clickhouse_url, resolve
    from failslow.storage.client import connect
    from failslow.storage.guard import check, readonly_sql
    from failslow.storage.url import parse

    if args.list_presets:
        list_presets()
        return 0
    url = clickhouse_url(resolve(args))
    text, params = _statement(args)
    server = parse(url).scheme == "clickhouse"
    sql = check(text, write=args.write)
    if not args.write and not server:
        sql = readonly_sql(sql)
    client = connect(url, settings=None if args.write or not server else {"readonly": 1})
    try:
        columns, rows = client.query(sql, params)
    finally:
        client.close()
    render(columns, rows, args.format)
    return 0
