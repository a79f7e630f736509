"""Actions in ClickHouse (issue 32): the ``actions`` table of migration 11 and the
``mitigations`` preset, which measures each action's effect on the job's step time."""

from __future__ import annotations

import pytest
from storage_support import ch  # noqa: F401 - fixture

from failslow.storage.guard import one_statement, readonly_sql
from failslow.storage.migrations import MIGRATIONS
from failslow.storage.presets import PRESETS, bind
from failslow.storage.writer import Writer

pytestmark = pytest.mark.integration
T0 = 1_767_225_600.0


def _step(rank: int, step: int, duration: float) -> dict:
    return {"v": 1, "kind": "step", "ts": T0 + step + 0.1 * rank, "job_id": "j1", "rank": rank,
            "world_size": 2, "host": f"h{rank}", "step": step, "duration_s": duration,
            "samples": 8 if step < 20 else (11 if rank == 0 else 5)}


def _action(step: int, shares: list[float], rollback: bool = False) -> dict:
    return {"v": 1, "kind": "action", "ts": T0 + step, "action_id": f"j1:{step}",
            "job_id": "j1", "incident_id": "j1:slow_rank:1:5", "type": "rebalance_microbatches",
            "mode": "apply", "apply_at_step": step, "expires_ts": T0 + step + 60,
            "shares": shares, "reason": "rank 1 takes 38% less", "version": step, "rank": 1,
            "rollback": rollback}


def test_migration_11_leaves_10_free_and_applies():
    versions = [v for v, _, _ in MIGRATIONS]
    assert 11 in versions and versions == sorted(versions)


def test_mitigations_preset_measures_step_time_before_and_after(ch):  # noqa: F811
    # slow from step 10 (0.5 s), rebalanced at 20 (0.3 s), rolled back at 30 (0.2 s)
    steps = [_step(r, s, 0.2 if s < 10 or s >= 30 else (0.5 if s < 20 else 0.3))
             for s in range(40) for r in range(2)]
    acts = [_action(20, [0.6875, 0.3125]), _action(30, [0.5, 0.5], rollback=True)]
    result = Writer(ch).write(steps + acts)
    assert not result.rejected and result.tables["actions"] == 2
    _, rows = ch.query("SELECT samples FROM steps WHERE rank = 1 AND step = 25")
    assert rows == [(5,)]
    preset = PRESETS["mitigations"]
    cols, rows = ch.query(readonly_sql(one_statement(preset.sql)), bind(preset, {
        "since": str(T0), "until": str(T0 + 100), "steps": "5"}))
    got = [dict(zip(cols, r, strict=True)) for r in rows]
    assert [(g["apply_at_step"], g["rollback"]) for g in got] == [(20, False), (30, True)]
    assert (got[0]["step_s_before"], got[0]["step_s_after"]) == (0.5, 0.3)
    assert (got[1]["step_s_before"], got[1]["step_s_after"]) == (0.3, 0.2)
    assert got[0]["shares"] == [0.6875, 0.3125]


def test_the_report_page_says_what_was_done(ch):  # noqa: F811
    from failslow.models.acting import ActingDetector
    from failslow.models.actions import ActionPlanner, MitigationConfig
    from failslow.models.pipeline import Detector
    from failslow.simulator import SCENARIOS, simulate
    from failslow.storage.report import incident_page

    det = ActingDetector(Detector(), ActionPlanner(MitigationConfig(mode="auto")))
    writer, out = Writer(ch), []
    for batch in simulate(SCENARIOS["gpu_thermal_30"], seed=0).batches():
        out += det.process_batch(batch)
        writer.write(batch)
    writer.write(out)
    acts = [e for e in out if e["kind"] == "action"]
    assert acts and acts[0]["rank"] == 5
    page = incident_page(ch, acts[0]["incident_id"])
    # resolved: the rollback, and what the rebalance did
    assert "done: <b>apply rebalance_microbatches: rollback: incident resolved" in page
    assert "what it did: rebalanced: rank 5 takes" in page and "job step" in page
    _, rows = ch.query("SELECT count() FROM actions")
    assert rows == [(len(acts),)]
