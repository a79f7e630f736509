"""`failslow replay FILE...`: several traces (one per rank) merged in ts order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.kafka import read_events

pytestmark = pytest.mark.integration


def test_replay_merges_several_files_by_ts(broker, topics, tmp_path: Path):
    files = []
    # step events are keyed by job: one partition, so the topic keeps the order sent
    for rank, times in ((0, [1.0, 4.0, 5.0]), (1, [2.0, 3.0, 6.0])):
        path = tmp_path / f"rank{rank}.jsonl"
        path.write_text("".join(json.dumps(
            {"v": 1, "kind": "step", "ts": 1.7e9 + t, "job_id": "j", "rank": rank,
             "world_size": 2, "host": "h0", "step": int(t), "duration_s": 1.0}) + "\n"
            for t in times))
        files.append(str(path))
    out = subprocess.run([sys.executable, "-m", "failslow.cli", "replay", *files,
                          "--bootstrap", broker.bootstrap, "--topic-prefix", topics.prefix],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.returncode == 0, out.stderr
    # one host's steps: step_batch messages (half a second of linger, event time)
    assert "replayed 6 of 6 events as 3 batches and 0 single events" in out.stdout
    got = read_events(broker.bootstrap, topics.for_kind("step"), expect_events=6)
    assert [(e["ts"] - 1.7e9, e["rank"]) for e in got] == [
        (1.0, 0), (2.0, 1), (3.0, 1), (4.0, 0), (5.0, 0), (6.0, 1)]


def test_replay_names_a_missing_file(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text("")
    out = subprocess.run([sys.executable, "-m", "failslow.cli", "replay",
                          str(tmp_path / "a.jsonl"), str(tmp_path / "nope.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == f"failslow replay: {tmp_path / 'nope.jsonl'}: no such file"
