"""The acting detector (issue 32) plans the same actions and writes the same
``evidence.action`` whatever the batches: ``failslow detect`` reads a file in chunks, the
worker one Kafka message at a time, a restarted worker from a snapshot. Before, the
planner read every step of a batch before the batch's incidents: one whole-file batch
annotated none of ``gpu_thermal_30``'s pages (it had seen the recovery), 50-event
batches five."""

from __future__ import annotations

import orjson
import pytest

from failslow.models.acting import ActingDetector
from failslow.models.actions import ActionPlanner, MitigationConfig
from failslow.models.pipeline import Detector
from failslow.models.shard import ShardedDetector
from failslow.simulator import SCENARIOS, simulate


def events(name: str, seed: int = 0) -> list[dict]:
    return list(simulate(SCENARIOS[name], seed=seed).events())


def run(det: ActingDetector, evs: list[dict], size: int) -> list[dict]:
    out: list[dict] = []
    for k in range(0, len(evs), size):
        out += det.process_batch(evs[k:k + size])
    return out


def acting(mode: str, inner=None) -> ActingDetector:
    return ActingDetector(inner or Detector(), ActionPlanner(MitigationConfig(mode=mode)))


@pytest.mark.parametrize("mode", ["suggest", "auto"])
@pytest.mark.parametrize("name", ["gpu_thermal_30", "gpu_errors_40"])
def test_actions_and_annotations_do_not_depend_on_the_batches(name, mode):
    evs = events(name)
    whole = run(acting(mode), evs, len(evs))
    assert any((i.get("evidence") or {}).get("action") for i in whole if i["kind"] == "incident")
    assert any(e["kind"] == "action" for e in whole)
    for size in (1, 50, 777):
        pieces = run(acting(mode), evs, size)
        key = orjson.OPT_SORT_KEYS

        def canon(out: list[dict], key: int = key) -> list[bytes]:
            return sorted(orjson.dumps(e, option=key) for e in out)
        assert canon(pieces) == canon(whole), size


def test_held_steps_travel_in_the_snapshot():
    evs = events("gpu_thermal_30")
    whole = run(acting("auto"), evs, 64)
    det = acting("auto")
    cut = len(evs) // 2
    first = run(det, evs[:cut], 64)
    assert det.held, "a few steps are held at any time"
    cfg = MitigationConfig(mode="auto")
    state = orjson.loads(orjson.dumps(det.state_dict(), option=orjson.OPT_SERIALIZE_NUMPY))
    back = ActingDetector.restore(state, Detector.from_state, cfg)
    assert back.held == det.held
    rest = run(back, evs[cut:], 64)
    assert [orjson.dumps(e, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
            for e in first + rest] == \
        [orjson.dumps(e, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
         for e in whole]


def test_steps_are_held_only_a_few_steps():
    evs = [e for e in events("gpu_thermal_30") if e["kind"] == "step"][:16 * 12]
    det = acting("suggest")
    assert det.process_batch(evs) == []      # no incident: nothing released for one
    held = det.held["job0"]
    newest = max(e["step"] for e in evs)
    assert {e["step"] for e in held} == set(range(newest - det.hold_steps + 1, newest + 1))


def test_a_job_cut_into_shards_is_not_planned():
    """Each shard's partition sees only its ranks' steps: no shares for the whole job can
    be planned there, so neither the worker nor detect plans them."""
    evs = events("gpu_thermal_30")
    det = acting("auto", ShardedDetector(shard_ranks=8))
    out = run(det, evs, 256)
    assert any(i["kind"] == "incident" and i["severity"] != "info" for i in out)
    assert not any(e["kind"] == "action" for e in out) and det.held == {}
    one_shard = run(acting("auto", ShardedDetector(shard_ranks=16)), evs, 256)
    assert any(e["kind"] == "action" for e in one_shard)
