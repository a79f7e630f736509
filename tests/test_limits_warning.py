"""The input caps' warning (streams.limits, issue 33 item 7c): it names the cap that was
really exceeded, with its flag and value, and says so once per crossing, not after every
prune of a steady flood."""

from __future__ import annotations

import logging

import pytest

from failslow.streams.limits import InputLimits


def one_shot_jobs(prefix: str, n: int, ts: float) -> list[dict]:
    """``n`` jobs that send one step each: they never qualify, they wait in the pool."""
    return [{"kind": "step", "job_id": f"{prefix}-{i}", "rank": 0, "host": "h", "ts": ts,
             "step": 0} for i in range(n)]


@pytest.fixture
def cap_lines(caplog):
    caplog.set_level(logging.WARNING, logger="failslow.worker")
    return lambda: [r.getMessage() for r in caplog.records if "input cap hit" in r.getMessage()]


def test_a_full_pool_of_new_jobs_is_not_called_the_job_cap(cap_lines):
    lim = InputLimits(max_jobs=1_000)
    lim.admit(one_shot_jobs("flood", 300, 100.0))
    assert lim.counts["jobs"] == 300 - 256
    [line] = cap_lines()
    assert "more than 256 jobs;" not in line          # what it said while --max-jobs was 1,000
    assert "more than 256 new jobs (or 200,000 of their events) waiting at once" in line
    assert "0 of --max-jobs 1,000 tracked" in line


def test_the_job_cap_names_its_flag(cap_lines):
    lim = InputLimits(max_jobs=2)
    for job in ("a", "b", "c"):
        lim.admit([{"kind": "step", "job_id": job, "rank": 0, "host": "h", "ts": 1.0 + s,
                    "step": s} for s in (0, 1)])
    assert lim.jobs == 2
    [line] = cap_lines()
    assert "more than 2 jobs (--max-jobs);" in line


def test_hosts_nobody_runs_on_are_not_called_the_host_cap(cap_lines):
    lim = InputLimits()
    lim.admit([{"kind": "gpu", "host": f"x{i}", "gpu": 0, "ts": 1.0} for i in range(1_100)])
    [line] = cap_lines()
    assert "more than 1,024 hosts no tracked job runs on" in line
    assert "0 of --max-hosts 16,384 tracked" in line


def test_per_job_caps_name_their_flag(cap_lines):
    lim = InputLimits(max_ranks_per_job=2)
    lim.admit([{"kind": "step", "job_id": "j", "rank": r, "host": "h", "ts": 1.0 + s,
                "step": s} for s in (0, 1) for r in range(3)])
    [line] = cap_lines()
    assert "job 'j': more than 2 ranks (--max-ranks-per-job);" in line


def test_one_line_per_crossing_through_a_steady_flood_and_its_prunes(cap_lines):
    lim = InputLimits(max_jobs=1_000)
    for wave in range(40):                       # the partition prunes as its watermark moves
        ts = 100.0 + 10 * wave
        lim.admit(one_shot_jobs(f"w{wave}", 300, ts))
        lim.prune(horizon_ts=ts - 60)
    assert len(cap_lines()) == 1                 # it was 40: every prune re-armed the line
    assert lim.counts["jobs"] == 40 * 300 - 256

    lim.prune(horizon_ts=1e9)                    # the flood ended and went quiet: below the cap
    lim.admit(one_shot_jobs("again", 300, 2e9))  # a new crossing is worth a new line
    assert len(cap_lines()) == 2
