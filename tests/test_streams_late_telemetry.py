"""Device telemetry delivered late (wall clock) relative to the steps, at the partition
level with the real Detector (issue 17, "data replayed late gives root cause unknown").

30 s late, the partition still waits for it: the root cause is known from the first
event. 120 s late, the steps of the fault are judged before any sample of it arrived,
so the incident opens and pages with root cause ``unknown``; when the culprit's samples
of that window arrive, open or resolved since, it is attributed again (the Detector's
``IncidentTracker.late_sample``, the same code offline and in a worker) and an update
carries the cause, which later events (the resolve) keep. Offline, a ts ordered file
knows the cause at once: the incident's final state is the same either way."""

from __future__ import annotations

from test_streams_partition import messages, trace

from failslow.models.pipeline import Detector
from failslow.streams.partition import JobPartition

INCIDENT = "job0:slow_rank:r5:25"


def arrivals(tel_late_s: float) -> list[tuple[float, int, list[dict]]]:
    out = []
    for n, m in enumerate(messages(trace("gpu_thermal_30"))):
        t = max(e["ts"] for e in m) + 0.2
        if m[0]["kind"] in ("gpu", "nic", "host"):
            t += tel_late_s
        out.append((t, n, m))
    out.sort(key=lambda a: a[:2])
    return out


def stream(tel_late_s: float) -> list[dict]:
    part, out = JobPartition(0), []
    for off, (t, _, m) in enumerate(arrivals(tel_late_s)):
        out += part.ingest(m, off, now=t)
        out += part.tick(t)
    return out + part.tick(1e12)


def final(incidents: list[dict]) -> dict[str, str | None]:
    last: dict[str, str | None] = {}
    for i in incidents:
        last[i["incident_id"]] = i.get("root_cause")
    return last


def test_telemetry_30_s_late_still_gives_the_root_cause():
    out = stream(30.0)
    assert {(i["incident_id"], i.get("root_cause")) for i in out if i["status"] == "open"} \
        == {(INCIDENT, "gpu_thermal")}


def test_telemetry_120_s_late_is_attributed_when_it_arrives():
    out = stream(120.0)
    assert final(out) == {INCIDENT: "gpu_thermal"}
    causes = [i["root_cause"] for i in out]
    first = causes.index("gpu_thermal")
    # judged before the samples came: unknown (and paged); then one update with the cause
    assert first > 0 and set(causes[:first]) == {"unknown"}
    assert any(i["severity"] != "info" for i in out[:first])
    update = out[first]     # open, or resolved already (the fault ended before its samples came)
    assert update["evidence"]["root_cause_from"] == "late telemetry"
    assert update["ts"] > out[first - 1]["ts"]      # a later state, not a tie
    assert set(causes[first:]) == {"gpu_thermal"}


def test_late_telemetry_gives_the_same_cause_offline_and_in_the_stream():
    # offline, ts order: the cause at once; in the stream, 120 s late: by an update
    det, offline = Detector(), []
    events = sorted((e for _, _, m in arrivals(0.0) for e in m), key=lambda e: e["ts"])
    for e in events:
        offline += det.process(e)
    offline += det.end_jobs()
    assert offline[0]["root_cause"] == "gpu_thermal"
    assert final(offline) == final(stream(120.0)) == {INCIDENT: "gpu_thermal"}
