"""The local hand-off: training processes give their events to the host agent over a Unix
socket; the agent publishes one columnar message per host per window (docs/collectors.md,
"The host agent relays").

A training process then needs no Kafka client and no credentials, and a host opens one
broker connection, not one per GPU. ``AgentPublisher`` is the training side: the same
surface as ``collectors.publisher.Publisher`` and ``FilePublisher`` (``publish``,
``flush``, ``close``, ``stats``), so the training hook takes it unchanged. ``Relay`` is
the agent side: it gathers the ranks' ``comm`` windows per job and window into one
``comm_batch``, and their ``step`` events into one ``step_batch`` per job and step
(``schema.batches.Batcher``), and hands everything to the agent's publisher,
whose spool covers it like the agent's own samples.

Wire: a stream of frames, each ``seq`` (8 bytes, big-endian) + ``length`` (4 bytes) + a JSON
array of events. The first frame of a connection (seq 0) says who is talking:
``{"client": id}``. The agent answers each frame it has taken with its seq (8 bytes):
the training side keeps every frame until it is answered and sends the unanswered ones
again on its next connection, so an agent restart loses nothing; the agent skips a frame
it has already taken from the same client.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any

import orjson

from failslow.schema.batches import Batcher, is_batch

log = logging.getLogger(__name__)

SOCKET_ENV = "FAILSLOW_AGENT_SOCKET"
_HEAD = struct.Struct(">QI")
_ACK = struct.Struct(">Q")
FRAME_MAX = 16 << 20   # a frame is one flush of one rank's hook: far below this


class AgentPublisher:
    """Hands events to the host agent on ``path`` (a Unix socket); never blocks the
    training loop and never raises for a missing agent.

    While the agent is down (not started yet, restarting) frames are kept, at most
    ``max_buffer_bytes`` (the oldest dropped beyond, counted in ``stats["dropped"]``); one
    line says so per outage. Every ``retry_s`` a publish or flush tries the agent again and
    sends it what it has not answered yet, in order.
    """

    def __init__(self, path: str | None = None, max_buffer_bytes: int = 64 << 20,
                 retry_s: float = 1.0) -> None:
        path = path or os.environ.get(SOCKET_ENV)
        if not path:
            raise ValueError(f"no agent socket: pass a path or set {SOCKET_ENV}")
        self.path = path
        self.max_buffer_bytes = max_buffer_bytes
        self.retry_s = retry_s
        self._client = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._frames: deque[tuple[int, int, bytes]] = deque()   # (seq, events, frame)
        self._held_bytes = 0
        self._wbuf = bytearray()
        self._rbuf = b""
        self._seq = 0
        self._next_try = 0.0
        self._down = False            # said so for this outage
        self._said_dropping = False
        self._closed = False
        self._stats = dict.fromkeys(("published", "delivered", "dropped", "reconnects"), 0)

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._stats)
            out["pending"] = sum(n for _, n, _ in self._frames)
            return out

    def publish(self, events: Iterable[Mapping[str, Any]]) -> None:
        evs = list(events)
        if not evs:
            return
        payload = orjson.dumps(evs)
        with self._lock:
            if self._closed:
                raise ValueError("publish() after close()")
            self._seq += 1
            frame = _HEAD.pack(self._seq, len(payload)) + payload
            self._frames.append((self._seq, len(evs), frame))
            self._held_bytes += len(frame)
            self._stats["published"] += len(evs)
            self._bound()
            if self._sock is not None:
                self._wbuf += frame
            self._pump()

    def flush(self, timeout: float = 10.0) -> int:
        """Wait until the agent took everything, at most ``timeout`` seconds; returns the
        number of events it has not taken. With the agent down (one try to reach it
        fails) it returns at once: a job that ends does not wait for an agent that is
        not there."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._sock is None:
                    self._next_try = 0.0
                self._pump()
                left = sum(n for _, n, _ in self._frames)
                down = self._sock is None
            if not left or down or time.monotonic() >= deadline:
                return left
            time.sleep(0.01)

    def close(self, timeout: float = 10.0) -> int:
        left = self.flush(timeout)
        with self._lock:
            self._closed = True
            self._disconnect()
        if left:
            log.warning("failslow: %d events not handed to the host agent at %s (lost)",
                        left, self.path)
        return left

    # -- inside the lock -----------------------------------------------------------------

    def _bound(self) -> None:
        while self._held_bytes > self.max_buffer_bytes and len(self._frames) > 1:
            _, n, frame = self._frames.popleft()
            self._held_bytes -= len(frame)
            self._stats["dropped"] += n
            if not self._said_dropping:
                self._said_dropping = True
                log.warning("failslow: host agent buffer full (%d bytes): dropping the oldest "
                            "windows", self.max_buffer_bytes)

    def _pump(self) -> None:
        if self._sock is None:
            if time.monotonic() < self._next_try:
                return
            self._connect()
            if self._sock is None:
                return
        try:
            self._read_acks()
            if self._wbuf:
                sent = self._sock.send(self._wbuf)
                del self._wbuf[:sent]
        except BlockingIOError:
            pass
        except OSError as exc:
            self._lost(exc)

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            self._lost(exc)
            return
        sock.setblocking(False)
        self._sock = sock
        hello = orjson.dumps({"client": self._client})
        self._wbuf = bytearray(_HEAD.pack(0, len(hello)) + hello)
        for _, _, frame in self._frames:
            self._wbuf += frame
        self._rbuf = b""
        if self._down:
            self._stats["reconnects"] += 1
        self._down = False
        self._said_dropping = False

    def _read_acks(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                return
            if not data:
                raise ConnectionResetError("the agent closed the connection")
            self._rbuf += data
            n = len(self._rbuf) // _ACK.size * _ACK.size
            acked = max((_ACK.unpack_from(self._rbuf, i)[0] for i in range(0, n, _ACK.size)),
                        default=0)
            self._rbuf = self._rbuf[n:]
            while self._frames and self._frames[0][0] <= acked:
                _, count, frame = self._frames.popleft()
                self._held_bytes -= len(frame)
                self._stats["delivered"] += count

    def _lost(self, exc: OSError) -> None:
        self._disconnect()
        self._next_try = time.monotonic() + self.retry_s
        if not self._down:
            self._down = True
            log.warning("failslow: host agent at %s is not answering (%s); training goes on, "
                        "keeping up to %d MiB of events for it", self.path,
                        exc.strerror or exc, self.max_buffer_bytes >> 20)

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._wbuf = bytearray()


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.at = 0                   # start of the first frame not taken yet
        self.client: str | None = None
        self.taken = 0                # the last seq taken
        self.acked = 0                # the last seq answered


class Relay:
    """The agent's side of the hand-off: listens on ``path`` and publishes what the ranks
    send through ``publisher`` (the agent's, with its spool), ``comm`` windows gathered
    into one ``comm_batch`` per job and window and steps into one ``step_batch`` per job
    and step (``linger_s``: how long the first rank of a window waits for the others),
    each batch its own message. Runs in its own thread
    (``start`` / ``stop``)."""

    def __init__(self, path: str, publisher: Any, linger_s: float = 0.5) -> None:
        self.path = path
        self.publisher = publisher
        self.batcher = Batcher(linger_s)
        self.counts = dict.fromkeys(("frames", "events", "duplicates", "bad"), 0)
        self._taken: dict[str, int] = {}      # client -> the last seq taken from it
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if os.path.exists(path):   # a socket left by an agent that did not stop cleanly
            os.unlink(path)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        os.chmod(path, 0o660)
        self._server.listen(256)
        self._server.setblocking(False)
        self._sel.register(self._server, selectors.EVENT_READ)

    def start(self) -> Relay:
        self._thread = threading.Thread(target=self._run, name="failslow-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening, take what the ranks already sent, publish everything held."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sel.unregister(self._server)
        self._server.close()
        with suppress(OSError):
            os.unlink(self.path)
        conns = [key.data for key in list(self._sel.get_map().values())]
        self._take(conns)
        for conn in conns:
            self._close(conn)
        self._send(self.batcher.flush())
        self._sel.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready = []
            for key, _ in self._sel.select(timeout=0.1):
                if key.data is None:
                    self._accept()
                else:
                    ready.append(key.data)
            if ready:
                self._take(ready)
            self._send(self.batcher.due(time.monotonic()))

    def _accept(self) -> None:
        try:
            sock, _ = self._server.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        self._sel.register(sock, selectors.EVENT_READ, _Conn(sock))

    def _take(self, conns: list[_Conn]) -> None:
        """Read the ready connections, then take their frames one per rank in turn (a
        backlog, ranks back after an agent restart, still batches window by window), then
        answer each rank with the last frame taken."""
        for conn in conns:
            self._read(conn)
        out: list[dict] = []
        turn = conns
        while turn:
            turn = [c for c in turn if self._frame(c, out)]
        self._send(out)
        for conn in conns:
            del conn.buf[:conn.at]
            conn.at = 0
            if conn.taken > conn.acked:
                conn.acked = conn.taken
                with suppress(OSError):
                    conn.sock.send(_ACK.pack(conn.taken))

    def _read(self, conn: _Conn) -> None:
        try:
            while data := conn.sock.recv(1 << 20):
                conn.buf += data
                if len(data) < 1 << 20:
                    return
            self._close(conn)        # the rank went away; what it sent is still taken
        except BlockingIOError:
            pass
        except OSError:
            self._close(conn)

    def _frame(self, conn: _Conn, out: list[dict]) -> bool:
        """Take the next whole frame of ``conn`` (its events into ``out``, through the
        batcher); False when there is none."""
        buf = conn.buf
        while len(buf) - conn.at >= _HEAD.size:
            seq, length = _HEAD.unpack_from(buf, conn.at)
            if length > FRAME_MAX:
                log.warning("relay: a frame of %d bytes from a rank: dropping the connection",
                            length)
                self._close(conn)
                del buf[:]
                conn.at = 0
                return False
            start = conn.at + _HEAD.size
            if len(buf) - start < length:
                return False
            payload = bytes(buf[start:start + length])
            conn.at = start + length
            if seq == 0:
                with suppress(orjson.JSONDecodeError, AttributeError):
                    conn.client = orjson.loads(payload).get("client")
                continue
            conn.taken = seq
            if conn.client is not None:
                if seq <= self._taken.get(conn.client, 0):
                    self.counts["duplicates"] += 1
                    return True
                self._taken[conn.client] = seq
            self.counts["frames"] += 1
            try:
                events = orjson.loads(payload)
            except orjson.JSONDecodeError:
                self.counts["bad"] += 1
                return True
            now = time.monotonic()
            for ev in events if type(events) is list else (events,):
                self.counts["events"] += 1
                out += self.batcher.add(ev, now)
            return True
        return False

    def _send(self, events: list[dict]) -> None:
        """Each batch as its own message (one per host and window); the rest together."""
        rest = [ev for ev in events if not is_batch(ev)]
        for ev in events:
            if is_batch(ev):
                self.publisher.publish([ev])
        if rest:
            self.publisher.publish(rest)

    def _close(self, conn: _Conn) -> None:
        with suppress(OSError, KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
