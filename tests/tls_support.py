"""A test CA made with the openssl CLI, and a TLS-terminating TCP proxy.

Tansu 0.6 cannot serve TLS (its --cert/--key flags accept a certificate but the
listener stays plain TCP: a TLS client gets "early eof"), so tests put this proxy in
front of it: clients speak TLS to the proxy, the proxy speaks plain TCP to Tansu, and
Tansu advertises the proxy's address so every reconnect goes through TLS too.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Self


@dataclass(frozen=True)
class TestCA:
    __test__ = False  # not a test class (pytest collects Test* names)

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: trusting it must fail


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(folder: Path, name: str, subject: str, ext: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", subject, cwd=folder)
    (folder / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
             cwd=folder)


def make_ca(folder: Path, hostname: str = "localhost") -> TestCA:
    """A CA, a server certificate for ``hostname`` and 127.0.0.1, and a client certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("ca", "other"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=failslow test {name}",
                 cwd=folder)
    _issue(folder, "server", f"/CN={hostname}",
           f"subjectAltName=DNS:{hostname},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _issue(folder, "client", "/CN=failslow-client", "extendedKeyUsage=clientAuth\n")
    for key in folder.glob("*.key"):
        key.chmod(0o600)
    return TestCA(folder / "ca.pem", folder / "server.pem", folder / "server.key",
                  folder / "client.pem", folder / "client.key", folder / "other.pem")


class ThreadedListener:
    """A listening socket on 127.0.0.1:``port`` whose connections are each served by
    ``_serve`` in a thread of their own; ``start()`` / ``stop()`` (the proxies of the tests)."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_server(("127.0.0.1", port))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._thread.join(5)

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                raw, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raise NotImplementedError


class TLSProxy(ThreadedListener):
    """Accept TLS on 127.0.0.1:``port`` (client certificates required when
    ``require_client_cert``) and forward the plaintext to 127.0.0.1:``target``."""

    def __init__(self, ca: TestCA, port: int, target: int, require_client_cert: bool = True):
        self.port, self.target = port, target
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(ca.server_cert, ca.server_key)
        if require_client_cert:
            self.ctx.load_verify_locations(ca.ca)
            self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.handshakes_failed = 0
        self.connections = 0
        super().__init__(port)

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(10)
            tls = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            self.handshakes_failed += 1
            raw.close()
            return
        self.connections += 1
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        except OSError:
            tls.close()
            return
        tls.settimeout(None)
        upstream.settimeout(None)
        pair = {tls: upstream, upstream: tls}
        try:
            while not self._stop.is_set():
                # SSL may hold decrypted bytes that select() cannot see.
                ready = [tls] if tls.pending() else select.select(list(pair), [], [], 0.5)[0]
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    pair[src].sendall(data)
        except (OSError, ssl.SSLError):
            return
        finally:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()
