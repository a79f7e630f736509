"""A TCP proxy in front of a broker that a test can cut: every connection dropped and new
ones refused, as a network partition of the broker (start Tansu with
``advertised_port=proxy.port`` so clients reconnect through it)."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """127.0.0.1:port -> 127.0.0.1:target; ``cut()`` closes every connection and the
    listening socket (connections are refused), ``restore()`` listens again."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.restore()

    def restore(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(128)
        self._listener = s
        self._thread = threading.Thread(target=self._accept, args=(s,), daemon=True)
        self._thread.start()

    def cut(self) -> None:
        s, self._listener = self._listener, None
        if s is not None:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, s: socket.socket) -> None:
        while True:
            try:
                a, _ = s.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self.target), timeout=2)
                b.settimeout(None)
            except OSError:
                a.close()
                continue
            with self._lock:
                self._conns |= {a, b}
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(x, y), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for c in (src, dst):
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns.discard(c)
