"""A rank with no peer doing the same work (one rank per pipeline stage) is judged only
against its own past (issue 13): a stage whose own work doubles from step N pages within
10 steps of N; a stage heavier by design, from the first step, never pages.

Traces are built here by hand: 4 pipeline stages, one rank each (``pp_rank``), two
stages per host as on one machine of a small job, step events with ``compute_s``. When
the culprit's work doubles its host-mate slows too for the first steps (they share the
machine's cores): the two rise together, like a host fault starting, then the host-mate
is clean again. That possible host fault must not hold the culprit's own verdict for
long (``models.localize``), and a confirmation whose own-past evidence is strong pages
at once, as one far outside its peers does (``models.incidents`` ``steady``: a rank
alone in its stage has no z to peers, its window's mean-excess z stands in)."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import pytest

from failslow import schema
from failslow.models.pipeline import Detector

OWN_S = 0.02        # a stage's own work per step, seconds
NOISE = 0.10        # its step-to-step noise (log sigma): a shared 2-core VM
ONSET = 28
STEPS = 52


def trace(seed: int, slow: int | None = None, factor: float = 2.0, onset: int = ONSET,
          heavy: int | None = None, heavy_factor: float = 1.5, mate_rise: float = 1.4,
          mate_steps: int = 3) -> tuple[list[dict], list[float]]:
    """(step events in ts order, each step's end ts). ``slow``'s own work is ``factor``
    times its usual from step ``onset`` (its host-mate ``mate_rise`` times for
    ``mate_steps`` steps from the onset); ``heavy``'s is ``heavy_factor`` times from
    step 0. A step lasts the sum of the stages' work plus the transfers (a pipeline
    fills and drains once per step), the same for every stage; the rest is comm_s."""
    rng = np.random.default_rng(seed)
    t = 1.76e9 + float(rng.uniform(0, 1e4))
    host = {0: "h0", 1: "h0", 2: "h1", 3: "h1"}
    mate = {0: 1, 1: 0, 2: 3, 3: 2}
    out: list[dict] = []
    ends: list[float] = []
    for s in range(STEPS):
        own = OWN_S * np.exp(NOISE * rng.normal(0, 1, 4))
        if heavy is not None:
            own[heavy] *= heavy_factor
        if slow is not None and s >= onset:
            own[slow] *= factor
            if s < onset + mate_steps:
                own[mate[slow]] *= mate_rise
        dur = float(own.sum() + 0.01)
        t += dur
        ends.append(t)
        for r in range(4):
            ev = {"v": 1, "kind": "step", "ts": t + 1e-4 * r, "job_id": "pp", "rank": r,
                  "world_size": 4, "host": host[r], "step": s, "duration_s": dur,
                  "dp_rank": 0, "pp_rank": r, "compute_s": float(own[r]),
                  "comm_s": dur - float(own[r]), "data_s": 0.0}
            schema.validate(ev)
            out.append(ev)
    return out, ends


def detect(evs: list[dict]) -> list[dict]:
    det = Detector()
    return det.process_batch(evs) + det.flush()


def loud(incs: list[dict]) -> list[dict]:
    return [i for i in incs if i["severity"] != "info"]


@pytest.mark.parametrize("seed", range(6))
def test_stage_whose_work_doubles_pages_within_ten_steps(seed):
    evs, ends = trace(seed, slow=2)
    incs = detect(evs)
    pages = loud(incs)
    assert pages and {(i["fault"], i.get("rank")) for i in pages} == {("slow_rank", 2)}, \
        [(i["fault"], i.get("rank"), i["severity"]) for i in pages]
    # the page itself (its event's ts), not only the incident's opening
    step = bisect_left(ends, pages[0]["ts"] - 1e-3)
    assert step - ONSET <= 10, (step, pages[0]["incident_id"])
    assert pages[0]["evidence"]["evidence"] == "change"
    # a rank alone in its stage has no z to its peers: none is claimed
    assert "z_to_peers" not in pages[0]["evidence"]


@pytest.mark.parametrize("seed", range(6))
def test_stage_heavier_from_the_first_step_never_pages(seed):
    evs, _ = trace(seed, heavy=3)
    assert loud(detect(evs)) == []


@pytest.mark.parametrize("seed", range(3))
def test_benign_pipeline_pages_nobody(seed):
    evs, _ = trace(seed)
    assert loud(detect(evs)) == []
