"""The ClickHouse schema on chdb: applies, is idempotent, and holds every CONTRACT field."""

from __future__ import annotations

import pytest
from storage_support import ch  # noqa: F401 - fixture

from failslow.schema.events import NESTED, SPECS
from failslow.storage.errors import QueryError, StorageError
from failslow.storage.migrations import MIGRATIONS, migrate
from failslow.storage.url import parse
from failslow.storage.writer import KIND_TABLE


def _flat(spec):
    """A kind's fields as its table's columns: the fields of list entries (comm.ops) are
    columns of their own (one row per entry), required as in their entry."""
    required, optional = ({n: t for n, t in part.items() if t not in NESTED} for part in spec)
    for ftype in spec[0].values():
        if ftype in NESTED:
            required.update(NESTED[ftype][0])
            optional.update(NESTED[ftype][1])
    return required, optional


def _columns(client, table):
    _, rows = client.query(f"DESCRIBE TABLE {table}")
    return {r[0]: r[1] for r in rows}


def test_migrate_is_idempotent_and_recorded(ch):  # noqa: F811
    assert migrate(ch) == []
    _, rows = ch.query("SELECT version FROM schema_migrations FINAL ORDER BY version")
    assert [r[0] for r in rows] == [m[0] for m in MIGRATIONS]


@pytest.mark.parametrize("kind", list(KIND_TABLE))
def test_every_contract_field_is_a_column(ch, kind):  # noqa: F811
    cols = _columns(ch, KIND_TABLE[kind])
    required, optional = _flat(SPECS[kind])
    for name in required:
        assert name in cols, f"{kind}.{name} missing"
        assert "Nullable" not in cols[name] or name == "xid"
    for name, ftype in optional.items():
        assert name in cols, f"{kind}.{name} missing"
        # ClickHouse arrays cannot be Nullable: an absent xid list is stored as [].
        assert "Nullable" in cols[name] or ftype == "ints" or name == "evidence"
    for name in cols:
        if name == "ts" or name.endswith("_ts") and name != "ingest_ts":
            assert "DateTime64(3, 'UTC')" in cols[name]


def test_incidents_current_has_the_contract_columns(ch):  # noqa: F811
    cols = _columns(ch, "incidents_current")
    for name in ("incident_id", "job_id", "status", "fault", "severity", "rank", "host", "gpu",
                 "peer_rank", "peer_host", "root_cause", "mitigation", "slowdown_pct"):
        assert name in cols
    for name in ("onset_ts", "detected_ts", "resolved_ts"):
        assert "DateTime64(3, 'UTC')" in cols[name]


def test_ttl_days_changes_existing_tables(ch):  # noqa: F811
    migrate(ch, ttl_days=7)
    _, rows = ch.query("SELECT name, engine_full FROM system.tables WHERE database = "
                       "currentDatabase() AND name IN ('steps', 'gpu', 'dead_letters')")
    assert len(rows) == 3
    assert all("toIntervalDay(7)" in engine for _, engine in rows)
    with pytest.raises(StorageError, match="at least 1 day"):
        migrate(ch, ttl_days=0)


def test_bad_sql_is_one_line_query_error(ch):  # noqa: F811
    with pytest.raises(QueryError) as info:
        ch.query("SELEC nothing FROM steps")
    assert "\n" not in str(info.value) and "UNKNOWN_IDENTIFIER" in str(info.value)


def test_url_parsing():
    u = parse("clickhouse://bob:s3cret@db.example:9440/metrics")
    assert (u.host, u.port, u.user, u.database) == ("db.example", 9440, "bob", "metrics")
    assert "s3cret" not in u.redacted() and "s3cret" not in repr(u)
    assert parse("chdb:///tmp/x?database=abc").database == "abc"
    assert parse("chdb:///tmp/x").database == "failslow"
    for bad in ("mysql://x", "chdb://", "chdb:///tmp/x?database=a;drop"):
        with pytest.raises(StorageError):
            parse(bad)


