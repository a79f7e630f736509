"""Jobs end (issue 17): a job silent for ``job_idle_s`` of event time is closed: its open
incidents resolve with the reason "job ended", its state leaves the Detector (and so its
snapshots); ``failslow detect`` ends every job at the end of its file; a partition counts
the ended jobs. Before, the Detector kept every job it had seen and their incidents stayed
open for ever."""

from __future__ import annotations

import orjson
import pytest
from test_streams_partition import messages, run

from failslow.commands.detect import detect_lines
from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate
from failslow.streams.partition import JobPartition

# gpu_thermal_30 (rank 5 throttles from 30 s to 90 s) cut 80 s in: its incident is open and
# loud (the paging policy pages after persistence, then resolves within ~10 steps of the
# recovery, so a cut after ~97 s would find it already resolved)
CUT_TS = 1767225680.0


@pytest.fixture(scope="module")
def cut_trace() -> list[dict]:
    return [e for e in simulate(SCENARIOS["gpu_thermal_30"], seed=0).events()
            if e["ts"] < CUT_TS]


def telemetry_after(events: list[dict], seconds: float, every: float = 10.0) -> list[dict]:
    """The job's hosts keep sampling after the job stopped (as collectors do)."""
    t0 = events[-1]["ts"]
    hosts = sorted({e["host"] for e in events})
    return [{"v": 1, "kind": "host", "host": h, "ts": t0 + k * every}
            for k in range(1, int(seconds / every) + 1) for h in hosts]


def last_job_ts(events: list[dict]) -> float:
    return max(e["ts"] for e in events if e["kind"] in ("step", "comm", "collective"))


def test_a_silent_job_ends_its_incidents_resolve_and_its_state_goes(cut_trace):
    det = Detector(job_idle_s=120.0)
    opened = det.process_batch(cut_trace)
    assert any(i["status"] == "open" and i["severity"] != "info" for i in opened)
    # silent for less than job_idle_s: nothing ends
    assert det.process_batch(telemetry_after(cut_trace, 100.0)) == []
    assert "job0" in det.jobs and det.tracker.open
    later = telemetry_after(cut_trace, 400.0)
    ended = det.process_batch([e for e in later if e["ts"] > cut_trace[-1]["ts"] + 100.0])
    assert ended and all(i["status"] == "resolved" for i in ended)
    assert {i["resolved_reason"] for i in ended} == {"job ended"}
    assert all(i["evidence"]["resolved_reason"] == "job ended" for i in ended)
    last = last_job_ts(cut_trace)
    assert all(i["resolved_ts"] == i["ts"] == last for i in ended)
    assert {i["incident_id"] for i in ended} == {i["incident_id"] for i in opened}
    assert det.jobs_ended == 1
    assert det.jobs == {} and det.tracker.open == {} and det._causes == {}
    assert det.tracker.reopened == {} and det._seen == {}
    # and from its snapshot
    state = Detector.from_state(orjson.loads(orjson.dumps(det.state_dict())))
    assert state.jobs == {} and state.tracker.open == {}


def test_job_end_does_not_depend_on_how_events_are_batched(cut_trace):
    events = cut_trace + telemetry_after(cut_trace, 400.0)
    whole = Detector(job_idle_s=120.0).process_batch(events)
    det = Detector(job_idle_s=120.0)
    pieces = []
    for i in range(0, len(events), 97):
        pieces += det.process_batch(events[i:i + 97])
    assert pieces == whole
    assert any(i.get("resolved_reason") == "job ended" for i in whole)


def test_one_event_stamped_far_ahead_does_not_end_the_jobs(cut_trace):
    det = Detector(job_idle_s=120.0)
    det.process_batch(cut_trace)
    ahead = {"v": 1, "kind": "host", "host": "elsewhere", "ts": cut_trace[-1]["ts"] + 86400.0}
    assert det.process_batch([ahead]) == []
    assert "job0" in det.jobs and det.tracker.open


def test_detect_ends_every_job_at_the_end_of_the_file(cut_trace):
    lines = [orjson.dumps(e) for e in cut_trace]
    out: list[dict] = []
    detect_lines(lines, Detector(), out.append, lambda no, why: None)
    assert out[-1]["status"] == "resolved" and out[-1]["resolved_reason"] == "job ended"
    assert out[-1]["resolved_ts"] == last_job_ts(cut_trace)
    ids = {i["incident_id"] for i in out}
    assert ids == {i["incident_id"] for i in out if i["status"] == "resolved"}


def test_a_partition_ends_the_job_like_the_offline_detector(cut_trace):
    events = cut_trace + telemetry_after(cut_trace, 400.0)
    part = JobPartition(0, detector_factory=lambda: Detector(job_idle_s=120.0))
    out = run(messages(events), part)
    ended = [i for i in out if i.get("resolved_reason") == "job ended"]
    assert ended and part.counts["jobs_ended"] == 1
    assert part.detector.jobs == {}
    offline = Detector(job_idle_s=120.0).process_batch(events)
    assert [i for i in offline if i.get("resolved_reason") == "job ended"] == ended
    assert "job0" not in orjson.dumps(part.snapshot()["detector"]).decode() or \
        Detector.from_state(part.snapshot()["detector"]).jobs == {}
