"""`failslow query --preset`: every preset on a simulated job in chdb (rank 13 on host h1
GPU 5 thermally throttled, host h0's NICs congested) answers with the culprit first;
parameters are checked and bound, never pasted into the SQL."""

from __future__ import annotations

import orjson
import pytest
from sim_support import CONGESTED_HOST, CULPRIT_GPU, CULPRIT_HOST, CULPRIT_RANK, simulated_job
from storage_support import ch, chdb_url  # noqa: F401 - fixture

from failslow.cli import main
from failslow.storage.errors import QueryError
from failslow.storage.guard import one_statement, readonly_sql
from failslow.storage.presets import PRESETS, bind

pytestmark = pytest.mark.integration


def _run(name: str, **given: object) -> list[dict]:
    job = simulated_job()
    window = {"since": str(job.start_ts), "until": str(job.end_ts + 1)}
    preset = PRESETS[name]
    names = {p.name for p in preset.params}
    texts = {k: str(v) for k, v in {**window, **given}.items() if k in names}
    client = job.client()
    try:  # exactly what the command runs: one statement, under readonly=1
        cols, rows = client.query(readonly_sql(one_statement(preset.sql)), bind(preset, texts))
    finally:
        client.close()
    return [dict(zip(cols, r, strict=True)) for r in rows]


def _fault(kind: str) -> dict:
    return next(f for f in simulated_job().truth["faults"] if f["kind"] == kind)


def test_slowest_ranks_puts_the_culprit_first_over_its_fault():
    f = _fault("gpu_thermal")
    rows = _run("slowest_ranks", job="job0", since=f["onset_ts"], until=f["end_ts"], limit=3)
    assert len(rows) == 3
    assert rows[0]["rank"] == CULPRIT_RANK and rows[0]["host"] == CULPRIT_HOST
    assert rows[0]["vs_job"] > 1.15 > rows[1]["vs_job"]
    before = _run("slowest_ranks", job="job0", until=f["onset_ts"] - 5, limit=32)
    assert len(before) == 32 and before[0]["vs_job"] < 1.1  # healthy before the onset
    assert _run("slowest_ranks", job="no-such-job") == []


def test_rank_vs_peers_shows_the_slowdown_step_by_step():
    f = _fault("gpu_thermal")
    rows = _run("rank_vs_peers", job="job0", rank=CULPRIT_RANK)
    assert len(rows) == 110
    assert all(r["peers"] == 15 for r in rows)  # its pipeline stage: 16 of the 32 ranks
    during = [r["ratio"] for r in rows
              if f["onset_ts"] + 5 < r["step_end_ts"].timestamp() < f["end_ts"] - 5]
    after = [r["ratio"] for r in rows if r["step_end_ts"].timestamp() > f["end_ts"] + 15]
    assert during and min(during) > 1.15
    assert after and max(after) < 1.1
    healthy = _run("rank_vs_peers", job="job0", rank=2)
    assert max(r["ratio"] for r in healthy[10:]) < 1.15


def test_incidents_by_cause_and_gpu_hours_per_job_and_host():
    by_cause = {r["cause"]: r for r in _run("incidents_by_cause")}
    assert set(by_cause) == {"gpu_thermal", "nic_congestion"}
    expected = {i["incident_id"]: i.get("gpu_hours_lost") or 0.0
                for i in simulated_job().incidents}
    thermal = by_cause["gpu_thermal"]
    assert thermal["incidents"] == 1 and thermal["faults"] == ["slow_rank"]
    assert thermal["lost_gpu_hours"] == pytest.approx(expected[thermal["worst_incident"]],
                                                      abs=1e-3)
    (job,) = _run("gpu_hours_by_job")
    assert job["job_id"] == "job0" and job["incidents"] == len(expected)
    assert job["lost_gpu_hours"] > 0
    assert job["lost_gpu_hours"] == pytest.approx(sum(expected.values()), abs=1e-3)
    hosts = _run("gpu_hours_by_host")
    assert hosts[0]["host"] == CULPRIT_HOST and hosts[0]["causes"] == ["gpu_thermal"]
    assert {h["host"] for h in hosts} == {CULPRIT_HOST, CONGESTED_HOST}
    assert _run("incidents_by_cause", since="2020-01-01", until="2020-01-02") == []


def test_gpu_clock_drops_finds_the_throttled_gpu_with_its_reason():
    rows = _run("gpu_clock_drops")
    assert [(r["host"], r["gpu"]) for r in rows] == [(CULPRIT_HOST, CULPRIT_GPU)]
    (gpu,) = rows
    assert gpu["rank"] == CULPRIT_RANK and gpu["job_id"] == "job0"
    assert "sw_thermal" in gpu["reasons"] and gpu["drop_pct"] > 10
    # A laxer threshold lets in more GPUs but the throttled one stays first.
    lax = _run("gpu_clock_drops", min_drop_pct=5, min_samples=1)
    assert (lax[0]["host"], lax[0]["gpu"]) == (CULPRIT_HOST, CULPRIT_GPU) and len(lax) > 1


def test_nic_storms_lists_only_the_congested_host():
    rows = _run("nic_storms")
    assert rows and {r["host"] for r in rows} == {CONGESTED_HOST}
    assert all(r["pause_per_s"] > 1000 and r["cnp_per_s"] > 1000 for r in rows)
    every = _run("nic_storms", min_per_s=0, limit=1000)
    others = [r for r in every if r["host"] != CONGESTED_HOST]
    assert others and max(r["cnp_per_s"] for r in others) < min(r["cnp_per_s"] for r in rows)


