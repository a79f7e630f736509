"""FAILSLOW_HOME is 0700 (issue 33 item 7b): what creates it makes it so whatever the umask
(the demo and `report` made ~/.failslow 0755), and a command that finds a looser one
tightens it and says so once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from failslow import demo
from failslow.config import resolve
from failslow.errors import FailslowError


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def fs(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "failslow.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "FAILSLOW_HOME": str(home)},
                          preexec_fn=lambda: os.umask(0o022))    # noqa: PLW1509 - before exec


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_a_looser_home_is_tightened_and_said_once(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    first = fs("down", home=home)
    assert first.returncode == 0, first.stderr
    assert mode(home) == 0o700
    assert first.stderr.splitlines() == [
        f"failslow: FAILSLOW_HOME {home} was mode 0755, open to other users; set to 0700 "
        "(it holds the stack's state and data)"]
    second = fs("down", home=home)
    assert second.returncode == 0 and second.stderr == ""


def test_report_creates_a_missing_home_0700(tmp_path):
    home = tmp_path / "new" / "home"
    out = fs("report", "no-such-incident", "--out", str(tmp_path / "r.html"), home=home)
    assert "Traceback" not in out.stderr, out.stderr
    assert mode(home) == 0o700                        # the chdb folder opened under it
    assert mode(home.parent) == 0o755                 # what is above is not ours: the umask's


def test_the_demo_creates_its_home_0700(tmp_path, monkeypatch, umask_022):
    home = tmp_path / "home"

    def no_broker(*args: object, **kwargs: object) -> None:
        raise FailslowError("stopped before the broker: only the folders are under test")

    monkeypatch.setattr(demo, "start_broker", no_broker)
    settings = resolve(None, {"FAILSLOW_HOME": str(home)})
    with pytest.raises(FailslowError, match="only the folders"):
        demo.run_demo(settings, demo.DemoOptions(), out=open(os.devnull, "w"))  # noqa: SIM115
    assert mode(home) == 0o700 and mode(home / "demo") == 0o700


def test_up_state_keeps_the_home_private(tmp_path, umask_022):
    from failslow.stack import write_state

    home = tmp_path / "home"
    write_state(home, {"pid": 1, "port": 1})
    assert mode(home) == 0o700 and mode(home / "stack.json") == 0o600
