"""A replay of an ended job's events pages nobody again (issue 33 item 3).

A job opens an incident and ends; the partition goes on with another job long enough for
the ended job's de-duplication marks to be forgotten (``prune``, as each snapshot does);
then every event of the ended job arrives again (a producer's spool, ``failslow replay``
of its file). Before the fix the replay re-created the job: a new incident opened (root
cause ``unknown``, its telemetry was gone) and was paged a second time.
"""

from __future__ import annotations

import orjson
from test_models_job_end import CUT_TS
from test_streams_partition import canon, messages

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate
from failslow.simulator.relocate import relocate
from failslow.streams.partition import ENDED_JOBS_MAX, JobPartition

IDLE_S = 20.0


def jobs() -> tuple[list[dict], list[dict]]:
    """The first 80 s of a faulty job (its incident is open when it stops), and a second
    job on other hosts starting 60 s after it stopped, running 100 s."""
    a = [e for e in simulate(SCENARIOS["gpu_thermal_30"], seed=0).events()
         if e["ts"] < CUT_TS]
    b = [relocate(e, 140.0, "b") for e in simulate(SCENARIOS["healthy_16"], seed=1).events()]
    return a, [e for e in b if e["ts"] < 1_767_225_840.0]


def telemetry_after(events: list[dict], seconds: float) -> list[dict]:
    """The job's hosts go on sampling once a second after it paused."""
    t0 = events[-1]["ts"]
    hosts = sorted({e["host"] for e in events})
    return [{"v": 1, "kind": "host", "host": h, "ts": t0 + k}
            for k in range(1, int(seconds) + 1) for h in hosts]


def partition() -> JobPartition:
    return JobPartition(0, detector_factory=lambda: Detector(job_idle_s=IDLE_S))


def feed(part: JobPartition, msgs: list[list[dict]], off: int, dt: float = 0.01
         ) -> tuple[list[dict], int]:
    """Feed ``msgs`` from offset ``off``, ``dt`` s of wall time apart, pruning every 100
    messages as the snapshot timer does; returns the incidents and the next offset."""
    out = []
    for m in msgs:
        out += part.ingest(m, off, now=off * dt)
        if off % 100 == 0:
            part.prune()
        off += 1
    return out, off


def test_a_replay_of_an_ended_job_pages_nobody():
    a, b = jobs()
    part = partition()
    first, off = feed(part, messages(a + b), 0)
    ended = [i for i in first if i.get("resolved_reason") == "job ended"]
    assert ended and part.counts["jobs_ended"] == 1
    part.prune()
    assert not any(src[1] == "job0" for src in part._marks)   # its marks are gone
    replayed, off = feed(part, messages(a), off)
    assert replayed == []
    assert part.counts["jobs_ended"] == 1
    # the second job goes on as if nothing was replayed
    rest = [relocate(e, 100.0, "b") for e in simulate(SCENARIOS["healthy_16"], seed=1).events()
            if 1_767_225_740.0 <= e["ts"] < 1_767_225_760.0]
    later, _ = feed(part, messages(rest), off)
    assert all(i["job_id"] != "job0" for i in later)


def test_the_memory_of_ended_jobs_survives_a_restart_and_is_bounded():
    a, b = jobs()
    part = partition()
    first, off = feed(part, messages(a + b), 0)
    part.prune()
    snap = orjson.loads(orjson.dumps(part.snapshot()))
    second = partition()
    second.restore(snap)
    for inc in first:
        second.remember(inc)
    replayed, _ = feed(second, messages(a), off)
    assert replayed == []
    assert second.counts["duplicates"] == len(a) - sum(e["kind"] in ("gpu", "nic", "host")
                                                       for e in a)
    # bounded: the oldest ended jobs are forgotten first
    for k in range(ENDED_JOBS_MAX + 10):
        second._ended_job(f"x{k}", float(k))
    assert len(second._ended) == ENDED_JOBS_MAX and "x0" not in second._ended


def test_a_job_that_resumes_after_its_marks_were_forgotten_is_judged():
    """Newer events of a job whose marks were pruned (it paused 90 s, its hosts sampling
    meanwhile, then resumed) are not replays: they are judged, and the incidents are the
    offline Detector's."""
    a, _ = jobs()
    pause = [e for e in a if e["ts"] < 1_767_225_650.0]
    quiet = telemetry_after(pause, 90.0)
    resumed = [relocate(e, 90.0, "") | {k: e[k] for k in ("job_id", "host", "uuid") if k in e}
               for e in a if e["ts"] >= 1_767_225_650.0]
    ref = Detector().process_batch(pause + quiet + resumed)
    assert any(i["status"] == "open" for i in ref)
    part = JobPartition(0)
    # 0.1 s apart: the job's sources stop holding the watermark after ``lateness``
    got, off = feed(part, messages(pause + quiet), 0, dt=0.1)
    got += part.tick(off * 0.1 + 3.0)    # the partition idles: what it held goes on
    part.prune()
    assert not any(src[1] == "job0" for src in part._marks)
    more, _ = feed(part, messages(resumed), off + 100, dt=0.1)
    assert canon(got + more + part.tick(1e9)) == canon(ref)
