"""A SASL-terminating Kafka proxy for the tests, in front of the real Tansu.

Tansu 0.6 has no SASL a client can use with memory storage (tests/test_kafka_security.py
says why), so, the way tests/tls_support.py terminates TLS, this proxy speaks the Kafka
protocol's authentication itself on each client connection and, once the client has
authenticated, pipes the bytes to Tansu unchanged:

- ApiVersions (key 18) is forwarded to Tansu and its answer passed back unchanged:
  Tansu 0.6 already advertises SaslHandshake (17) v0-1 and SaslAuthenticate (36) v0-2
  (measured; ``advertised`` keeps what the last answer listed for them);
- SaslHandshake v1 answers the enabled mechanisms (33 UNSUPPORTED_SASL_MECHANISM for
  another one); v0's unframed tokens are not served: neither client in use sends them
  once v1 is advertised (aiokafka picks v1 from the versions, librdkafka always v1);
- SaslAuthenticate v0-2 carries PLAIN (``authzid\\0user\\0password``) or a SCRAM-SHA-256/512
  exchange (RFC 5802/7677, server side below); a wrong password gets 58
  SASL_AUTHENTICATION_FAILED and the connection is closed;
- any other request before authentication closes the connection.

With ``ca`` the client side is TLS as well (SASL_SSL), using the test CA of tls_support.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import select
import socket
import ssl
import struct

from tls_support import TestCA, ThreadedListener

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
ADVERTISED = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


# -- the wire -------------------------------------------------------------------------------


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _put_uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _skip_tags(buf: bytes, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


def _flexible(api_key: int, version: int) -> bool:
    return (api_key == API_VERSIONS and version >= 3) or (
        api_key == SASL_AUTHENTICATE and version >= 2)


def parse_header(frame: bytes) -> tuple[int, int, int, int]:
    """api_key, api_version, correlation_id and where the body starts (request header
    v1, or v2 with tagged fields for flexible versions)."""
    api_key, version, corr = struct.unpack_from(">hhi", frame)
    (n,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + max(n, 0)
    if _flexible(api_key, version):
        pos = _skip_tags(frame, pos)
    return api_key, version, corr, pos


def api_versions(body: bytes, version: int) -> dict[int, tuple[int, int]]:
    """api_key -> (min, max) from an ApiVersions response body (after the correlation
    id): plain arrays up to v2, compact arrays with tagged fields from v3; {} for an
    error answer (the client asked a version the broker lacks: v0 layout)."""
    (err,) = struct.unpack_from(">h", body)
    if err:
        return {}
    compact = version >= 3
    if compact:
        n, pos = _uvarint(body, 2)
        n -= 1
    else:
        (n,) = struct.unpack_from(">i", body, 2)
        pos = 6
    keys: dict[int, tuple[int, int]] = {}
    for _ in range(n):
        key, lo, hi = struct.unpack_from(">hhh", body, pos)
        keys[key] = (lo, hi)
        pos = _skip_tags(body, pos + 6) if compact else pos + 6
    return keys


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    return _recv_exact(sock, size)


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">i", len(payload)) + payload)


# -- SCRAM, server side (RFC 5802 / RFC 7677) ----------------------------------------------


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _attrs(msg: str) -> dict[str, str]:
    return {part[0]: part[2:] for part in msg.split(",") if len(part) > 1 and part[1] == "="}


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange: ``first(client_first)`` -> server-first, then
    ``final(client_final)`` -> server-final or None (wrong proof)."""

    ITERATIONS = 4096

    def __init__(self, mechanism: str, users: dict[str, str], nonce: str | None = None,
                 salt: bytes | None = None):
        self.hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.users = users
        self.user: str | None = None
        # random per exchange; fixed only to check the RFC's worked example
        self._nonce = nonce or base64.b64encode(os.urandom(18)).decode()
        self._salt = salt or os.urandom(16)

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()

    def first(self, client_first: str) -> str | None:
        gs2, _, bare = client_first.partition(",")[2].partition(",")
        self.gs2 = f"{client_first.split(',', 1)[0]},{gs2},"
        self.client_first_bare = bare
        a = _attrs(bare)
        self.user = _unescape(a.get("n", ""))
        if self.user not in self.users or "r" not in a:
            return None
        self.nonce = a["r"] + self._nonce
        self.salt = self._salt
        self.server_first = (f"r={self.nonce},s={base64.b64encode(self.salt).decode()},"
                             f"i={self.ITERATIONS}")
        return self.server_first

    def final(self, client_final: str) -> str | None:
        without_proof, _, proof = client_final.rpartition(",p=")
        a = _attrs(without_proof)
        if a.get("r") != self.nonce or base64.b64decode(a.get("c", "")) != self.gs2.encode():
            return None
        salted = hashlib.pbkdf2_hmac(self.hash, self.users[str(self.user)].encode(), self.salt,
                                     self.ITERATIONS)
        auth = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        stored = hashlib.new(self.hash, self._hmac(salted, b"Client Key")).digest()
        try:
            client_key = _xor(base64.b64decode(proof), self._hmac(stored, auth))
        except ValueError:
            return None
        if not hmac.compare_digest(hashlib.new(self.hash, client_key).digest(), stored):
            return None
        server_sig = self._hmac(self._hmac(salted, b"Server Key"), auth)
        return "v=" + base64.b64encode(server_sig).decode()


# -- the proxy ------------------------------------------------------------------------------


