"""The provisioned Grafana dashboards (deploy/grafana/dashboards): every panel's,
annotation's and variable's SQL, with the macros and variables substituted the way the
ClickHouse datasource plugin and Grafana would, runs on chdb over a simulated job and
returns rows with the columns the panel uses; the job and device views point at the
injected culprits (rank 13 / h1 GPU 5 thermally throttled, host h0's NICs congested)."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from sim_support import (
    CONGESTED_HOST,
    CULPRIT_GPU,
    CULPRIT_HOST,
    CULPRIT_RANK,
    simulated_job,
)

from failslow.storage.guard import one_statement, readonly_sql

pytestmark = pytest.mark.integration
DASHBOARDS = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "dashboards"
DATASOURCE_UID = "failslow-clickhouse"
INTERVAL_S = 5  # what Grafana would pick for a ~2 min range on a wide panel


def _date(ts: float) -> str:
    return "toDate('" + dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d") + "')"


def expand(sql: str, start: float, end: float, variables: dict[str, str]) -> str:
    """``sql`` as the plugin sends it (pkg/macros of grafana-clickhouse-datasource), after
    Grafana interpolated the template variables (``:singlequote`` escapes quotes)."""
    frm, to = int(start), int(end)

    def var(m: re.Match) -> str:
        value = variables[m.group(1) or m.group(3)]
        if m.group(2) == "singlequote":
            return "'" + value.replace("'", "\\'") + "'"
        assert m.group(2) is None, f"format {m.group(2)} not handled here"
        return value

    macros = {
        "timeFilter": lambda c: f"{c} >= toDateTime({frm}) AND {c} <= toDateTime({to})",
        "timeFilter_ms": lambda c: (f"{c} >= fromUnixTimestamp64Milli({int(start * 1000)}) AND "
                                    f"{c} <= fromUnixTimestamp64Milli({int(end * 1000)})"),
        "dateFilter": lambda c: f"{c} >= {_date(start)} AND {c} <= {_date(end)}",
        "timeInterval": lambda c: (f"toStartOfInterval(toDateTime({c}), "
                                   f"INTERVAL {INTERVAL_S} second)"),
    }
    sql = re.sub(r"\$__(\w+)\(([^()]*)\)", lambda m: macros[m.group(1)](m.group(2).strip()), sql)
    plain = {"fromTime": f"toDateTime({frm})", "toTime": f"toDateTime({to})",
             "interval_s": str(INTERVAL_S)}
    sql = re.sub(r"\$__(\w+)", lambda m: plain[m.group(1)], sql)
    sql = re.sub(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)", var, sql)
    assert "$" not in sql, sql
    return sql


def _dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def _used_columns(panel: dict) -> set[str]:
    """The result columns a panel names: its field overrides (byName) and transformations."""
    names = {o["matcher"]["options"] for o in panel.get("fieldConfig", {}).get("overrides", [])
             if o["matcher"]["id"] == "byName"}
    for t in panel.get("transformations", []):
        opts = t.get("options", {})
        names |= {v for k, v in opts.items() if k.endswith("Field")}
    x = panel.get("options", {}).get("xField")
    return names | ({x} if x else set())


def _sql(sql: str, variables: dict[str, str], start: float | None, end: float | None) -> str:
    job = simulated_job()
    text = expand(sql, start or job.start_ts, end or job.end_ts + 1, variables)
    return re.sub(r"\bfailslow\.", f"{job.database}.", text)  # the dashboards' database


def _query(sql: str, variables: dict[str, str], start: float | None = None,
           end: float | None = None) -> list[dict]:
    client = simulated_job().client()
    try:
        cols, rows = client.query(readonly_sql(one_statement(_sql(sql, variables, start, end))))
    finally:
        client.close()
    return [dict(zip(cols, r, strict=True)) for r in rows]


def _types(sql: str, variables: dict[str, str]) -> dict[str, str]:
    """Result column types (chdb hands DateTime to Python as bare integers)."""
    client = simulated_job().client()
    try:
        _, rows = client.query(f"DESCRIBE ({_sql(sql, variables, None, None)})")
    finally:
        client.close()
    return {r[0]: r[1] for r in rows}


VARIABLES = [{"job": "job0", "host": CULPRIT_HOST}, {"job": "job0", "host": CONGESTED_HOST}]


def _targets():
    for name, board in _dashboards().items():
        for panel in board["panels"]:
            for target in panel["targets"]:
                yield pytest.param(panel, target, id=f"{name}:{panel['title']}")


def test_three_dashboards_on_the_provisioned_datasource():
    boards = _dashboards()
    assert set(boards) == {"overview", "job", "device"}
    assert len({b["uid"] for b in boards.values()}) == 3
    for board in boards.values():
        assert board["panels"]
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == DATASOURCE_UID
            for t in panel["targets"]:
                assert t["datasource"]["uid"] == DATASOURCE_UID and t["editorType"] == "sql"
    variables = {v["name"] for b in boards.values() for v in b["templating"]["list"]}
    assert variables == {"job", "host"}


@pytest.mark.parametrize(("panel", "target"), list(_targets()))
def test_every_panel_returns_rows_with_its_columns(panel, target):
    # Rows on the culprit's host; on the other host the query runs and, where it
    # answers (a healthy host has no throttle reasons), with the same columns.
    for i, variables in enumerate(VARIABLES):
        rows = _query(target["rawSql"], variables)
        assert rows or i, (panel["title"], variables)
        if not rows:
            continue
        used = _used_columns(panel)
        assert used and used <= set(rows[0]), (panel["title"], used, list(rows[0]))
        if target["queryType"] == "timeseries":
            assert _types(target["rawSql"], variables)["time"].startswith("DateTime")
            assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)
        if panel["type"] != "table":  # numbers where a chart or stat expects them
            assert any(isinstance(v, int | float) for v in rows[0].values())


def test_annotations_and_variables_answer():
    boards = _dashboards()
    annotations = [a for b in boards.values() for a in b["annotations"]["list"]
                   if a.get("datasource", {}).get("uid") == DATASOURCE_UID]
    assert annotations
    for a in annotations:
        rows = _query(a["target"]["rawSql"], VARIABLES[0])
        assert {"time", "timeEnd", "text", "tags"} <= set(rows[0])
        texts = " | ".join(r["text"] for r in rows)
        assert f"rank {CULPRIT_RANK}" in texts and "gpu_thermal" in texts
        assert all(r["timeEnd"] >= r["time"] for r in rows)
    values = {v["name"]: [next(iter(r.values())) for r in _query(v["query"], VARIABLES[0])]
              for b in boards.values() for v in b["templating"]["list"]}
    assert values["job"] == ["job0"] and CULPRIT_HOST in values["host"]


def _panel(board: str, title: str) -> dict:
    return next(p for p in _dashboards()[board]["panels"] if p["title"].startswith(title))


def _fault(kind: str) -> dict:
    return next(f for f in simulated_job().truth["faults"] if f["kind"] == kind)


def test_job_view_points_at_the_culprit():
    f = _fault("gpu_thermal")
    window = (f["onset_ts"] + 5, f["end_ts"] - 5)
    heat = _query(_panel("job", "Own work per rank")["targets"][0]["rawSql"], VARIABLES[0],
                  *window)
    by_rank: dict[str, list[float]] = {}
    for r in heat:
        by_rank.setdefault(r["rank"], []).append(r["own_vs_median"])
    hottest = max(by_rank, key=lambda k: sum(by_rank[k]) / len(by_rank[k]))
    assert int(hottest) == CULPRIT_RANK and len(by_rank) == simulated_job().truth["world_size"]
    assert sorted(by_rank, key=int) == sorted(by_rank)  # labels sort as numbers (y axis)
    (culprit,) = _query(_panel("job", "Culprit")["targets"][0]["rawSql"], VARIABLES[0])
    assert culprit["culprit"].startswith(f"slow_rank: rank {CULPRIT_RANK} on {CULPRIT_HOST}")
    slowest = _query(_panel("job", "Slowest ranks")["targets"][0]["rawSql"], VARIABLES[0],
                     *window)
    assert slowest[0]["rank"] == CULPRIT_RANK


def test_device_view_shows_the_throttle_and_the_storm():
    reasons = _query(_panel("device", "Throttle reasons")["targets"][0]["rawSql"],
                     {"host": CULPRIT_HOST})
    assert reasons[0]["device"] == f"gpu {CULPRIT_GPU}" and "sw_thermal" in reasons[0]["reasons"]
    sql = _panel("device", "PFC pause")["targets"][0]["rawSql"]
    storm = max(r["cnp_per_s"] for r in _query(sql, {"host": CONGESTED_HOST}))
    calm = max(r["cnp_per_s"] for r in _query(sql, {"host": CULPRIT_HOST}))
    assert storm > 10 * max(calm, 1.0)
    clocks = _query(_panel("device", "SM clock")["targets"][0]["rawSql"], {"host": CULPRIT_HOST})
    low = min(r["clock_mhz"] for r in clocks if r["device"] == f"gpu {CULPRIT_GPU}")
    assert low < 0.85 * max(r["clock_mhz"] for r in clocks)


def test_expand_quotes_variables_like_grafana():
    sql = expand("WHERE job_id = ${job:singlequote} AND $__timeFilter(ts)", 10.5, 20.9,
                 {"job": "a'b"})
    assert sql == "WHERE job_id = 'a\\'b' AND ts >= toDateTime(10) AND ts <= toDateTime(20)"
