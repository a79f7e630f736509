"""Issue 17 (worker memory flat): a partition's event ordering forgets the jobs and hosts
that are gone. Before, ``EventOrder`` kept in ``_arrived`` every (telemetry kind, host) and
every ("step", job) it had seen, in ``_coll_jobs`` every job whose collectives came, and
in ``_unsent`` every source that never came, so a worker following a cluster grew with
every job and host, and each watermark recompute walked all of them."""

from __future__ import annotations

from test_models_telemetry_forget import IDLE_S, instances

from failslow.models.pipeline import Detector
from failslow.streams.partition import JobPartition


def live(part: JobPartition, evs: list[dict], offset: int) -> list[dict]:
    """Feed ``evs`` as a live stream: each second of event time arrives at that time."""
    out: list[dict] = []
    lo = 0
    t_end = evs[-1]["ts"]
    t = evs[0]["ts"]
    while lo < len(evs):
        hi = lo
        while hi < len(evs) and evs[hi]["ts"] <= t:
            hi += 1
        if hi > lo:
            out += part.ingest(evs[lo:hi], offset + lo, t + 0.05)
        out += part.tick(t + 0.1)
        lo = hi
        t += 1.0
    # the job is over: its hosts stay quiet while the clock runs on past 6 x lateness
    for k in range(1, 90):
        out += part.tick(t_end + k)
    return out


def test_the_ordering_forgets_the_jobs_and_hosts_that_ended():
    runs = instances(4, gap_s=2 * IDLE_S)
    part = JobPartition(0, detector_factory=lambda: Detector(job_idle_s=IDLE_S))
    sizes = []
    for k, evs in enumerate(runs):
        live(part, evs, k * 100_000)
        o = part.order
        sizes.append((len(o._arrived), len(o._coll_jobs), len(o._unsent)))
    # what the last job left (dropped once a live stream moves on), not what all left
    # (before: 3 telemetry kinds x hosts + 1 per job, and one collective job per job)
    assert sizes == [sizes[0]] * len(runs), sizes
    assert sizes[0][0] > 0
    hosts = {kh[1] for kh in part.order._arrived if kh[0] != "step"}
    assert not any(h.startswith(("j0-", "j1-")) for h in hosts), hosts
