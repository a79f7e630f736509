"""`failslow up` after a crash of one part of the embedded stack (issue 33 item 6): it
finds the dead part, clears what the dead process left behind and starts it again,
instead of answering "already running"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from failslow.stack import pid_alive, port_open
from failslow.storage.serve import find_owner, owner_file

pytestmark = pytest.mark.integration


def fs(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "failslow.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


def _state(home) -> dict:
    return orjson.loads((home / "stack.json").read_bytes())


def _count_incidents(env: dict) -> int:
    out = fs("query", "--format", "json", "SELECT count() AS n FROM failslow.incidents",
             env=env)
    assert out.returncode == 0, out.stderr
    return int(orjson.loads(out.stdout.splitlines()[0])["n"])


@pytest.fixture
def stack(tmp_path) -> Iterator[tuple[Path, dict, list[dict]]]:
    """`failslow up` on a free port in a home of its own: (home, env, the stack states
    seen). A test appends each new state; every process of them is stopped afterwards."""
    home = tmp_path / "home"
    env = {"FAILSLOW_HOME": str(home)}
    first = fs("up", "--port", "0", env=env)
    assert first.returncode == 0, first.stderr
    states = [_state(home)]
    try:
        yield home, env, states
    finally:
        fs("down", env=env)
        for st in states:
            for pid in (st["pid"], st["db_pid"]):
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_up_restarts_a_killed_database_owner_beside_the_live_broker(stack):
    home, env, states = stack
    old = states[0]
    os.kill(old["db_pid"], signal.SIGKILL)
    while pid_alive(old["db_pid"]):
        pass
    assert owner_file(home / "chdb").exists()       # what the killed owner left behind
    status = fs("status", "--format", "json", env=env)
    assert status.returncode == 1
    assert f"sink of the embedded stack (pid {old['db_pid']}) is not running (`failslow up` " \
        "starts it again)" in orjson.loads(status.stdout)["problems"]
    again = fs("up", env=env)
    assert again.returncode == 0, again.stderr
    assert "already running" not in again.stdout
    assert f"the database owner (sink) pid {old['db_pid']} is not running" in again.stdout
    new = _state(home)
    states.append(new)
    assert new["pid"] == old["pid"] and new["port"] == old["port"]   # broker untouched
    assert new["db_pid"] != old["db_pid"] and pid_alive(new["db_pid"])
    assert find_owner(home / "chdb")["pid"] == new["db_pid"]
    assert _count_incidents(env) == 0                # `query` reads through the new owner
    third = fs("up", env=env)
    assert third.returncode == 0 and "already running" in third.stdout, third.stdout
    os.kill(new["db_pid"], signal.SIGKILL)
    down = fs("down", env=env)
    assert down.returncode == 0 and not owner_file(home / "chdb").exists()


def test_up_restarts_a_killed_broker_on_the_port_it_had(stack):
    home, env, states = stack
    old = states[0]
    os.kill(old["pid"], signal.SIGKILL)
    again = fs("up", env=env)          # no --port: the recorded one, not 9092
    assert again.returncode == 0, again.stderr
    new = _state(home)
    states.append(new)
    assert new["port"] == old["port"] and new["pid"] != old["pid"]
    assert pid_alive(new["pid"]) and port_open(new["port"])
    assert not pid_alive(old["db_pid"]) and pid_alive(new["db_pid"])
    assert _count_incidents(env) == 0


def test_up_replaces_a_hung_database_owner(stack):
    home, env, states = stack
    old = states[0]
    os.kill(old["db_pid"], signal.SIGSTOP)           # alive, holding the folder, silent
    again = fs("up", env=env)
    assert again.returncode == 0, again.stderr
    assert f"the database owner (sink) pid {old['db_pid']} does not answer on its query " \
        "endpoint; started it again" in again.stdout
    new = _state(home)
    states.append(new)
    assert not pid_alive(old["db_pid"]) and find_owner(home / "chdb")["pid"] == new["db_pid"]
    assert _count_incidents(env) == 0
