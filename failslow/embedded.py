"""The one-machine stack behind `failslow up` / `down`: Tansu plus the process that owns
the chdb folder (the sink, which also answers other processes' queries).

chdb lets one process open a data folder at a time, so the sink is that owner:
`failslow query` and the demo read through it while it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from failslow import stack
from failslow.config import Settings, read_stack_state
from schema import Topics


def start_stack(settings: Settings, port: int | None, partitions: int = 4) -> dict:
    home = settings.home
    home.mkdir(parents=True, exist_ok=True)
    broker = stack.start_broker(port, log_path=home / "tansu.log", detach=True)
    try:
        stack.create_topics(broker.bootstrap, Topics(settings.topic_prefix), partitions)
        state = {"pid": broker.pid, "port": broker.port, "topic_prefix": settings.topic_prefix,
                 "clickhouse": settings.clickhouse, "started_ts": time.time()}
        stack.write_state(home, state)
        if settings.clickhouse.startswith("chdb://"):
            db_pid = _start_db_owner(settings, broker.bootstrap, home)
            state["db_pid"] = db_pid
            stack.write_state(home, state)
    except BaseException:
        broker.stop(2)
        raise
    return state


def _start_db_owner(settings: Settings, bootstrap: str, home: Path) -> int:
    """Run `failslow sink` in the background: it migrates and owns the chdb folder."""
    log = open(home / "sink.log", "ab")  # noqa: SIM115 - handed to the child
    env = dict(os.environ, FAILSLOW_HOME=str(home))
    proc = subprocess.Popen(
        [sys.executable, "-m", "failslow.cli", "sink", "--bootstrap", bootstrap,
         "--clickhouse", settings.clickhouse, "--topic-prefix", settings.topic_prefix,
         "--home", str(home)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, env=env)
    log.close()
    return proc.pid


def stop_stack(home: Path, timeout: float = 15.0) -> list[str]:
    state = read_stack_state(home)
    if not state:
        return []
    stopped = []
    # The sink first, so it can commit what it wrote while the broker is still there.
    for name, key in (("database (sink)", "db_pid"), ("broker", "pid")):
        pid = int(state.get(key) or 0)
        if pid and stack.pid_alive(pid):
            stack.stop_pid(pid, timeout)
            stopped.append(f"{name} pid {pid}")
    (home / "stack.json").unlink(missing_ok=True)
    return stopped
