"""Issue 17 (worker memory flat): the Detector forgets the devices of hosts no job runs on
any more. Before, ``TelemetryStore`` kept every GPU, NIC port and host it had ever seen
(plus ``gpu_rank``), so a worker following a cluster whose jobs come and go on new hosts
grew without bound (the 30-min soak: 16 GPUs + 16 NIC ports + 2 hosts per job instance,
~3.5 MiB per hour per partition) and each root-cause attribution, which scans the store,
got slower."""

from __future__ import annotations

import pytest

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate
from failslow.simulator.relocate import relocate
from failslow.streams.partition import JobPartition

IDLE_S = 30.0


def instances(n: int, gap_s: float = 2 * IDLE_S) -> list[list[dict]]:
    """``n`` runs of healthy_16 one after the other (``gap_s`` apart), each on its own
    hosts and GPUs, as a cluster whose jobs land on fresh hosts."""
    base = list(simulate(SCENARIOS["healthy_16"], seed=3).events())
    t0 = min(e["ts"] for e in base)
    span = max(e["ts"] for e in base) - t0
    out = []
    for k in range(n):
        shift = k * (span + gap_s)
        evs = [relocate(e, shift, f"j{k}") for e in base]
        out.append(sorted(evs, key=lambda e: e["ts"]))
    return out


@pytest.fixture(scope="module")
def runs() -> list[list[dict]]:
    return instances(6)


def devices(det: Detector) -> int:
    st = det.store
    return len(st.gpus) + len(st.nics) + len(st.hosts) + len(st.gpu_rank)


def test_the_store_stays_bounded_as_jobs_come_and_go_on_new_hosts(runs):
    det = Detector(job_idle_s=IDLE_S)
    after = []
    for evs in runs:
        det.process_batch(evs)
        after.append(devices(det))
    one_job = after[0]
    assert one_job > 0
    # the devices of one job (the one running) plus at most the previous one's, not all
    assert max(after) <= 2 * one_job, after
    hosts = {h for h, _ in det.store.gpus} | set(det.store.hosts)
    assert not any(h.startswith(("j0-", "j1-", "j2-")) for h in hosts)


def test_a_live_jobs_devices_stay_even_when_they_fall_silent(runs):
    """Only devices of hosts no live job runs on are forgotten: a running job whose
    collector stopped keeps what its devices last said (its root cause may need it)."""
    evs = runs[0]
    cut = evs[len(evs) // 2]["ts"]
    # the job keeps stepping, its hosts' telemetry stops halfway
    feed = [e for e in evs if e["kind"] not in ("gpu", "nic", "host") or e["ts"] < cut]
    det = Detector(job_idle_s=IDLE_S)
    det.process_batch(feed)
    assert det.jobs
    job_hosts = {h for j in det.jobs.values() for h in j.rank_host.values()}
    assert {h for h, _ in det.store.gpus} >= job_hosts


def test_a_partition_snapshot_does_not_grow_with_the_jobs_it_saw(runs):
    """The worker's state (and so its snapshot) after 6 jobs is that of ~1, not 6."""
    sizes = []
    part = JobPartition(0, detector_factory=lambda: Detector(job_idle_s=IDLE_S))
    now = 1e6
    for k, evs in enumerate(runs):
        for i in range(0, len(evs), 500):
            now += 1.0
            part.ingest(evs[i:i + 500], k * 10_000 + i, now)
        part.tick(now + 60.0)
        part.prune()
        sizes.append(len(part.snapshot()["detector"]["state"]))
    assert sizes[-1] <= 1.3 * sizes[1], sizes
