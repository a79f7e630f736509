"""The worker plans actions (issue 32): the detector it builds by default is wrapped by the
planner (``FAILSLOW_MITIGATE``), a simulated thermal straggler gets one rebalance and one
rollback, actions go to the actions topic and share the incidents' de-duplication."""

from __future__ import annotations

import asyncio
import zlib

import orjson
import pytest

from failslow.models.acting import ActingDetector
from failslow.models.actions import MitigationConfigError
from failslow.schema import Topics, validate
from failslow.simulator import SCENARIOS, simulate
from failslow.streams.config import WorkerConfig, mitigate_from_env
from failslow.streams.metrics import Metrics
from failslow.streams.outputs import Outputs


def _stage_partition(cfg: WorkerConfig):
    from failslow.streams.job_stage import JobStage

    stage = JobStage.__new__(JobStage)
    stage.cfg = cfg
    return stage.new_partition(0)


def test_the_policy_comes_from_the_environment(tmp_path):
    assert mitigate_from_env({}).mode == "suggest"
    assert mitigate_from_env({"FAILSLOW_MITIGATE": "off"}) is None
    toml = tmp_path / "detect.toml"
    toml.write_text('[mitigate]\nmode = "off"\n[mitigate.jobs]\n"llm-*" = "auto"\n')
    cfg = mitigate_from_env({"FAILSLOW_MITIGATE": str(toml)})
    assert cfg.mode_for("llm-3") == "auto" and cfg.mode_for("x") == "off"
    with pytest.raises(MitigationConfigError, match="FAILSLOW_MITIGATE=/nope"):
        mitigate_from_env({"FAILSLOW_MITIGATE": "/nope"})


def test_the_default_worker_detector_acts_and_rolls_back_on_a_simulated_straggler():
    cfg = WorkerConfig(bootstrap="unused:1", topics=Topics("t."))
    cfg.mitigate = mitigate_from_env({"FAILSLOW_MITIGATE": "auto"})
    det = _stage_partition(cfg).detector
    assert isinstance(det, ActingDetector)
    out: list[dict] = []
    batch: list[dict] = []
    for ev in simulate(SCENARIOS["gpu_thermal_30"], seed=1).events():
        batch.append(ev)
        if len(batch) == 256:
            out += det.process_batch(batch)
            batch = []
    out += det.process_batch(batch)
    actions = [e for e in out if e["kind"] == "action"]
    pages = [e for e in out if e["kind"] == "incident" and e.get("rank") == 5
             and e["severity"] != "info"]
    # the rebalance, at most `refine` refinements of it (its plan made again on the steps
    # since: here the rank recovering), the rollback on the incident's resolve
    assert pages and 2 <= len(actions) <= 2 + cfg.mitigate.refine, actions
    go, *refined, back = actions
    assert all(a["reason"].startswith("refined: rank 5") and a["incident_id"] == go["incident_id"]
               for a in refined)
    for a in actions:
        validate(a)
    assert go["mode"] == "apply" and go["rank"] == 5 and go["incident_id"] == pages[0]["incident_id"]
    assert go["shares"][5] == min(go["shares"]) < 1 / 16
    assert go["ts"] >= pages[0]["ts"]
    assert back["rollback"] and back["shares"] == [round(1 / 16, 4)] * 16
    assert not any(e["kind"] == "action" for e in out if e.get("rank") not in (5, None))
    # the incident says what was done: the action on the page that caused it (the planner
    # reads steps only up to each page's ts, so not always the first page), its effect after
    acted = [p for p in pages if (p["evidence"].get("action") or "").startswith(
        "apply rebalance_microbatches: rank 5")]
    assert len(acted) == 1 and acted[0] == next(p for p in pages if p["ts"] >= go["ts"])
    later = [e["evidence"].get("action") for e in out if e["kind"] == "incident"
             and e["incident_id"] == go["incident_id"] and e["ts"] > go["ts"]]
    assert any(t and t.startswith("rebalanced: rank 5 takes") and "job step" in t
               for t in later), later


def test_off_builds_the_plain_detector_and_suggest_the_acting_one():
    cfg = WorkerConfig(bootstrap="unused:1", topics=Topics("t."), mitigate=None)
    assert not isinstance(_stage_partition(cfg).detector, ActingDetector)
    cfg.mitigate = mitigate_from_env({})
    assert isinstance(_stage_partition(cfg).detector, ActingDetector)


class _Topic:
    def __init__(self):
        self.sent = []

    async def send(self, **kwargs):
        self.sent.append(kwargs)


def test_actions_go_to_their_topic_and_are_deduplicated_like_incidents():
    from failslow.streams.partition import JobPartition

    topics = {n: _Topic() for n in ("job", "incidents", "dead", "hostmap", "actions")}
    out = Outputs(Metrics(), partitions=1, **topics)
    action = {"v": 1, "kind": "action", "ts": 5.0, "action_id": "j:1", "job_id": "j",
              "incident_id": "j:slow_rank:1:0", "type": "rebalance_microbatches",
              "mode": "dry_run", "apply_at_step": 3, "expires_ts": 65.0, "shares": [0.5, 0.5],
              "reason": "r"}
    incident = {"v": 1, "kind": "incident", "ts": 5.0, "incident_id": "j:slow_rank:1:0",
                "job_id": "j", "status": "open", "fault": "slow_rank", "severity": "warning",
                "onset_ts": 1.0, "detected_ts": 5.0, "slowdown_pct": 20.0}
    part = JobPartition(0)
    assert part.remember(action) and not part.remember(dict(action))
    assert part.remember(incident) and part.open_ids == {"j:slow_rank:1:0"}
    asyncio.run(out.incidents(0, [incident, action]))
    assert [s["key"] for s in topics["actions"].sent] == [b"j"]
    assert len(topics["incidents"].sent) == 1


def test_an_acting_partition_snapshots_as_json_and_restores():
    from failslow.streams.snapshots import SnapshotStore

    cfg = WorkerConfig(bootstrap="unused:1", topics=Topics("t."),
                       mitigate=mitigate_from_env({"FAILSLOW_MITIGATE": "auto"}))
    part = _stage_partition(cfg)
    part.detector.planner.observe({"v": 1, "kind": "step", "ts": 1.0, "job_id": "j", "rank": 0,
                                   "world_size": 2, "host": "h", "step": 0, "duration_s": 1.0})
    snap = orjson.loads(zlib.decompress(SnapshotStore.encode(part.snapshot())))
    again = _stage_partition(cfg)
    again.restore(snap)
    assert isinstance(again.detector, ActingDetector)
    assert again.detector.planner.per_sample("j") == {0: 1.0}
