"""The embedded transport: chdb (ClickHouse in-process) on a data folder.

chdb allows ONE data folder per process, and only one process per folder (a
second one fails with "Cannot lock file .../status"). Inside a process every
client of the same folder therefore shares one session, guarded by one lock
(threads sharing a session work; the lock keeps `USE db` + query atomic). Other
processes reach the folder through its owner's query endpoint (storage.serve).
"""

from __future__ import annotations

import atexit
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow.storage.arrowdata import InsertData, quote, to_arrow, to_rows
from failslow.storage.errors import FolderBusyError, QueryError, StorageError
from failslow.storage.url import ClickHouseURL, check_identifier

_LOCK = threading.RLock()
_state: dict[str, Any] = {"path": None, "session": None, "refs": 0, "db": None}


def one_line(exc: BaseException, limit: int = 400) -> str:
    """ClickHouse messages are long and multi-line; operators get the first useful line."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def open_path() -> Path | None:
    """The chdb folder this process has open, if any."""
    return _state["path"]


def _acquire(path: Path) -> Any:
    from chdb import session  # imported late: chdb takes ~1 s and 300 MB to load

    with _LOCK:
        if _state["session"] is not None:
            if _state["path"] != path:
                raise StorageError(
                    f"this process already has chdb folder {_state['path']} open; chdb allows "
                    f"one folder per process, so {path} cannot be opened here")
            _state["refs"] += 1
            return _state["session"]
        path.mkdir(parents=True, exist_ok=True)
        try:
            sess = session.Session(str(path))
        except Exception as exc:  # chdb raises bare RuntimeError
            if "lock" in str(exc).lower():
                raise FolderBusyError(
                    f"chdb folder {path} is in use by another process that serves no query "
                    "endpoint; stop it (e.g. failslow down) or query through it") from None
            raise StorageError(f"cannot open chdb folder {path}: {one_line(exc)}") from None
        _state.update(path=path, session=sess, refs=1, db=None)
        atexit.register(_close_at_exit, sess)
        return sess


def _close_at_exit(sess: Any) -> None:
    # A session still open when the interpreter exits can crash chdb's own shutdown.
    with _LOCK:
        if _state["session"] is sess:
            sess.close()
            _state.update(path=None, session=None, refs=0, db=None)


def _release() -> None:
    with _LOCK:
        _state["refs"] -= 1
        if _state["refs"] <= 0 and _state["session"] is not None:
            _state["session"].close()
            _state.update(path=None, session=None, refs=0, db=None)


class ChdbClient:
    """A client of the process-wide chdb session on one folder, for one database."""

    def __init__(self, url: ClickHouseURL):
        assert url.path is not None
        self.url = url
        self.database = url.database
        self._session = _acquire(url.path)
        self._closed = False

    def _run(self, sql: str, params: dict[str, Any] | None, batch: pa.Table | None = None) -> Any:
        """Run one statement with this client's database current; `batch` is read by
        ClickHouse's ``Python(batch)`` table function, which finds it by name in this frame."""
        if self._closed:
            raise StorageError("client is closed")
        with _LOCK:
            if _state["db"] != self.database:
                try:
                    self._session.query(f"USE {self.database}")
                    _state["db"] = self.database
                except Exception:  # noqa: BLE001 - the database may not exist before migrate
                    pass
            try:
                return self._session.query(sql, "ArrowTable",
                                           params=_params(params) if params else None)
            except Exception as exc:
                raise QueryError(one_line(exc)) from None

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._run(sql, params)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        return to_rows(self.query_arrow(sql, params))

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        result = self._run(sql, params)
        return result if isinstance(result, pa.Table) else pa.table({})

    def insert(self, table: str, data: InsertData) -> int:
        """Insert columns (Arrow fast path); ClickHouse casts to the column types. Returns rows."""
        batch = to_arrow(data)
        if batch.num_rows == 0:
            return 0
        cols = ", ".join(quote(c) for c in batch.column_names)
        self._run(f"INSERT INTO {qualify(self.database, table)} ({cols}) "
                  "SELECT * FROM Python(batch)", None, batch)
        return batch.num_rows

    def server_version(self) -> tuple[int, ...]:
        import chdb

        return tuple(int(p) for p in chdb.engine_version.split(".")[:3])

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _release()

    def __enter__(self) -> ChdbClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if value is None:
        return "NULL"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return str(value)


def _params(params: dict[str, Any]) -> dict[str, Any]:
    """chdb passes parameters as text: arrays need ClickHouse's literal syntax."""
    return {k: _literal(v) if isinstance(v, list | tuple) else v for k, v in params.items()}


def qualify(database: str, table: str) -> str:
    """``db.table`` for a bare table name; a name that already has a database is kept."""
    if "." in table:
        return table
    return f"{database}.{check_identifier(table)}"
