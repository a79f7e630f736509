"""One interface over both ClickHouse transports.

>>> client = connect("chdb:///tmp/fs-doc")              # doctest: +SKIP
>>> client.query("SELECT 1 AS one")                      # doctest: +SKIP
(['one'], [(1,)])

``connect(url)`` returns an object with ``execute(sql, params=None)``,
``query(sql, params=None) -> (columns, rows)``, ``query_arrow(sql, params=None)``,
``insert(table, data) -> rows`` (data: Arrow table, {column: values} or a list of
row dicts; a bare table name means the URL's database), ``server_version()`` and
``close()``. Parameters use ClickHouse's ``{name:Type}`` placeholders.

For ``chdb://`` URLs (one process per folder, see storage.embedded):
  1. this process already has the folder open -> share that session;
  2. another process owns it and serves queries (storage.serve) -> talk to it;
  3. nobody owns it -> open the folder here (this process becomes the owner;
     call ``storage.serve.QueryServer(client).start()`` to serve the others).
``own=True`` skips step 2 (a writer must own the folder, never proxy through another).
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa

from failslow.storage.arrowdata import InsertData
from failslow.storage.embedded import ChdbClient, open_path
from failslow.storage.url import parse


class Client(Protocol):
    database: str

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None: ...

    def query(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]: ...

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table: ...

    def insert(self, table: str, data: InsertData) -> int: ...

    def server_version(self) -> tuple[int, ...]: ...

    def close(self) -> None: ...


def connect(url: str, *, own: bool = False, settings: dict[str, Any] | None = None) -> Client:
    """Open a client for a ``chdb:///folder`` or ``clickhouse://user:pw@host:port/db`` URL.
    ``settings`` go with every query of the server transport (chdb takes them in the SQL:
    ``storage.guard.readonly_sql``)."""
    parsed = parse(url)
    if parsed.scheme == "clickhouse":
        from failslow.storage.native import NativeClient

        return NativeClient(parsed, settings=settings)
    assert parsed.path is not None
    if not own and open_path() != parsed.path:
        from failslow.storage.serve import RemoteClient, find_owner

        owner = find_owner(parsed.path)
        if owner is not None:
            return RemoteClient(parsed, owner)
    return ChdbClient(parsed)
