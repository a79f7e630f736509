"""A judged step's intake and judging without per-rank Python where it is not needed
(issue 31): a ``step_batch``'s rows taken together (``JobState.add_step_rows``) judge
what its rows taken one by one (``add_step_row``) judge, and leave the same state; the
job's ranks by host (``JobState.layout``) follow ``rank_host`` and are never pickled; the
learned-noise pools of ``models.evidence.Windows`` are those of a fresh copy after every
change of the moments."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from failslow.models.config import EvidenceConfig, JobConfig
from failslow.models.evidence import Windows
from failslow.models.job import JobState
from failslow.models.layout import Layout


def _batch(step, ranks: list[int], world, host: str = "h0", t0: float = 100.0) -> dict:
    n = len(ranks)
    return {"v": 1, "kind": "step_batch", "job_id": "j", "host": host, "step": step,
            "world_size": world, "rank": ranks, "ts": [t0 + 0.001 * i for i in range(n)],
            "duration_s": [1.0 + 0.01 * (r % 3) for r in ranks],
            "compute_s": [0.8 + 0.01 * (r % 5) for r in ranks],
            "comm_s": [0.2] * n, "data_s": [0.0] * n, "gpu": [r % 8 for r in ranks]}


def _state(job: JobState) -> tuple:
    return (sorted((s, sorted(row)) for s, row in job.pending.items()),
            sorted(job.last_step.items()), sorted(job.moved.items()), job.progress,
            job.evaluated, job.world, job.judged, job.real_steps)


def _feed(batches: list[dict], together: bool) -> tuple[list[str], JobState]:
    job = JobState("j", JobConfig())
    out = []
    for b in batches:
        n = len(b["rank"])
        if together:
            i = 0
            while i < n:
                got, i = job.add_step_rows(b, i, n)
                out += [repr(x) for x in got]
        else:
            for i in range(n):
                out += [repr(x) for x in job.add_step_row(b, i)]
    return out, job


def _layouts(world: int, steps: int, per_host: int, seed: int) -> list[dict]:
    """Each step's ranks in hosts' batches of ``per_host``, hosts in a shuffled order, some
    ranks late by a step, a rank twice in one batch, a batch of a step already judged."""
    rng = np.random.default_rng(seed)
    out = []
    late: list[int] = []
    for s in range(steps):
        ranks = [r for r in range(world) if r not in late]
        order = rng.permutation(len(ranks)).tolist()
        ranks = [ranks[i] for i in order]
        for k in range(0, len(ranks), per_host):
            part = ranks[k:k + per_host]
            if s == 3 and k == 0:
                part = part + part[:1]          # a rank twice in its batch
            out.append(_batch(s, part, world, host=f"h{k}", t0=100.0 + 2 * s + 0.01 * k))
        if late:
            out.append(_batch(s - 1, late, world, t0=100.0 + 2 * s + 1.0))  # behind
        late = rng.choice(world, size=2, replace=False).tolist() if s % 4 == 1 else []
    out.append(_batch(0, [0, 1], world, t0=200.0))        # a step long judged
    return out


@pytest.mark.parametrize("world,per_host,seed", [(16, 8, 0), (24, 5, 1), (64, 8, 2),
                                                 (9, 4, 3)])
def test_rows_taken_together_judge_as_rows_taken_one_by_one(world, per_host, seed):
    batches = _layouts(world, 12, per_host, seed)
    one, job_one = _feed(batches, together=False)
    both, job_both = _feed(batches, together=True)
    assert len(one) >= 8                 # steps were judged: the comparison says much
    assert both == one
    assert _state(job_both) == _state(job_one)


def test_rows_of_several_steps_in_one_batch_are_taken_one_by_one():
    b = _batch(0, [0, 1, 2, 3], 4)
    b["step"] = [0, 0, 1, 1]
    job = JobState("j", JobConfig())
    got, i = job.add_step_rows(b, 0, 4)
    assert i == 1 and got == []
    while i < 4:
        _, i = job.add_step_rows(b, i, 4)
    assert sorted(job.pending) == [0, 1] and job.last_step == {0: 0, 1: 0, 2: 1, 3: 1}


def test_the_layout_follows_rank_host_and_is_never_pickled():
    job = JobState("j", JobConfig())
    job.rank_host.update({0: "a", 1: "b", 2: "a"})
    lay = job.layout()
    assert lay.members == {"a": [0, 2], "b": [1]} and job.layout() is lay
    assert lay.host_index(np.array([1, 0, 5, -1])).tolist() == [1, 0, -1, -1]
    job.rank_host[3] = "b"
    assert job.layout() is not lay and job.layout().members["b"] == [1, 3]
    job.rank_host[0] = "c"                  # a rank moved to another host
    assert job.layout().members == {"c": [0], "b": [1, 3], "a": [2]}
    assert "_layout" not in job.__getstate__()
    # a shard's block of ranks (an array from its lowest), ranks far apart (looked up)
    for ranks in (range(4096, 4104), [3, 70000, 5]):
        lay = Layout({r: f"h{r % 3}" for r in ranks})
        probe = np.array([*ranks, -1, 0, 4095, 4104, 69999])
        want = [lay.order.get(f"h{r % 3}", -1) if r in ranks else -1 for r in probe.tolist()]
        assert lay.host_index(probe).tolist() == want
    back = pickle.loads(pickle.dumps(job))
    assert back._layout is None and back.layout().members == job.layout().members


def test_pooled_noise_is_that_of_a_fresh_copy_after_every_change_of_the_moments():
    rng = np.random.default_rng(5)
    p = EvidenceConfig()
    w = Windows(p.width, p)
    ranks = list(range(12))
    for k in range(40):
        rows = w.rows_for(ranks if k < 20 else ranks + [12, 13])   # new rows midway
        w.begin(rows)
        w.push(rows, rng.normal(0.0, 0.05, rows.size) + (0.3 if k > 30 else 0.0) * (rows == 3))
        sub = rows[[1, 3, 5]]
        sigma = np.full(sub.size, 0.02)
        w.present(rows, np.full(rows.size, 0.02), 0.05)   # the memos of every row first
        fresh = copy.deepcopy(w)          # a copy holds no memo (never pickled)
        assert w.present(sub, sigma, 0.05).tolist() == fresh.present(sub, sigma, 0.05).tolist()
        assert w.learned(sub).tolist() == fresh.learned(sub).tolist()
        assert w.noise(sub, sigma).tobytes() == fresh.noise(sub, sigma).tobytes()
        assert w.mean_se(sub, sigma, sigma, np.full(sub.size, 8), 8).tobytes() == \
            fresh.mean_se(sub, sigma, sigma, np.full(sub.size, 8), 8).tobytes()
        w.learn(rows, np.ones(rows.size, dtype=bool))
        fresh = copy.deepcopy(w)
        assert w.noise(sub, sigma).tobytes() == fresh.noise(sub, sigma).tobytes()
        assert w.inflation(sub, 12).tobytes() == fresh.inflation(sub, 12).tobytes()
    assert w.learned(rows).all()
