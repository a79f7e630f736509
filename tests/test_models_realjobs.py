"""Detection on traces shaped like small real torch jobs (4 ranks sharing 2 CPU
cores, gloo, ~0.2 s steps), from a numpy generator written here (not ``simulator``).

What real jobs look like and the simulator does not:
- own work varies tens of per cent from step to step (ranks fight for cores), with
  a common part (the whole box slows) and a per-rank part that persists a few steps;
- with the old hook's accounting (``comm_s`` the SUM of overlapping bucket
  all-reduces), a rank that waits for a straggler reports part of its backward as
  communication: its ``compute_s`` collapses while the straggler runs;
- layouts: a pipeline with one rank per stage (no peer does the same work) and a
  last stage heavier by design; replicas of a pipeline (peers = same ``pp_rank``);
- workers a steady few per cent slower than their peers from the first step.

Every step event is CONTRACT-valid and fed in ts order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from failslow import schema
from failslow.models.pipeline import Detector


@dataclass
class Job:
    ranks: int = 4
    steps: int = 160
    own_s: float = 0.15          # typical own work per step, seconds
    spread: float = 0.3          # per-step log-spread of own work (0.3 = ~30 %)
    persist: float = 0.3         # step-to-step correlation of a rank's own noise (AR(1))
    slow: int | None = None
    factor: float = 1.0          # own work multiplier of ``slow`` from ``onset``
    stall: float = 0.0           # extra input wait of ``slow`` from ``onset``, x own_s
    onset: int = 60
    collapse: bool = False       # the old hook: waiting ranks report compute as comm
    weights: tuple[float, ...] = ()   # steady per-rank own-work multipliers (imbalance)
    stages: int = 1              # pipeline stages; ranks // stages replicas each
    micro: int = 4               # micro-batches per step (pipeline)
    seed: int = 0


def trace(j: Job) -> tuple[list[dict], float]:
    """(events, measured job step-time increase after the onset, fraction)."""
    rng = np.random.default_rng(j.seed)
    n = j.ranks
    w = np.array(j.weights or (1.0,) * n)
    per_stage = n // j.stages
    t = 1.76e9 + float(rng.uniform(0, 1e5))
    ar = np.zeros(n)
    out: list[dict] = []
    durs = []
    for s in range(j.steps):
        ar = j.persist * ar + np.sqrt(1 - j.persist ** 2) * rng.normal(0, 1, n)
        common = rng.normal(0, 0.5)
        own = j.own_s * w * np.exp(j.spread * (0.8 * ar + 0.6 * common))
        data = 0.01 * rng.lognormal(0, 0.3, n)
        if j.slow is not None and s >= j.onset:
            own[j.slow] *= j.factor
            data[j.slow] += j.stall * j.own_s * rng.lognormal(0, 0.2)
        if j.stages > 1:
            stage_of = np.arange(n) // per_stage
            mb = np.array([max(own[stage_of == k] + data[stage_of == k]) for k in range(j.stages)])
            dur = (j.micro + j.stages - 1) * float(mb.max()) / j.micro + 0.01
            ready = t + own + data
            end = t + dur
        else:
            ready = t + own + data
            end = float(ready.max()) + 0.02 * float(rng.lognormal(0, 0.3))
            dur = end - t
        durs.append(dur)
        for r in range(n):
            wait = end - float(ready[r])
            compute = float(own[r])
            if j.collapse:
                # Summed bucket all-reduces overlap backward: the longer the wait,
                # the more of backward is reported as communication.
                f = min(0.95, 0.6 * wait / compute + float(rng.uniform(0, 0.25)))
                compute *= 1 - f
            comm = max(dur - compute - float(data[r]), 0.0)
            ev = {"v": 1, "kind": "step", "ts": end + 1e-4 * r, "job_id": "ddp-cpu", "rank": r,
                  "world_size": n, "host": "box0", "step": s, "duration_s": dur,
                  "compute_s": compute, "comm_s": comm, "data_s": float(data[r])}
            if j.stages > 1:
                ev.update(pp_rank=r // per_stage, dp_rank=r % per_stage)
            schema.validate(ev)
            out.append(ev)
        t = end + 0.002
    d = np.array(durs)
    return out, float(d[j.onset + 5:].mean() / d[10:j.onset].mean() - 1.0)


def detect(j: Job) -> tuple[list[dict], float]:
    events, slowdown = trace(j)
    det = Detector()
    incs = det.process_batch(events) + det.flush()
    for i in incs:
        schema.validate(i)
    return incs, slowdown


def loud(incs: list[dict]) -> set[tuple]:
    return {(i["fault"], i.get("rank")) for i in incs if i["severity"] != "info"}


def last_of(incs: list[dict], rank: int) -> dict | None:
    mine = [i for i in incs if i.get("rank") == rank and i["fault"] == "slow_rank"
            and not i.get("evidence", {}).get("imbalance")]
    return mine[-1] if mine else None


def show(incs: list[dict]) -> list[tuple]:
    return [(i["incident_id"], i["status"], i["severity"], i["slowdown_pct"]) for i in incs]


@pytest.mark.parametrize("seed", range(8))
def test_benign_noisy_job_pages_nobody(seed):
    incs, _ = detect(Job(seed=seed))
    assert loud(incs) == set(), show(incs)


@pytest.mark.parametrize("seed", range(6))
def test_benign_with_old_hook_accounting_pages_nobody(seed):
    incs, _ = detect(Job(seed=100 + seed, collapse=True))
    assert loud(incs) == set(), show(incs)


def test_rank_at_one_and_a_half_compute_is_named_and_stays_open():
    """Own work 1.5x on one rank raises this generator's job 9-29 %, depending on how
    often the rank is the last one anyway: named in 5 of 6 runs or more, open until the
    job ends, no other rank paged, the slowdown that of the job (not the rank's own
    +50 %): within +-50 % in half the runs or more (a late onset estimate on this noise
    prices low), within 0.4x-2x in all, and few updates."""
    named, close = 0, 0
    for seed in range(6):
        j = Job(slow=seed % 4, factor=1.5, seed=200 + seed)
        incs, slowdown = detect(j)
        assert loud(incs) <= {("slow_rank", j.slow)}, show(incs)
        last = last_of(incs, j.slow)
        if last is None or last["status"] != "open":
            continue
        named += 1
        pct = last["slowdown_pct"]
        close += 0.5 * 100 * slowdown <= pct <= 1.5 * 100 * slowdown
        # Never the rank's own excess (+50 %) nor a multiple of the job's slowdown.
        assert 0.4 * 100 * slowdown <= pct <= 2.0 * 100 * slowdown, (slowdown, show(incs))
        updates = [i for i in incs if i["incident_id"] == last["incident_id"]]
        assert len(updates) <= 2 + (j.steps - j.onset) * 0.2 / 5 + 2
    assert named >= 5 and close >= named // 2, (named, close)


@pytest.mark.parametrize("seed", range(4))
def test_loader_stall_is_named_input_stall(seed):
    j = Job(slow=(seed + 1) % 4, stall=0.5, seed=300 + seed)
    incs, slowdown = detect(j)
    last = last_of(incs, j.slow)
    assert last is not None and last["status"] == "open", show(incs)
    assert last["root_cause"] == "input_stall"
    assert loud(incs) <= {("slow_rank", j.slow)}, show(incs)


@pytest.mark.parametrize("seed", range(4))
def test_victims_of_a_3x_straggler_are_not_culprits(seed):
    j = Job(slow=seed % 4, factor=3.0, collapse=True, seed=400 + seed)
    incs, slowdown = detect(j)
    onset_ts = min(i["onset_ts"] for i in incs if i.get("rank") == j.slow)
    # No healthy rank named while the straggler runs (what noise did before, info, may be).
    named = {i.get("rank") for i in incs if i["fault"] == "slow_rank"
             and i["onset_ts"] >= onset_ts - 1.0}
    assert named == {j.slow} and loud(incs) == {("slow_rank", j.slow)}, show(incs)
    last = last_of(incs, j.slow)
    assert last is not None and last["severity"] == "critical"
    assert 0.5 * 100 * slowdown <= last["slowdown_pct"] <= 1.5 * 100 * slowdown, (
        slowdown, show(incs))
    # Cost from measured time: lost seconds never exceed the job's elapsed time.
    ev = last["evidence"]
    assert 0 < ev["lost_s"] <= (j.steps - j.onset) * 0.2 * 3
    assert ev["gpu_hours_lost"] == pytest.approx(4 * ev["lost_s"] / 3600, rel=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_steady_imbalance_from_the_start_is_info_only(seed):
    rng = np.random.default_rng(500 + seed)
    weights = tuple(1.0 + rng.uniform(0.05, 0.12) * (rng.random() < 0.5) for _ in range(8))
    incs, _ = detect(Job(ranks=8, weights=weights, spread=0.1, seed=500 + seed))
    assert loud(incs) == set(), show(incs)
    imb = [i for i in incs if i.get("evidence", {}).get("imbalance")]
    for i in imb:
        assert i["severity"] == "info" and i["mitigation"] == "rebalance_microbatches"


def test_heavier_last_stage_one_rank_per_stage_is_quiet():
    incs, _ = detect(Job(stages=4, weights=(1.0, 1.0, 1.0, 1.5), seed=600))
    assert loud(incs) == set(), show(incs)


def test_heavier_last_stage_in_both_replicas_is_quiet():
    incs, _ = detect(Job(ranks=8, stages=4, weights=(1.0,) * 6 + (1.5, 1.5), spread=0.15,
                         seed=601))
    assert loud(incs) == set(), show(incs)


@pytest.mark.parametrize("seed", range(3))
def test_pipeline_stage_twice_as_slow_is_paged(seed):
    j = Job(stages=4, slow=1 + seed, factor=2.0, seed=700 + seed)
    incs, _ = detect(j)
    assert loud(incs) == {("slow_rank", j.slow)}, show(incs)


def test_rank_slow_by_half_from_the_first_step_pages():
    incs, _ = detect(Job(ranks=8, weights=(1.0,) * 7 + (1.6,), spread=0.15, seed=800))
    assert loud(incs) == {("slow_rank", 7)}, show(incs)
