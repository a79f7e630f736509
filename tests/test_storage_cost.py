"""Cost (CONTRACT.md incident.gpu_hours_lost): set by the Detector on every change,
stored, shown by incidents_current, rolled up per job and day, and in the messages."""

from __future__ import annotations

import pytest
from sim_support import CULPRIT_RANK, simulated_job
from storage_support import ch  # noqa: F401 - fixture

from failslow.alerting.base import Notification
from failslow.alerting.format import headline
from failslow.alerting.notifiers import SlackNotifier
from failslow.storage.migrations import migrate

pytestmark = pytest.mark.integration
DAY = 86_400.0
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def test_detector_sends_gpu_hours_lost_top_level_and_growing():
    job = simulated_job()
    priced = [i for i in job.incidents if i.get("rank") == CULPRIT_RANK]
    assert priced
    lost = [i["gpu_hours_lost"] for i in priced]
    assert all(x == i["evidence"]["gpu_hours_lost"] for x, i in zip(lost, priced, strict=True))
    assert lost == sorted(lost) and lost[-1] > lost[0] > 0
    world = job.truth["world_size"]
    assert lost[-1] == pytest.approx(world * priced[-1]["evidence"]["lost_s"] / 3600, rel=1e-3)


def test_incidents_current_shows_the_latest_cost():
    job = simulated_job()
    client = job.client()
    try:
        _, rows = client.query("SELECT incident_id, gpu_hours_lost FROM incidents_current")
    finally:
        client.close()
    last = {i["incident_id"]: i.get("gpu_hours_lost") for i in job.incidents}
    assert dict(rows) == last


def _incident(iid, ts, lost, job="j", host="h0"):
    return {"ts": [ts], "incident_id": [iid], "job_id": [job], "status": ["open"],
            "fault": ["slow_rank"], "severity": ["warning"], "onset_ts": [T0],
            "detected_ts": [T0], "slowdown_pct": [10.0], "host": [host],
            "evidence": ["{}"], "gpu_hours_lost": [lost]}


def _insert(client, *rows):
    for row in rows:
        client.insert("incidents", {k: v for k, v in row.items()})


def test_daily_rollup_bills_each_day_what_the_running_total_grew(ch):  # noqa: F811
    import datetime as dt

    def ts(day, hour):
        return dt.datetime.fromtimestamp(T0 + day * DAY + hour * 3600, dt.UTC)

    _insert(ch, _incident("a", ts(0, 1), 0.5), _incident("a", ts(0, 5), 1.0),
            _incident("a", ts(1, 2), 3.0), _incident("b", ts(1, 3), 0.25, host="h1"),
            _incident("c", ts(1, 3), None, job="k"), _incident("d", ts(1, 4), 2.0, job="k"))
    _, rows = ch.query("SELECT toString(day), job_id, round(gpu_hours_lost, 6), incidents "
                       "FROM gpu_hours_lost_daily ORDER BY day, job_id")
    assert rows == [("2026-01-01", "j", 1.0, 1), ("2026-01-02", "j", 2.25, 2),
                    ("2026-01-02", "k", 2.0, 2)]


def test_migrate_restores_the_cost_column_of_a_dropped_view(ch):  # noqa: F811
    ch.execute("DROP VIEW incidents_current")
    assert 7 in migrate(ch)
    _, rows = ch.query("DESCRIBE TABLE incidents_current")
    assert "gpu_hours_lost" in {r[0] for r in rows}


def test_messages_carry_the_cost():
    ev = {"incident_id": "j:slow_rank:r1:3", "job_id": "j", "status": "open",
          "fault": "slow_rank", "severity": "warning", "rank": 1, "slowdown_pct": 12.0,
          "onset_ts": T0, "detected_ts": T0 + 9, "ts": T0 + 9, "gpu_hours_lost": 1.234}
    assert headline(ev, "open").endswith("1.23 GPU-hours lost so far")
    body = SlackNotifier("http://127.0.0.1:9/hook").body(Notification("slack", "open", ev))
    assert "*Cost:* 1.23 GPU-hours lost so far" in body["text"]
    assert "GPU-hours" not in headline({**ev, "gpu_hours_lost": None}, "open")
