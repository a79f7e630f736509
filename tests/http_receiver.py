"""A local HTTP receiver standing in for Slack, PagerDuty and plain webhooks in tests.

It records every request (path, headers, JSON body) and answers from a script
per path (``script("/slack", 500, 429, 200)``), then with ``default_status``.
It binds 127.0.0.1 on a free port, or on a given one (``failslow.stack.free_port()``)
so a test can start it after a client found that port closed (an endpoint that is down).

    with HttpReceiver() as rx:
        rx.script("/pd", (429, {"Retry-After": "0"}), 500)
        url = rx.url("/pd")
        ...
        rx.wait_for(2)            # blocks until 2 requests arrived (or raises)
        rx.bodies("/pd")
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = int | tuple[int, dict[str, str]] | tuple[int, dict[str, str], bytes]


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered

    def json(self) -> Any:
        return json.loads(self.body)


class HttpReceiver:
    """Threaded HTTP server on 127.0.0.1; ``stop()`` (or leaving the ``with``) shuts it down."""

    def __init__(self, port: int = 0, default_status: int = 200) -> None:
        self.port = port
        self.default_status = default_status
        self.requests: list[Request] = []
        self._scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> HttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> HttpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, payload = receiver._next_reply(self.path)
                receiver._record(Request(self.path, dict(self.headers.items()), body, status))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                """Quiet: tests read ``requests`` instead."""

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        """Answer the next requests to ``path`` with these statuses (and headers, body)."""
        with self._cond:
            self._scripts[path].extend(replies)

    def _next_reply(self, path: str) -> tuple[int, dict[str, str], bytes]:
        with self._cond:
            reply = self._scripts[path].popleft() if self._scripts[path] else self.default_status
        if isinstance(reply, int):
            return reply, {}, b"ok" if reply < 300 else b"error"
        status, headers, *rest = reply
        return status, headers, rest[0] if rest else b""

    def _record(self, req: Request) -> None:
        with self._cond:
            self.requests.append(req)
            self._cond.notify_all()

    def received(self, path: str | None = None, ok_only: bool = False) -> list[Request]:
        with self._cond:
            return [r for r in self.requests if (path is None or r.path == path)
                    and (not ok_only or r.status < 300)]

    def bodies(self, path: str | None = None) -> list[Any]:
        """JSON bodies of the requests that were answered with a 2xx."""
        return [r.json() for r in self.received(path, ok_only=True)]

    def wait_for(self, n: int, path: str | None = None, ok_only: bool = True,
                 timeout: float = 20.0) -> list[Request]:
        """Block until at least ``n`` matching requests arrived; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = [r for r in self.requests if (path is None or r.path == path)
                       and (not ok_only or r.status < 300)]
                if len(got) >= n:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(got)} of {n} requests to {path or 'any path'} "
                                         f"after {timeout:.0f} s")
                self._cond.wait(min(left, 0.1))

