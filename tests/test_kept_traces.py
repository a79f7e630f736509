"""The committed sample of kept real-job traces (bench/traces/realjobs): what the thresholds
were checked on, judged again by today's detector through `failslow detect`.

Two repeats of the ten real torch jobs of bench/real_ddp.py (4 ranks, Gloo on CPU, comm
grain, 52 steps, the fault from step 28), recorded with ``bench/real_ddp.py --keep DIR``
and kept as the ranks wrote them (rank files and the job's truth). The whole matrix of
ten repeats is ``bench/real_ddp.py --redetect DIR``; this asserts what the issue's targets
say of each job: a heavier stage and a healthy job never page, a 2x/3x rank (DDP, FSDP2,
pipeline stage) is paged within 10 steps, a 1.5x rank is named, a loader stall is an
``input_stall``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import orjson
import pytest

from failslow.cli import main

# realjobs.verdict alone: the package would import torch to run jobs, this runs none
_spec = importlib.util.spec_from_file_location(
    "kept_verdict", Path(__file__).parent / "realjobs" / "verdict.py")
assert _spec is not None and _spec.loader is not None
_verdict = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _verdict          # its dataclass looks its module up
_spec.loader.exec_module(_verdict)
judge = _verdict.judge

KEPT = Path(__file__).resolve().parent.parent / "bench" / "traces" / "realjobs"
JOBS = sorted(p for p in KEPT.glob("repeat*/*-*") if (p / "truth.json").is_file())


def test_the_sample_holds_every_job_of_the_matrix_twice():
    names = [p.name for p in JOBS]
    assert len(names) == 20 and all(names.count(n) == 2 for n in names)


@pytest.mark.parametrize("job", JOBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_kept_real_job_is_judged_as_its_target_says(job: Path, tmp_path: Path):
    truth = json.loads((job / "truth.json").read_text())
    out = tmp_path / "incidents.jsonl"
    assert main(["detect", *sorted(str(f) for f in job.glob("rank*.jsonl")),
                 "--out", str(out)]) == 0
    incidents = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    v = judge(truth, incidents)
    assert v.loud_healthy == 0, [i["incident_id"] for i in incidents
                                 if i["severity"] != "info"]
    scenario = truth["scenario"]
    if truth["culprit"] is None:             # benign, a stage heavier by design
        return
    assert v.named
    if scenario in ("compute2x", "compute3x"):
        assert v.steps_to_page is not None and v.steps_to_page <= 10
    if scenario == "loader_stall":
        assert v.root_cause == "input_stall"
    # every loud incident says which rule confirmed it and why this severity
    for i in incidents:
        if i["severity"] != "info":
            assert i["evidence"]["rule"] and i["evidence"]["policy"]
