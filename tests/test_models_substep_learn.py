"""Sub-step ticks learn their members' noise later, all waiting groups in one call
(``SubStep.learn_due``, ``Windows.learn_many``): the moments learned are those each tick's own
``Windows.learn`` gives, bit for bit, and every tick's answers are unchanged."""

from __future__ import annotations

import copy
import pickle

import numpy as np

from failslow.models.evidence import Windows
from failslow.models.job import JobConfig
from failslow.models.substep import SubStep
from failslow.simulator import SCENARIOS, simulate


def _window_set(rng: np.random.Generator, k: int) -> list[tuple[Windows, np.ndarray, np.ndarray]]:
    """``k`` Windows of a few rows each, their values and moments random (NaN holes, a
    first step, rows learned long ago or never), with rows and masks to learn."""
    out = []
    for _ in range(k):
        n = int(rng.integers(1, 17))
        w = Windows(32)
        w.rows_for(list(range(n)))
        fill = int(rng.integers(0, 33))
        vals = rng.normal(0.0, rng.choice([0.01, 0.1, 1.0]), (n, 32))
        vals[:, :32 - fill] = np.nan
        vals[rng.random((n, 32)) < rng.choice([0.0, 0.1, 0.5])] = np.nan
        vals[rng.random((n, 32)) < 0.05] = rng.choice([5.0, -3.0, 0.0, -0.0])
        w.vals = vals
        mom = rng.normal(0.0, 0.05, (n, 5))
        mom[:, 1] = np.abs(mom[:, 1]) * rng.choice([0.0, 1.0])
        mom[:, 2] = rng.choice([0.0, -0.0, 0.01], n)
        mom[:, 3] = rng.integers(0, 40, n)
        mom[:, 4] = np.abs(mom[:, 4])
        w.mom = mom
        # all rows, a subset, or a permutation
        rows = rng.permutation(n)[: int(rng.integers(1, n + 1))] if rng.random() < 0.5 \
            else np.arange(n)
        mask = rng.random(rows.size) < rng.choice([0.0, 0.5, 1.0])
        out.append((w, rows.astype(np.int64), mask))
    return out


def test_learn_many_learns_what_each_learn_learns_bit_for_bit():
    rng = np.random.default_rng(7)
    for trial in range(200):
        items = _window_set(rng, int(rng.integers(1, 40)))
        alone = copy.deepcopy(items)
        for w, rows, mask in alone:
            w.learn(rows, mask)
        Windows.learn_many(items)
        for (a, _, _), (b, _, _) in zip(alone, items, strict=True):
            assert a.mom.tobytes() == b.mom.tobytes(), trial
            assert np.array_equal(a.vals, b.vals, equal_nan=True)


def _ticks(sub: SubStep, name: str, steps: int, now: bool):
    """Every tick's answers for a scenario's job0 comm windows, in order; ``now``: each
    tick's learning done at once (as before it was left to ``learn_due``)."""
    trace = simulate(SCENARIOS[name], seed=0, steps=steps)
    out = []
    for ev in trace.events():
        if ev.get("job_id") == "job0" and ev["kind"] == "comm" and ev.get("step") is not None:
            got = sub.add(ev, ev["step"])
            if now:
                sub.learn_due()
            out.append(got)
    return out


def test_ticks_learning_later_answer_and_learn_the_same():
    """A culprit found inside its step (tests run, members stop learning): every tick's
    answers, and the moments learned, are those of learning at each tick."""
    for name, steps in (("long8_power_25", 17), ("first8_errors_30", 4)):
        now, later = SubStep(JobConfig()), SubStep(JobConfig())
        a = _ticks(now, name, steps, now=True)
        b = _ticks(later, name, steps, now=False)
        assert a == b
        assert any(conf for got in b for _, conf, _ in got)        # something confirmed
        assert later._due                                          # learning still due
        # pickled: the learning due is done first, and never pickled itself
        back = pickle.loads(pickle.dumps(later))
        assert not later._due and not back._due
        assert now.groups.keys() == back.groups.keys()
        for k, g in now.groups.items():
            for w, v in ((g.raw, back.groups[k].raw), (g.own, back.groups[k].own)):
                assert w.mom.tobytes() == v.mom.tobytes()
                assert w.mom.tobytes() == later.groups[k].__getattribute__(
                    "raw" if w is g.raw else "own").mom.tobytes()
