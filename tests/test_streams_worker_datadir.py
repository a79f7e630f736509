"""The worker's faust data folder goes with a clean stop (restarts used to leave one
``failslow-worker-*`` folder each in the temp dir)."""

from __future__ import annotations

import time

from failslow.stack import free_port
from failslow.worker_process import WorkerProcess


def test_a_stopped_worker_leaves_no_data_folder(broker, topics, tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g",
                           metrics_port=free_port())
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("failslow-worker-*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(tmp.glob("failslow-worker-*")), "the running worker has its folder"
        time.sleep(2)  # started, not stopped half-way through its start
    finally:
        assert worker.stop() == 0
    assert not list(tmp.glob("failslow-worker-*"))