def test_migrate_recreates_a_dropped_table(ch):  # noqa: F811
    # `migrate` checks the tables exist, not only the versions recorded.
    ch.execute(f"DROP TABLE {ch.database}.host")
    ch.execute(f"DROP VIEW {ch.database}.incidents_current")
    # 7 redefines incidents_current (with gpu_hours_lost): it runs again after 2.
    assert migrate(ch) == [1, 2, 7]
    assert "cpu_util_pct" in _columns(ch, "host")
    assert "slowdown_pct" in _columns(ch, "incidents_current")
    assert "gpu_hours_lost" in _columns(ch, "incidents_current")
    assert migrate(ch) == []


_RANGE = {"i32": ("Int32",), "int": ("Int64",), "time": ("DateTime64(3, 'UTC')",)}


@pytest.mark.parametrize("kind", list(KIND_TABLE))
def test_the_validator_s_ranges_are_the_columns(ch, kind):  # noqa: F811
    # One validator for every consumer: what the schema accepts fits its column, so the
    # worker and the sink never disagree about an event.
    cols = _columns(ch, KIND_TABLE[kind])
    required, optional = _flat(SPECS[kind])
    for name, ftype in {**required, **optional}.items():
        if isinstance(ftype, str) and ftype in _RANGE:
            assert any(t in cols[name] for t in _RANGE[ftype]), (name, ftype, cols[name])
        elif ftype == "num":
            assert "Float64" in cols[name], (name, cols[name])


def test_a_column_added_by_a_migration_comes_back_with_its_table(ch):  # noqa: F811
    # incidents recreated by migration 2 lacks the column migration 6 added: 6 runs again.
    ch.execute(f"DROP VIEW {ch.database}.incidents_current")
    ch.execute(f"DROP TABLE {ch.database}.incidents")
    assert migrate(ch) == [2, 6, 7]
    assert "gpu_hours_lost" in _columns(ch, "incidents")
    assert "gpu_hours_lost" in _columns(ch, "incidents_current")
    assert migrate(ch) == []


def _sums(client):
    _, rows = client.query("SELECT (SELECT sum(samples) FROM gpu_clocks_1m), "
                           "(SELECT sum(samples) FROM nic_1m)")
    return rows[0]


def test_the_preset_rollups_are_backfilled_once(ch):  # noqa: F811
    # A database at version 8 that holds samples: migration 9 fills gpu_clocks_1m and
    # nic_1m from them; running it again (a view dropped) adds nothing twice, and samples
    # written after it reach the rollups through the views.
    import datetime as dt

    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ts = [dt.datetime.fromtimestamp(1_767_225_600 + t, dt.UTC) for t in (0, 30, 70)]
    ch.insert("gpu", {"ts": ts, "host": ["h0"] * 3, "gpu": [0] * 3, "uuid": ["u"] * 3,
                      "sm_clock_mhz": [1980.0, 1500.0, None],
                      "ingest_ts": [old] * 3})
    ch.insert("nic", {"ts": ts, "host": ["h0"] * 3, "nic": ["mlx5_0"] * 3, "port": [1] * 3,
                      "tx_bytes_total": [0, 1, 2], "rx_bytes_total": [0, 1, 2],
                      "ingest_ts": [old] * 3})
    for name in ("gpu_clocks_1m", "nic_1m"):
        ch.execute(f"DROP TABLE {ch.database}.{name}_mv")
        ch.execute(f"DROP TABLE {ch.database}.{name}")
    assert migrate(ch) == [9]
    assert _sums(ch) == (2, 3)  # the sample with no SM clock is not a clock sample
    ch.execute(f"DROP TABLE {ch.database}.nic_1m_mv")
    assert migrate(ch) == [9]
    assert _sums(ch) == (2, 3)
    ch.insert("nic", {"ts": ts[:1], "host": ["h1"], "nic": ["mlx5_0"], "port": [1],
                      "tx_bytes_total": [0], "rx_bytes_total": [0]})
    assert _sums(ch) == (2, 4)
    assert "own_s" in _columns(ch, "steps")
