"""A worker started while its broker is unreachable says so in one line (was: a raw
KafkaException traceback from the internal-topics check) and exits non-zero."""

from __future__ import annotations

import subprocess
import sys

import pytest

from failslow.stack import free_port

pytestmark = pytest.mark.integration


def test_worker_without_a_broker_is_a_one_line_error() -> None:
    port = free_port()          # nothing listens there
    p = subprocess.run([sys.executable, "-m", "failslow.cli", "worker", "--bootstrap",
                        f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("failslow worker: broker 127.0.0.1:")
    assert "unreachable" in last
