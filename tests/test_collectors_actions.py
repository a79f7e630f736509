"""The training side of actions on real 4-rank DDP jobs (gloo): exact gradients with
uneven shares, every rank switching at the same step, late or lost delivery (issue 32)."""

from __future__ import annotations

import pytest
import torch
from mitigate_jobs import action, reference, run_job

STEPS, BATCH = 8, 24
UNEVEN = [0.3, 0.3, 0.1, 0.3]
EQUAL = [0.25] * 4


def _same_params(job: dict, ref: list[torch.Tensor]) -> None:
    for rank, params in job["params"].items():
        for p, q in zip(params, ref, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"rank {rank}")


@pytest.mark.timeout(240)
def test_rebalanced_job_keeps_exact_gradients_and_rolls_back(tmp_path):
    go, back = action(UNEVEN, version=1, apply_at_step=2), action(EQUAL, 2, apply_at_step=5)
    deliver = {r: [(0, go), (4, back)] for r in range(4)}
    job = run_job(tmp_path, steps=STEPS, global_batch=BATCH, deliver=deliver)
    assert not job["hung"]
    for rank, res in job["ranks"].items():
        assert [(s["step"], s["version"]) for s in res["switches"]] == [(2, 1), (5, 2)], rank
        assert res["counts"][1] == [6, 6, 6, 6]
        assert res["counts"][2] == [8, 7, 2, 7]   # the unit left over goes where it loads least
        assert res["counts"][5] == [6, 6, 6, 6]
    _same_params(job, reference(STEPS, BATCH))
    samples = {e["step"]: e["samples"] for e in job["events"][2] if e["kind"] == "step"}
    assert samples[2] == 2 and samples[1] == 6 and samples[6] == 6


@pytest.mark.timeout(240)
def test_late_rank_delays_every_rank_to_the_same_step(tmp_path):
    go = action(UNEVEN, version=1, apply_at_step=2)
    deliver = {0: [(0, go)], 1: [(0, go)], 2: [(1, go)], 3: [(5, go)]}
    job = run_job(tmp_path, steps=STEPS, global_batch=BATCH, deliver=deliver)
    assert not job["hung"]
    for rank, res in job["ranks"].items():
        # rank 3 holds it from call 5: the sync of step 5 agrees, the switch is step 6
        assert [(s["step"], s["version"]) for s in res["switches"]] == [(6, 1)], rank
        assert res["counts"][5] == [6, 6, 6, 6] and res["counts"][6] == [8, 7, 2, 7]
    _same_params(job, reference(STEPS, BATCH))


@pytest.mark.timeout(240)
def test_lost_action_and_dry_runs_change_nothing(tmp_path):
    dry = action(UNEVEN, version=1, apply_at_step=1, mode="dry_run")
    lost = action(UNEVEN, version=2, apply_at_step=2)
    expired = action(UNEVEN, version=3, apply_at_step=2, expires_ts=1.0)
    deliver = {r: [(0, dry), (0, expired)] + ([(1, lost)] if r != 3 else []) for r in range(4)}
    job = run_job(tmp_path, steps=STEPS, global_batch=BATCH, deliver=deliver)
    assert not job["hung"]
    for rank, res in job["ranks"].items():
        assert res["switches"] == [], rank
        assert all(c == [6, 6, 6, 6] for c in res["counts"])
        assert res["stats"]["dry_run"] == 1
    assert job["ranks"][0]["stats"]["disagreed"] >= STEPS - 2
    _same_params(job, reference(STEPS, BATCH))
