"""The same input gives the same output bytes, whatever Python's hash seed: incidents are
compared by id and content downstream, and a replay must reproduce them exactly."""

from __future__ import annotations

import os
import subprocess
import sys

from failslow.simulator import SCENARIOS, simulate


def test_detect_output_does_not_depend_on_the_hash_seed(tmp_path):
    # two_faults: a thermal rank and a congested host at once, so several causes are scored.
    trace = tmp_path / "t.jsonl"
    simulate(SCENARIOS["two_faults"], seed=0).write_jsonl(trace)
    outs = []
    for seed in ("1", "2", "5"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-m", "failslow.cli", "detect", str(trace)],
                             capture_output=True, env=env, timeout=120, check=True)
        outs.append(run.stdout)
    assert b'"root_cause"' in outs[0]
    assert outs[0] == outs[1] == outs[2]
