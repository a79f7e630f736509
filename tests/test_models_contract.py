"""River-style contract over every stateful model: clone gives a fresh object
with the same parameters, pickling keeps the state, the input is never
mutated, and the same input gives the same output."""

from __future__ import annotations

import copy
import inspect
import pickle

import numpy as np
import pytest
from test_models_pipeline import synth

from failslow.models.changepoint import BOCPD
from failslow.models.config import ChangepointConfig
from failslow.models.mitigation import Planner
from failslow.models.pipeline import Detector
from failslow.models.stats import EWMeanVar, RollingMedian


def _feed_stat(obj, xs):
    out = []
    for x in xs:
        obj.update(x)
        out.append(tuple(getattr(obj, a) for a in ("mean", "var", "median", "shift",
                                                   "drift_detected") if hasattr(obj, a)))
    return out


def _feed_detector(obj, evs):
    return obj.process_batch(evs)


XS = [float(x) for x in np.log(np.random.default_rng(0).lognormal(0, 0.05, 60))] + [0.3] * 10
CASES = [
    (EWMeanVar(alpha=0.2), _feed_stat, XS),
    (RollingMedian(window=8), _feed_stat, XS),
    (BOCPD(ChangepointConfig(hazard=1 / 100, window=6)), _feed_stat, XS),
    (Detector(min_rel=0.06, z_min=5.0), _feed_detector, synth(slow=4, steps=40)),
]


@pytest.mark.parametrize("obj,feed,data", CASES, ids=lambda c: type(c).__name__)
def test_clone_keeps_parameters_and_drops_state(obj, feed, data):
    used = obj.clone()
    feed(used, data[: len(data) // 2])
    fresh = used.clone()
    for name in inspect.signature(type(obj)).parameters:
        if name != "planner":
            assert getattr(fresh, name) == getattr(obj, name), name
    assert feed(fresh, data) == feed(obj.clone(), data)


@pytest.mark.parametrize("obj,feed,data", CASES, ids=lambda c: type(c).__name__)
def test_pickle_keeps_state(obj, feed, data):
    a = obj.clone()
    feed(a, data[: len(data) // 2])
    b = pickle.loads(pickle.dumps(a))
    rest = data[len(data) // 2:]
    assert feed(b, rest) == feed(a, rest)


@pytest.mark.parametrize("obj,feed,data", CASES, ids=lambda c: type(c).__name__)
def test_input_not_mutated_and_deterministic(obj, feed, data):
    before = copy.deepcopy(data)
    first = feed(obj.clone(), data)
    assert data == before
    assert feed(obj.clone(), data) == first


def test_planner_clone_and_pickle():
    p = Planner(min_pct=3.0, migrate_s=30.0)
    assert pickle.loads(pickle.dumps(p)).plan("slow_rank", "gpu_errors", 20, 500, 1.0) \
        == p.clone().plan("slow_rank", "gpu_errors", 20, 500, 1.0)
