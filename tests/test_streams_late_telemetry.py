"""Device telemetry delivered late (wall clock) relative to the steps, at the partition
level with the real Detector (issue 17, "data replayed late gives root cause unknown"):
samples 30 s late still explain the culprit; 120 s late they do not yet. Reproduction,
cause not fully traced: the first steps are judged with no sample (the hosts' telemetry
is awaited only for a while), the samples then arrive behind the watermark and are
applied after the steps they explain (thousands of late samples), and the incident's
attributions all say ``unknown``."""

from __future__ import annotations

import pytest
from test_streams_partition import messages, trace

from streams.partition import JobPartition


def causes(tel_late_s: float) -> set[tuple[str, str]]:
    arrivals = []
    for n, m in enumerate(messages(trace("gpu_thermal_30"))):
        t = max(e["ts"] for e in m) + 0.2
        if m[0]["kind"] in ("gpu", "nic", "host"):
            t += tel_late_s
        arrivals.append((t, n, m))
    arrivals.sort(key=lambda a: a[:2])
    part, out = JobPartition(0), []
    for off, (t, _, m) in enumerate(arrivals):
        out += part.ingest(m, off, now=t)
        out += part.tick(t)
    out += part.tick(1e12)
    return {(i["incident_id"], i.get("root_cause")) for i in out if i["status"] == "open"}


def test_telemetry_30_s_late_still_gives_the_root_cause():
    assert causes(30.0) == {("job0:slow_rank:r5:25", "gpu_thermal")}


@pytest.mark.xfail(strict=True, reason="issue 17: steps judged before late telemetry is not "
                   "re-attributed when the samples arrive; not fixed yet")
def test_telemetry_120_s_late_gives_the_root_cause():
    assert causes(120.0) == {("job0:slow_rank:r5:25", "gpu_thermal")}
