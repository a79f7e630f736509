"""Reads (and writes) of a chdb folder from other processes, through the folder's owner.

chdb lets one process open a data folder. In the embedded stack the owner is the
process that writes (`failslow sink`, or the demo); it runs a `QueryServer`: a
tiny HTTP endpoint on 127.0.0.1 that executes SQL on its own session. The port
and a random token are recorded next to the folder in ``<folder>.owner.json``
(mode 0600, so only the same user can use the endpoint). `storage.client.connect`
reads that file: when a live owner answers it returns a `RemoteClient`; when
nobody owns the folder it opens the folder itself.

Wire format: POST /query {"sql", "params", "database"} -> Arrow IPC stream (the
same typed columns a local query gives); POST /insert?database=D&table=T with an
Arrow IPC stream body -> {"rows": n}; errors -> HTTP 400/500 {"error": "..."}.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from failslow.storage.arrowdata import InsertData, to_arrow, to_rows
from failslow.storage.embedded import ChdbClient
from failslow.storage.errors import QueryError, StorageError
from failslow.storage.url import ClickHouseURL, check_identifier

TOKEN_HEADER = "X-Failslow-Token"


def owner_file(folder: Path) -> Path:
    """Where the owner of a chdb folder records its endpoint: ``<folder>.owner.json``."""
    return folder.parent / (folder.name + ".owner.json")


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


class QueryServer:
    """Serve SQL on the owner's chdb session to other local processes."""

    def __init__(self, client: ChdbClient, host: str = "127.0.0.1", port: int = 0):
        assert client.url.path is not None
        self.client = client
        self._folder: Path = client.url.path
        self.token = secrets.token_hex(16)
        self._clients: dict[str, ChdbClient] = {client.database: client}
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def _client_for(self, database: str) -> ChdbClient:
        if database not in self._clients:
            url = ClickHouseURL("chdb", check_identifier(database), path=self.client.url.path)
            self._clients[database] = ChdbClient(url)
        return self._clients[database]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: the sink logs what matters
                return None

            def _reply(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _error(self, code: int, message: str) -> None:
                self._reply(code, orjson.dumps({"error": message}), "application/json")

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/ping":
                    self._reply(200, orjson.dumps({"pid": os.getpid()}), "application/json")
                else:
                    self._error(404, "not found")

            def do_POST(self) -> None:  # noqa: N802
                if self.headers.get(TOKEN_HEADER) != server.token:
                    return self._error(403, "bad or missing token")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parsed = urllib.parse.urlsplit(self.path)
                try:
                    if parsed.path == "/query":
                        req = orjson.loads(body)
                        client = server._client_for(req.get("database") or server.client.database)
                        table = client.query_arrow(req["sql"], req.get("params"))
                        return self._reply(200, _ipc(table), "application/vnd.apache.arrow.stream")
                    if parsed.path == "/insert":
                        args = urllib.parse.parse_qs(parsed.query)
                        client = server._client_for(args["database"][0])
                        rows = client.insert(args["table"][0], _from_ipc(body))
                        return self._reply(200, orjson.dumps({"rows": rows}), "application/json")
                    return self._error(404, "not found")
                except (QueryError, StorageError) as exc:
                    return self._error(400, str(exc))
                except (KeyError, ValueError, orjson.JSONDecodeError, pa.ArrowInvalid) as exc:
                    return self._error(400, f"bad request: {exc}")

        return Handler

    def start(self) -> QueryServer:
        """Serve in a daemon thread and record the endpoint next to the folder."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="chdb-query",
                                        daemon=True)
        self._thread.start()
        path = owner_file(self._folder)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps({"pid": os.getpid(), "port": self.port, "token": self.token,
                                  "folder": str(self._folder)}))
        os.replace(tmp, path)
        return self

    def stop(self) -> None:
        """Stop serving and remove the owner record (only if it is still ours)."""
        path = owner_file(self._folder)
        with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
            if orjson.loads(path.read_bytes()).get("token") == self.token:
                path.unlink()
        self._httpd.shutdown()
        self._httpd.server_close()
        for database, client in self._clients.items():
            if database != self.client.database:
                client.close()


def find_owner(folder: Path) -> dict[str, Any] | None:
    """The live owner record of a chdb folder ({pid, port, token}), or None."""
    try:
        rec = orjson.loads(owner_file(folder).read_bytes())
        os.kill(int(rec["pid"]), 0)
    except (FileNotFoundError, orjson.JSONDecodeError, KeyError, ValueError,
            ProcessLookupError, PermissionError):
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{rec['port']}/ping", timeout=2.0) as r:
            if orjson.loads(r.read()).get("pid") != rec["pid"]:
                return None
    except (OSError, ValueError):
        return None
    return rec


def clear_stale_owner(folder: Path) -> bool:
    """Remove the owner record of ``folder`` when no live owner answers it (an owner killed
    with -9 leaves it behind); True if one was removed."""
    if find_owner(folder) is not None:
        return False
    try:
        owner_file(folder).unlink()
    except FileNotFoundError:
        return False
    return True


class RemoteClient:
    """The `Client` interface over an owner's QueryServer."""

    def __init__(self, url: ClickHouseURL, owner: dict[str, Any], timeout_s: float = 120.0):
        self.url = url
        self.database = url.database
        self._base = f"http://127.0.0.1:{owner['port']}"
        self._token = owner["token"]
        self._timeout_s = timeout_s

    def _post(self, path: str, body: bytes) -> bytes:
        req = urllib.request.Request(self._base + path, data=body, method="POST",
                                     headers={TOKEN_HEADER: self._token})
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            try:
                message = orjson.loads(exc.read())["error"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                message = f"HTTP {exc.code}"
            raise QueryError(message) from None
        except OSError as exc:
            raise StorageError(f"the owner of {self.url.path} did not answer: {exc}") from None

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        body = orjson.dumps({"sql": sql, "params": params, "database": self.database},
                            option=orjson.OPT_NON_STR_KEYS)
        return _from_ipc(self._post("/query", body))

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self.query_arrow(sql, params)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        return to_rows(self.query_arrow(sql, params))

    def insert(self, table: str, data: InsertData) -> int:
        batch = to_arrow(data)
        if batch.num_rows == 0:
            return 0
        qs = urllib.parse.urlencode({"database": self.database, "table": table})
        return int(orjson.loads(self._post(f"/insert?{qs}", _ipc(batch)))["rows"])

    def server_version(self) -> tuple[int, ...]:
        _, rows = self.query("SELECT version()")
        return tuple(int(p) for p in str(rows[0][0]).split(".")[:3] if p.isdigit())

    def close(self) -> None:
        return None

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
