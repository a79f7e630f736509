"""The columnar writer on chdb: every kind round-trips typed, incidents_current is the
latest state right after insert, back-pressure, and bad rows never sink a batch."""

from __future__ import annotations

import datetime as dt

import pytest
from storage_support import ch, full_event, minimal_event  # noqa: F401 - fixture

from failslow.schema.events import NESTED, SPECS
from failslow.storage.migrations import migrate
from failslow.storage.writer import KIND_TABLE, Writer, rows_of

pytestmark = pytest.mark.integration


def _seconds(value):
    return value.timestamp() if isinstance(value, dt.datetime) else value


def _read(client, table):
    cols, rows = client.query(f"SELECT * FROM {table} ORDER BY ts")
    return [dict(zip(cols, r, strict=True)) for r in rows]


@pytest.mark.parametrize("kind", list(KIND_TABLE))
def test_every_kind_round_trips_typed(ch, kind):  # noqa: F811
    full, bare = full_event(kind, 0), minimal_event(kind, 1)
    result = Writer(ch).write([full, bare])
    assert result.rows == 2 and not result.rejected
    got_full, got_bare = _read(ch, KIND_TABLE[kind])
    # a comm record is one row per ops entry: its entry's fields are columns too
    full = {k: v for k, v in rows_of(full)[0].items() if k != "_event"}
    required, optional = SPECS[kind]
    required = {n: t for n, t in required.items() if t not in NESTED}
    for ftype in SPECS[kind][0].values():
        if ftype in NESTED:
            required, optional = {**required, **NESTED[ftype][0]}, {**optional,
                                                                      **NESTED[ftype][1]}
    for name in [*required, *optional]:
        want, got = full[name], got_full[name]
        if name == "ts" or name.endswith("_ts"):
            assert isinstance(got, dt.datetime) and got.tzinfo is not None
            assert _seconds(got) == pytest.approx(want, abs=5e-4), name
        elif name == "evidence":
            assert got == '{"z":2.5,"i":0}'
        else:
            assert got == want and type(got) is type(want), name
    for name in optional:
        assert got_bare[name] in (None, [], ""), name  # "": no evidence (JSON text column)


def test_incidents_current_is_latest_state_and_ignores_duplicates(ch):  # noqa: F811
    base = minimal_event("incident")
    opened = {**base, "incident_id": "job0:slow_rank:5:20", "ts": 100.0, "status": "open",
              "severity": "warning", "slowdown_pct": 10.0, "rank": 5, "root_cause": "gpu_thermal"}
    updated = {**opened, "ts": 110.0, "severity": "critical", "slowdown_pct": 30.0,
               "root_cause": None}
    resolved = {**updated, "ts": 120.0, "status": "resolved", "resolved_ts": 120.0}
    other = {**opened, "incident_id": "job0:slow_link:1:7", "ts": 105.0}
    w = Writer(ch)
    w.write([opened, other])
    _, rows = ch.query("SELECT incident_id, status FROM incidents_current ORDER BY incident_id")
    assert rows == [("job0:slow_link:1:7", "open"), ("job0:slow_rank:5:20", "open")]
    # Out of order and delivered twice (at-least-once): the view still shows the latest.
    w.write([resolved, updated, resolved, opened])
    cols, rows = ch.query("SELECT * FROM incidents_current WHERE incident_id = {i:String}",
                          {"i": "job0:slow_rank:5:20"})
    assert len(rows) == 1
    cur = dict(zip(cols, rows[0], strict=True))
    assert cur["status"] == "resolved" and cur["severity"] == "critical"
    assert cur["slowdown_pct"] == 30.0 and cur["rank"] == 5
    assert cur["root_cause"] is None  # cleared in the latest change, not resurrected
    assert _seconds(cur["resolved_ts"]) == 120.0 and cur["changes"] == 3
    _, n = ch.query("SELECT count() FROM incidents_current")
    assert n == [(2,)]


def test_add_reports_full_instead_of_growing(ch):  # noqa: F811
    w = Writer(ch, max_rows=5)
    added = [w.add(minimal_event("host", i)) for i in range(7)]
    assert added == [True] * 5 + [False] * 2
    assert w.pending == 5 and w.full
    assert w.flush().rows == 5 and w.pending == 0
    assert w.add(minimal_event("host", 9))
    assert w.flush().tables == {"host": 1}
    assert ch.query("SELECT count() FROM host") == (["count()"], [(6,)])


def test_rows_that_do_not_fit_are_rejected_alone(ch):  # noqa: F811
    good = [minimal_event("step", i) for i in range(3)]
    too_big = {**minimal_event("step", 9), "rank": 2**40}
    bad_clock = {**minimal_event("step", 8), "ts": 1e12}
    result = Writer(ch).write([good[0], too_big, good[1], bad_clock, good[2]])
    assert result.rows == 3
    assert [e for e, _ in result.rejected] == [too_big, bad_clock]
    assert "steps:" in result.rejected[0][1] and "timestamp" in result.rejected[1][1]
    assert ch.query("SELECT count() FROM steps") == (["count()"], [(3,)])


def test_client_insert_accepts_dicts_and_row_lists(ch):  # noqa: F811
    ch.insert("dead_letters", {"ts": [dt.datetime(2025, 1, 1, tzinfo=dt.UTC)], "topic": ["t"],
                               "error": ["e1"], "raw": ["r"], "reporter": ["test"]})
    ch.insert("dead_letters", [{"ts": dt.datetime(2025, 1, 2, tzinfo=dt.UTC), "topic": "t",
                                "error": "e2", "raw": "r", "reporter": "test", "offset": 7}])
    _, rows = ch.query("SELECT error, `offset` FROM dead_letters ORDER BY ts")
    assert rows == [("e1", None), ("e2", 7)]


def test_steps_rollup_follows_inserts(ch):  # noqa: F811
    steps = [{**minimal_event("step", 0), "rank": r, "step": s, "ts": 1_700_000_040.0 + s,
              "duration_s": 1.0 + r} for r in range(2) for s in range(10)]
    Writer(ch).write(steps)
    _, rows = ch.query("SELECT rank, sum(steps), max(duration_s_max) FROM steps_1m "
                       "GROUP BY rank ORDER BY rank")
    assert rows == [(0, 10, 1.0), (1, 10, 2.0)]


def test_a_dropped_table_is_recreated_and_the_others_still_written(ch):  # noqa: F811
    w = Writer(ch, repair=lambda: migrate(ch))
    ch.execute(f"DROP TABLE {ch.database}.gpu")
    for i in range(3):
        w.add({"v": 1, "kind": "gpu", "ts": 1.7e9 + i, "host": "h0", "gpu": 0, "uuid": "u"})
        w.add({"v": 1, "kind": "host", "ts": 1.7e9 + i, "host": "h0"})
    w.flush()
    _, rows = ch.query("SELECT (SELECT count() FROM gpu), (SELECT count() FROM host)")
    assert rows == [(3, 3)]
