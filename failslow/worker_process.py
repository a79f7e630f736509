"""Run ``failslow worker`` as a child process and read what it produced: for the tests
and the benchmarks (it lives in ``failslow/`` because it starts the command line).

>>> w = WorkerProcess("127.0.0.1:9092", Topics("failslow."))   # doctest: +SKIP
>>> w.stop()                                                   # doctest: +SKIP
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from failslow.schema import Topics
from failslow.streams.snapshots import scan


class WorkerProcess:
    """One ``failslow worker`` child (its own process group, so a kill takes its threads)."""

    def __init__(self, bootstrap: str, topics: Topics, group: str = "failslow-worker",
                 metrics_port: int | None = None, log_path: Path | None = None,
                 extra: list[str] | None = None) -> None:
        cmd = [sys.executable, "-m", "failslow.cli", "worker", "--bootstrap", bootstrap,
               "--topic-prefix", topics.prefix, "--group", group, "--log-level", "warning"]
        if metrics_port is not None:
            cmd += ["--metrics-port", str(metrics_port)]
        out: Any = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(cmd + (extra or []), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, env={**os.environ})
        finally:
            if log_path:
                out.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)

    def kill(self) -> None:
        """kill -9, as a crash would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def read_incidents(bootstrap: str, topics: Topics, partitions: int = 4) -> list[dict]:
    """Every incident event on the incidents topic (all partitions)."""
    out: list[dict] = []
    for p in range(partitions):
        out += [orjson.loads(m.value()) for m in scan(bootstrap, topics.for_kind("incident"), p,
                                                       idle_polls=1)]
    return out


def wait_for_incidents(bootstrap: str, topics: Topics, want: int, timeout: float,
                       settle: float = 3.0) -> list[dict]:
    """Poll until at least ``want`` incident events are there and no more came for
    ``settle`` s (or ``timeout`` s passed); return them."""
    deadline = time.monotonic() + timeout
    got: list[dict] = []
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        now = read_incidents(bootstrap, topics)
        if len(now) != len(got):
            got, stable_since = now, time.monotonic()
        elif len(got) >= want and time.monotonic() - stable_since >= settle:
            break
        time.sleep(0.3)
    return got