@pytest.mark.parametrize(("given", "why"), [
    ({"job": "j", "limit": "5; DROP TABLE steps"}, "--param limit: want a whole number >= 0"),
    ({"job": "j", "limit": "-1"}, r"--param limit: want a whole number in 0\.\.4294967295"),
    ({"job": "j", "since": "yesterday"}, "--param since: want ISO 8601"),
    ({"job": "j", "until": "nan"}, "--param until: epoch seconds out of range"),
    ({"job": "j", "rank": "3"}, "has no parameter rank"),
    ({}, "needs --param job=..."),
])
def test_parameters_are_checked(given, why):
    with pytest.raises(QueryError, match=why):
        bind(PRESETS["slowest_ranks"], given)


def test_a_string_parameter_is_bound_not_pasted():
    # A quote in a job id is data: it matches no job instead of changing the SQL.
    assert _run("slowest_ranks", job="job0' OR '1'='1") == []


def test_every_preset_is_one_read_only_statement():
    for preset in PRESETS.values():
        assert one_statement(preset.sql) == preset.sql.strip()
        assert preset.summary and "\n" not in preset.summary


def test_cli_list_and_run(capsys):
    assert main(["query", "--list-presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(PRESETS)
    job = simulated_job()
    url = chdb_url(job.database)
    assert main(["query", "--clickhouse", url, "--preset", "slowest_ranks", "--format",
                 "json", "--param", "job=job0", "--param", "limit=2", "--param",
                 f"since={job.start_ts}", "--param", f"until={job.end_ts + 1}"]) == 0
    rows = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["rank"] for r in rows][:1] == [CULPRIT_RANK] and len(rows) == 2
    assert main(["query", "--clickhouse", url, "--preset", "nope"]) == 2
    assert "no preset 'nope'" in capsys.readouterr().err
    assert main(["query", "--clickhouse", url, "--preset", "slowest_ranks", "SELECT 1"]) == 2
    assert main(["query", "--clickhouse", url]) == 2


def test_nic_storms_counts_a_reset_counter_from_its_reset(ch):  # noqa: F811
    import datetime as dt

    def row(t, pause):
        return {"ts": [dt.datetime.fromtimestamp(1_767_225_600 + t, dt.UTC)], "host": ["hx"],
                "nic": ["mlx5_0"], "port": [1], "tx_bytes_total": [0], "rx_bytes_total": [0],
                "tx_pause_total": [pause]}

    for t, pause in ((0, 50_000), (10, 90_000), (20, 30_000)):  # reset between 10 and 20 s
        ch.insert("nic", row(t, pause))
    preset = PRESETS["nic_storms"]
    cols, rows = ch.query(readonly_sql(preset.sql), bind(preset, {
        "since": "1767225600", "until": "1767225700", "min_per_s": "0"}))
    (storm,) = [dict(zip(cols, r, strict=True)) for r in rows]
    assert storm["pause_per_s"] == 30_000 / 20  # since the reset; never negative


def _raw(sql: str, params: dict) -> list[tuple]:
    client = simulated_job().client()
    try:
        return client.query(sql, params)[1]
    finally:
        client.close()


@pytest.mark.parametrize(("start", "end", "width"), [
    (0.0, 0.0, None), (0.4, 0.0, None), (0.0, 1.0, None), (20.5, 25.0, None), (20.5, 0, 25.0)])
def test_rollup_minutes_and_raw_edges_count_every_sample_once(start, end, width):
    # The GPU and NIC presets read gpu_clocks_1m / nic_1m for the range's whole minutes and
    # the raw rows for its partial edges: a range that is minute-aligned, starts or ends
    # mid-minute, or lies inside one minute (width) counts exactly the raw samples in it.
    job = simulated_job()
    since = (job.start_ts // 60) * 60 + start
    until = since + width if width else -(-(job.end_ts + 1) // 60) * 60 - end
    window = {"since": str(since), "until": str(until)}
    params = {"since": since, "until": until}
    rng = ("ts >= toDateTime64({since:Float64}, 3, 'UTC') "
           "AND ts < toDateTime64({until:Float64}, 3, 'UTC')")
    raw_gpu = dict(((h, g), n) for h, g, n in _raw(
        f"SELECT host, gpu, count() FROM gpu WHERE {rng} AND host = '{CULPRIT_HOST}' "
        f"AND gpu = {CULPRIT_GPU} AND sm_clock_mhz IS NOT NULL GROUP BY host, gpu", params))
    gpus = _run("gpu_clock_drops", **window, min_samples=0, min_drop_pct=0, limit=1000)
    got = {(r["host"], r["gpu"]): r["samples"] for r in gpus
           if (r["host"], r["gpu"]) == (CULPRIT_HOST, CULPRIT_GPU)}
    assert got == raw_gpu and raw_gpu
    raw_nic = {(h, n, p): (c, s) for h, n, p, c, s in _raw(
        f"SELECT host, nic, port, count(), dateDiff('millisecond', min(ts), max(ts)) / 1000. "
        f"FROM nic WHERE {rng} AND host = '{CONGESTED_HOST}' GROUP BY host, nic, port "
        "HAVING count() >= 2", params)}
    nics = {(r["host"], r["nic"], r["port"]): (r["samples"], r["seconds"])
            for r in _run("nic_storms", **window, min_per_s=0, limit=1000)
            if r["host"] == CONGESTED_HOST}
    assert nics == raw_nic and raw_nic


def test_the_rollups_hold_every_raw_sample():
    (gpu,) = _raw("SELECT (SELECT sum(samples) FROM gpu_clocks_1m), "
                  "(SELECT count() FROM gpu WHERE sm_clock_mhz IS NOT NULL)", {})
    (nic,) = _raw("SELECT (SELECT sum(samples) FROM nic_1m), (SELECT count() FROM nic)", {})
    assert gpu[0] == gpu[1] > 0 and nic[0] == nic[1] > 0
