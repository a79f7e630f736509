"""Input caps (streams.limits): a flood of invented jobs, hosts, ranks and groups keeps the
partition's state bounded, says so (log line, counts), and the real job is judged
exactly as without the flood. The worker's RSS under a flood: bench/streams_flood.py."""

from __future__ import annotations

import logging
import pickle

from flood_support import hostile_events
from test_streams_partition import canon, messages, run, trace

from failslow.streams.limits import InputLimits
from failslow.streams.partition import JobPartition

CAPS = {"max_jobs": 4, "max_hosts": 8, "max_ranks_per_job": 32, "max_groups_per_job": 16,
        "max_hosts_per_job": 8}


def flood(ts: float, i: int, n: int) -> list[dict]:
    """``n`` events of each hostile kind around ``ts``: a new job per step event, a new
    host per gpu sample, and one job that invents ranks, hosts and groups."""
    return [e for k in range(n) for e in hostile_events(ts, i * n + k)]


def with_flood(msgs: list[list[dict]], per_msg: int) -> list[list[dict]]:
    """The flood starts once the real job has sent its first steps (it is "the rest of the
    cluster": already tracked). A job that starts while a flood holds every slot waits
    until flood jobs go quiet for the prune horizon."""
    first_step = next(i for i, m in enumerate(msgs) if any(e["kind"] == "step" for e in m))
    start = first_step + 40  # every rank of the real job has sent a step by then
    out = []
    for i, m in enumerate(msgs):
        out.append(m)
        if m and i >= start:
            out.append(flood(m[-1]["ts"], i, per_msg))
    return out


def test_a_flood_is_capped_and_the_real_job_is_still_judged(caplog):
    msgs = messages(trace())
    baseline = run(msgs, JobPartition(0, limits=InputLimits(**CAPS)))
    assert baseline, "the scenario must open an incident"
    calm = JobPartition(0, limits=InputLimits(**CAPS))
    run(msgs, calm)

    flooded = JobPartition(0, limits=InputLimits(**CAPS))
    with caplog.at_level(logging.WARNING, logger="failslow.worker"):
        incidents = run(with_flood(msgs, 20), flooded)
    assert canon([i for i in incidents if i["job_id"] == "job0"]) == canon(baseline)

    lim = flooded.limits
    assert lim.jobs <= CAPS["max_jobs"] and lim.hosts <= CAPS["max_hosts"]
    assert all(v > 0 for v in lim.counts.values()), lim.counts
    assert flooded.counts["capped"] == sum(lim.counts.values())
    lines = [r.getMessage() for r in caplog.records if "input cap hit" in r.getMessage()]
    assert len(lines) == len(lim.counts)  # once per cap (per job for per-job caps), not per event
    assert any("job 'hostile'" in line and "ranks" in line for line in lines)

    # The state stays within 2x of the same run without the flood.
    size = len(pickle.dumps(flooded.snapshot()))
    calm_size = len(pickle.dumps(calm.snapshot()))
    assert size < 2 * calm_size, (size, calm_size)


def test_room_frees_when_a_job_goes_quiet():
    lim = InputLimits(max_jobs=1)
    step = {"kind": "step", "rank": 0, "host": "h"}

    def two_steps(job: str, ts: float) -> list[dict]:
        return [{**step, "job_id": job, "ts": ts + s, "step": s} for s in (0, 1)]

    assert len(lim.admit(two_steps("a", 100.0))) == 2
    assert not lim.admit(two_steps("b", 101.0))  # no room: stays on probation
    lim.prune(horizon_ts=150.0)
    assert len(lim.admit(two_steps("b", 200.0))) == 2
    assert lim.counts["jobs"] == 0  # waiting on probation is not a drop


def test_one_shot_ids_never_reach_the_detector_and_held_events_stay_bounded():
    lim = InputLimits(max_pending_jobs=100, max_unknown_hosts=50)
    for u in range(10_000):
        assert not lim.admit([{"kind": "step", "job_id": f"j{u}", "rank": 0, "host": "h",
                               "ts": 1.0 + u * 1e-6, "step": 0},
                              {"kind": "gpu", "host": f"x{u}", "ts": 1.0, "gpu": 0}])
    assert lim.jobs == 0 and len(lim._pending) == 100 and len(lim._unknown) == 50
    assert lim.counts["jobs"] == 9_900 and lim.counts["hosts"] == 9_950
    # A real job among them graduates, and its hosts' held samples come with it.
    out = lim.admit([{"kind": "gpu", "host": "real-h", "ts": 5.0, "gpu": 0},
                     {"kind": "step", "job_id": "real", "rank": 0, "host": "real-h", "ts": 5.0,
                      "step": 0},
                     {"kind": "step", "job_id": "real", "rank": 0, "host": "real-h", "ts": 6.0,
                      "step": 1}])
    assert [e["kind"] for e in out] == ["gpu", "step", "step"]
