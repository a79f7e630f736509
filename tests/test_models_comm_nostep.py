"""A job that sends only ``comm`` windows with ``step`` null (an NCCL Inspector tailer,
no step events): its steps are derived from a clock shared by all ranks
(``JobState._nostep_comm``), judged from the windows, and dropped as steps are (issue 14)."""

from __future__ import annotations

import pickle

from test_streams_partition import canon, interleave, messages, run

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate


def no_step(name: str, seed: int = 1) -> list[dict]:
    """A scenario at comm grain with every ``step`` event removed and ``step`` null."""
    out = []
    for chunk in simulate(SCENARIOS[name], seed=seed, grain="comm").batches():
        for e in chunk:
            if e["kind"] == "step":
                continue
            if e["kind"] == "comm":
                e = dict(e, step=None)
                e.pop("step_end", None)
            out.append(e)
    return out


def detect(events: list[dict]) -> tuple[Detector, list[dict]]:
    det = Detector()
    incs = det.process_batch(events)
    return det, incs + det.flush()


def test_a_throttled_gpu_is_found_without_step_events():
    events = no_step("gpu_thermal_30")
    assert not any(e["kind"] == "step" for e in events)
    det, incs = detect(events)
    loud = {(i["fault"], i.get("rank"), i.get("root_cause")) for i in incs
            if i["severity"] != "info"}
    assert loud == {("slow_rank", 5, "gpu_thermal")}
    job = next(iter(det.jobs.values()))
    assert job.evaluated > 50            # derived steps judged, not one step 0 forever
    assert not job.real_steps


def test_a_healthy_job_without_step_events_raises_nothing_loud():
    for name in ("healthy_16", "checkpoints_16"):
        _, incs = detect(no_step(name))
        assert [i for i in incs if i["severity"] != "info"] == [], name


def test_windows_kept_stay_bounded_as_derived_steps_advance():
    events = no_step("healthy_16")
    det = Detector()
    n_comm = 0
    peak = 0
    for i in range(0, len(events), 200):
        chunk = events[i:i + 200]
        n_comm += sum(e["kind"] == "comm" for e in chunk)
        det.process_batch(chunk)
        job = next(iter(det.jobs.values()))
        kept = sum(len(w) for w in job.comm.steps.values())
        peak = max(peak, kept, len(job.nostep_buf))
        assert len(job.pending) <= job.cfg.max_behind + 2
    world = 16
    assert n_comm > 2000
    # a few derived steps of windows per rank at most, not every window of the job
    assert peak <= 8 * world, peak
    assert job.evaluated > 100
    back = pickle.loads(pickle.dumps(job))
    assert back.nostep_period == job.nostep_period and back.nostep_acc == job.nostep_acc


def test_the_stream_partition_gives_the_offline_incidents_without_steps():
    events = no_step("gpu_thermal_30")
    ref = Detector().process_batch(events)
    assert any(i["severity"] != "info" and i.get("rank") == 5 for i in ref)
    msgs = messages(events)
    for seed in (1, 2):
        assert canon(run(interleave(msgs, seed))) == canon(ref)


def test_a_slow_pipeline_link_without_step_events_keeps_its_send_recv_bounded():
    # The p2p pairs take each window's derived step too (``JobState.comm_step``) and are
    # judged with each whole derived step: before, every window of such a job went to
    # one step that was never judged, and the pairs' pending entries grew without bound.
    events = no_step("p2p_link_pp")
    det = Detector()
    peak = 0
    for i in range(0, len(events), 500):
        det.process_batch(events[i:i + 500])
        peak = max(peak, max((len(p.pending) for p in det._p2p.values()), default=0))
    job = next(iter(det.jobs.values()))
    assert job.evaluated > 20
    assert peak <= 4, peak
