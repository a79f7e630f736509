"""The one-machine stack behind `failslow up` / `down`: Tansu plus the process that owns
the chdb folder (the sink, which also answers other processes' queries). `failslow demo`
starts its broker here too (``start_broker``), and its worker with ``PLAINTEXT_FLAGS``.

chdb lets one process open a data folder at a time, so the sink is that owner:
`failslow query` and the demo read through it while it runs.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from failslow import stack
from failslow.config import Settings, read_stack_state, state_path
from failslow.home import private_home
from failslow.schema import Topics, kafka_security
from failslow.storage.url import mask

# The embedded broker is plaintext on loopback (Tansu serves no TLS): the FAILSLOW_KAFKA_*
# settings are for a real Kafka, not for it. A child command that talks to it gets these
# flags (they override the variables it inherits).
PLAINTEXT_FLAGS = ["--kafka-security-protocol", "PLAINTEXT"]


def start_broker(topics: Topics, partitions: int = 4, port: int | None = None,
                 log_path: Path | None = None, detach: bool = False) -> stack.Broker:
    """The embedded broker with its topics, as `failslow up` and `failslow demo` start it;
    from here on this process's Kafka clients are plaintext (see PLAINTEXT_FLAGS)."""
    kafka_security.use(kafka_security.PLAINTEXT)
    return stack.start_broker_with_topics(topics, partitions, port, log_path=log_path,
                                          detach=detach)


def start_stack(settings: Settings, port: int | None, partitions: int = 4) -> dict:
    home = settings.home
    private_home(home, create=True)
    broker = start_broker(Topics(settings.topic_prefix), partitions, port,
                          log_path=home / "tansu.log", detach=True)
    state: dict = {}
    try:
        state = {"pid": broker.pid, "port": broker.port, "topic_prefix": settings.topic_prefix,
                 "clickhouse": mask(settings.clickhouse), "started_ts": time.time()}
        stack.write_state(home, state)
        if settings.clickhouse.startswith("chdb://"):
            metrics_port = stack.free_port()
            db_pid = _start_db_owner(settings, broker.bootstrap, home, metrics_port)
            state.update(db_pid=db_pid, sink_metrics_port=metrics_port)  # for failslow status
            stack.write_state(home, state)
            _wait_for_db_owner(settings.clickhouse, db_pid, home / "sink.log")
    except BaseException:
        if state.get("db_pid"):
            stack.stop_pid(int(state["db_pid"]), 10)
        broker.stop(2)
        state_path(home).unlink(missing_ok=True)
        raise
    return state


def db_owner_problem(state: dict, tries: int = 3) -> str | None:
    """Why the database owner recorded in ``state`` does not serve its chdb folder, or None
    (it does, or this stack has none: a ClickHouse server)."""
    from failslow.storage.serve import find_owner
    from failslow.storage.url import parse

    pid = int(state.get("db_pid") or 0)
    if not pid:
        return None
    folder = Path(parse(state["clickhouse"]).path or "")
    for _ in range(tries):
        owner = find_owner(folder)
        if owner is not None and int(owner["pid"]) == pid:
            return None
        if not stack.pid_alive(pid):
            return f"the database owner (sink) pid {pid} is not running"
        time.sleep(1.0)     # alive: a busy machine may answer late; a hung one never does
    return f"the database owner (sink) pid {pid} does not answer on its query endpoint"


def restart_db_owner(settings: Settings, state: dict) -> dict:
    """Start the database owner again beside the running broker: stop what is left of the
    old one (a hung process still holds the folder), drop its stale owner record, and
    record the new one in stack.json. Returns the new state."""
    from failslow.storage.serve import clear_stale_owner
    from failslow.storage.url import parse

    home = settings.home
    old = int(state["db_pid"])
    if stack.pid_alive(old):
        stack.stop_pid(old, 10)
    clear_stale_owner(Path(parse(state["clickhouse"]).path or ""))
    # What `up` started with, not what this shell says now: the same folder and topics.
    settings = dataclasses.replace(settings, clickhouse=state["clickhouse"],
                                   topic_prefix=state["topic_prefix"])
    port = int(state.get("sink_metrics_port") or 0)
    metrics_port = port if port and not stack.port_open(port) else stack.free_port()
    db_pid = _start_db_owner(settings, f"127.0.0.1:{state['port']}", home, metrics_port)
    state = {**state, "db_pid": db_pid, "sink_metrics_port": metrics_port,
             "db_restarted_ts": time.time()}
    stack.write_state(home, state)
    _wait_for_db_owner(settings.clickhouse, db_pid, home / "sink.log")
    return state


def _wait_for_db_owner(url: str, pid: int, log: Path, timeout: float = 90.0) -> None:
    """Return once the sink has applied the schema and serves the folder to other
    processes; until then a reader could open the folder itself and lock the sink out."""
    from failslow.storage.serve import find_owner
    from failslow.storage.url import parse

    folder = Path(parse(url).path or "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owner = find_owner(folder)
        if owner is not None and int(owner["pid"]) == pid:
            return
        if not stack.pid_alive(pid):
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise stack.StackError(f"the database owner (sink) exited: {' '.join(tail)}")
        time.sleep(0.1)
    raise stack.StackError(f"the database owner (sink) was not ready within {timeout:.0f} s "
                           f"(log: {log})")


def _start_db_owner(settings: Settings, bootstrap: str, home: Path, metrics_port: int) -> int:
    """Run `failslow sink` in the background: it migrates and owns the chdb folder, and
    serves its metrics on 127.0.0.1:metrics_port."""
    log = open(home / "sink.log", "ab")  # noqa: SIM115 - handed to the child
    # Without the FAILSLOW_KAFKA_* variables too: a TLS file named there must not even be read.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_KAFKA_")}
    env["FAILSLOW_HOME"] = str(home)
    proc = subprocess.Popen(
        [sys.executable, "-m", "failslow.cli", "sink", "--bootstrap", bootstrap,
         "--clickhouse", settings.clickhouse, "--topic-prefix", settings.topic_prefix,
         "--home", str(home), "--metrics-port", str(metrics_port), *PLAINTEXT_FLAGS],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, env=env)
    log.close()
    return proc.pid


def stop_stack(home: Path, timeout: float = 15.0) -> list[str]:
    state = read_stack_state(home)
    if not state:
        return []
    stopped = []
    # The broker first, at once: Tansu keeps acknowledging produce requests for the ~7 s
    # its SIGTERM takes, and what it acknowledged after the sink stopped was lost (it keeps
    # nothing on disk, so a kill loses nothing a term would keep). Collectors keep what is
    # no longer acknowledged in their spools. Then the sink writes what it had read (its
    # offsets cannot be committed any more; the broker's data is gone with it anyway).
    for name, key, grace in (("broker", "pid", 0.0), ("database (sink)", "db_pid", timeout)):
        pid = int(state.get(key) or 0)
        if pid and stack.pid_alive(pid):
            stack.stop_pid(pid, grace)
            stopped.append(f"{name} pid {pid}")
    if state.get("db_pid"):
        from failslow.storage.serve import clear_stale_owner
        from failslow.storage.url import parse

        # an owner killed with -9 could not remove its record; a clean stop did already
        clear_stale_owner(Path(parse(state["clickhouse"]).path or ""))
    state_path(home).unlink(missing_ok=True)
    return stopped
