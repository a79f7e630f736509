"""The server transport: a ClickHouse server over the native protocol (clickhouse-driver).

Rows always travel as data (columnar), never as inline ``VALUES (...)`` text:
with clickhouse-driver an inline VALUES insert hangs until the socket times out.
Query parameters use ClickHouse's own ``{name:Type}`` syntax (server-side), the
same as chdb, so one SQL text runs on both transports.

The failslow schema needs ClickHouse >= 23.3 (DateTime64, TTL, codecs,
LowCardinality); `storage.migrations.migrate` checks the version. Older servers
(e.g. Debian's 18.16) still take connections, columnar inserts and plain queries.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from failslow.storage.arrowdata import InsertData, quote, to_arrow
from failslow.storage.embedded import one_line, qualify
from failslow.storage.errors import QueryError, StorageError
from failslow.storage.url import ClickHouseURL

UNKNOWN_DATABASE = 81
# The driver logs every failed connect with a traceback before raising; the error we raise
# says it in one line (the CLI's contract), so only its errors are let through.
logging.getLogger("clickhouse_driver.connection").setLevel(logging.ERROR)


class NativeClient:
    """clickhouse-driver client for one database; connects lazily on first use."""

    def __init__(self, url: ClickHouseURL, connect_timeout_s: float = 5.0,
                 send_receive_timeout_s: float = 60.0, settings: dict[str, Any] | None = None):
        """``settings``: ClickHouse settings sent with every query (``readonly``: 1)."""
        self.url = url
        self.settings = dict(settings or {})
        self.database = url.database
        self._timeouts = (connect_timeout_s, send_receive_timeout_s)
        self._driver = self._make_driver(url.database)

    def _make_driver(self, database: str) -> Any:
        from clickhouse_driver import Client

        connect_s, io_s = self._timeouts
        tls: dict[str, Any] = {}
        if self.url.secure:
            tls = {"secure": True, "verify": self.url.verify}
            if self.url.ca_certs:
                tls["ca_certs"] = self.url.ca_certs
        return Client(host=self.url.host, port=self.url.port, user=self.url.user,
                      password=self.url.password, database=database,
                      connect_timeout=connect_s, send_receive_timeout=io_s,
                      settings={"server_side_params": True, **self.settings}, **tls)

    def _call(self, sql: str, data: Any = None, **kwargs: Any) -> Any:
        from clickhouse_driver import errors

        for attempt in (0, 1):
            try:
                return self._driver.execute(sql, data, **kwargs)
            except errors.ServerException as exc:
                # Before `failslow migrate` the database does not exist and the handshake
                # itself fails; fall back to `default` (all of storage's SQL is qualified).
                if exc.code == UNKNOWN_DATABASE and attempt == 0 and \
                        self._driver.connection.database != "default":
                    self._driver.disconnect()
                    self._driver = self._make_driver("default")
                    continue
                raise QueryError(one_line(exc)) from None
            except (errors.Error, OSError, EOFError) as exc:
                self._driver.disconnect()
                raise StorageError(
                    f"ClickHouse at {self.url.redacted()} failed: {one_line(exc)}") from None
        raise AssertionError("unreachable")

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._call(sql, params)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        rows, types = self._call(sql, params, with_column_types=True)
        return [name for name, _ in types], [tuple(r) for r in rows]

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        columns, rows = self.query(sql, params)
        values = [[row[i] for row in rows] for i in range(len(columns))]
        return pa.table({c: pa.array(v) for c, v in zip(columns, values, strict=True)})

    def insert(self, table: str, data: InsertData) -> int:
        """Columnar insert over the native protocol; timestamps go as aware datetimes."""
        batch = to_arrow(data)
        if batch.num_rows == 0:
            return 0
        cols = ", ".join(quote(c) for c in batch.column_names)
        self._call(f"INSERT INTO {qualify(self.database, table)} ({cols}) VALUES",
                   [col.to_pylist() for col in batch.columns], columnar=True)
        return batch.num_rows

    def server_version(self) -> tuple[int, ...]:
        _, rows = self.query("SELECT version()")
        return tuple(int(p) for p in str(rows[0][0]).split(".")[:3] if p.isdigit())

    def close(self) -> None:
        self._driver.disconnect()

    def __enter__(self) -> NativeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