class SASLProxy(ThreadedListener):
    """Accept Kafka clients on 127.0.0.1:``port`` (TLS with the test CA's server
    certificate when ``ca``), authenticate them against ``users`` with one of
    ``mechanisms``, then forward to Tansu on 127.0.0.1:``target``."""

    def __init__(self, port: int, target: int, users: dict[str, str],
                 mechanisms: tuple[str, ...] = MECHANISMS, ca: TestCA | None = None):
        self.port, self.target, self.users = port, target, dict(users)
        self.mechanisms = tuple(mechanisms)
        self.ctx: ssl.SSLContext | None = None
        if ca is not None:
            self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ctx.load_cert_chain(ca.server_cert, ca.server_key)
        self.authenticated: dict[str, int] = {}  # mechanism -> successful logins
        self.failed = 0
        self.refused_unauthenticated = 0
        self.legacy_handshakes = 0
        self.sasl_versions: set[tuple[int, int]] = set()  # (api_key, version) clients sent
        self.advertised: dict[int, tuple[int, int] | None] = {}
        super().__init__(port)

    def _serve(self, raw: socket.socket) -> None:
        client: socket.socket = raw
        upstream: socket.socket | None = None
        try:
            raw.settimeout(10)
            if self.ctx is not None:
                client = self.ctx.wrap_socket(raw, server_side=True)
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            if self._authenticate(client, upstream):
                self._pipe(client, upstream)
        except (OSError, ssl.SSLError, ConnectionError, struct.error, ValueError,
                IndexError, UnicodeDecodeError):
            pass
        finally:
            for s in (client, upstream):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.close()

    def _authenticate(self, client: socket.socket, upstream: socket.socket) -> bool:
        mechanism: str | None = None
        scram: ScramServer | None = None
        while not self._stop.is_set():
            frame = read_frame(client)
            api_key, version, corr, pos = parse_header(frame)
            if api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                self.sasl_versions.add((api_key, version))
            if api_key == API_VERSIONS:
                # Tansu 0.6 already lists SaslHandshake v0-1 and SaslAuthenticate v0-2
                # (measured): its answer goes back as it is, and is checked.
                _send_frame(upstream, frame)
                answer = read_frame(upstream)
                listed = api_versions(answer[4:], version)
                if listed:
                    self.advertised = {k: listed.get(k) for k in ADVERTISED}
                _send_frame(client, answer)
            elif api_key == SASL_HANDSHAKE:
                (n,) = struct.unpack_from(">h", frame, pos)
                asked = frame[pos + 2:pos + 2 + n].decode()
                ok = asked in self.mechanisms
                body = struct.pack(">hi", 0 if ok else UNSUPPORTED_SASL_MECHANISM,
                                   len(self.mechanisms))
                body += b"".join(struct.pack(">h", len(m)) + m.encode() for m in self.mechanisms)
                _send_frame(client, struct.pack(">i", corr) + body)
                if not ok:
                    return False
                if version == 0:  # unframed tokens follow: not served (see the docstring)
                    self.legacy_handshakes += 1
                    return False
                mechanism = asked
                scram = ScramServer(asked, self.users) if asked.startswith("SCRAM") else None
            elif api_key == SASL_AUTHENTICATE and mechanism is not None:
                if version >= 2:
                    n, pos = _uvarint(frame, pos)
                    token = frame[pos:pos + n - 1]
                else:
                    (n,) = struct.unpack_from(">i", frame, pos)
                    token = frame[pos + 4:pos + 4 + n]
                reply, done = self._step(mechanism, scram, token)
                # counted before the answer goes out: a test reads them once the client knows
                if reply is None:
                    self.failed += 1
                elif done:
                    self.authenticated[mechanism] = self.authenticated.get(mechanism, 0) + 1
                _send_frame(client, self._auth_response(corr, version, reply))
                if reply is None or done:
                    return reply is not None
            else:
                self.refused_unauthenticated += 1
                return False
        return False

    def _step(self, mechanism: str, scram: ScramServer | None,
              token: bytes) -> tuple[bytes | None, bool]:
        """The server's answer to one token (None: refused) and whether the login is done."""
        if scram is None:  # PLAIN: authzid \0 user \0 password
            parts = token.split(b"\0")
            if len(parts) != 3:
                return None, True
            user, password = parts[1].decode(), parts[2].decode()
            ok = user in self.users and hmac.compare_digest(self.users[user].encode(),
                                                             password.encode())
            return (b"" if ok else None), True
        if scram.user is None:
            first = scram.first(token.decode())
            return (first.encode() if first else None), False
        final = scram.final(token.decode())
        return (final.encode() if final else None), True

    @staticmethod
    def _auth_response(corr: int, version: int, reply: bytes | None) -> bytes:
        err = 0 if reply is not None else SASL_AUTHENTICATION_FAILED
        msg = None if reply is not None else "Authentication failed: invalid username or password"
        auth = reply or b""
        if version >= 2:  # response header v1 (tagged fields), compact fields
            out = struct.pack(">ib", corr, 0) + struct.pack(">h", err)
            out += _put_uvarint(0) if msg is None else _put_uvarint(len(msg) + 1) + msg.encode()
            out += _put_uvarint(len(auth) + 1) + auth + struct.pack(">q", 0) + b"\x00"
            return out
        out = struct.pack(">ih", corr, err)
        out += struct.pack(">h", -1) if msg is None else struct.pack(">h", len(msg)) + msg.encode()
        out += struct.pack(">i", len(auth)) + auth
        if version >= 1:
            out += struct.pack(">q", 0)
        return out

    def _pipe(self, client: socket.socket, upstream: socket.socket) -> None:
        client.settimeout(None)
        upstream.settimeout(None)
        pair = {client: upstream, upstream: client}
        while not self._stop.is_set():
            # SSL may hold decrypted bytes that select() cannot see.
            pending = isinstance(client, ssl.SSLSocket) and client.pending()
            ready = [client] if pending else select.select(list(pair), [], [], 0.5)[0]
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                pair[src].sendall(data)
