"""comm summaries in ClickHouse (chdb): one row per (window, ops entry), the SQL an operator
writes ("whom does group X wait for", "blocked time per rank per step") is a plain GROUP BY,
the 1-minute rollup follows, a record is written or rejected whole, and the sink routes
comm and raw collectives of one topic and dead-letters malformed ops."""

from __future__ import annotations

import uuid

import pytest
from storage_support import ch  # noqa: F401 - fixture

from failslow.schema import encode
from failslow.storage.sink import Sink
from failslow.storage.writer import Writer, rows_of

pytestmark = pytest.mark.integration

T0 = 1_700_000_040.0


def _comm(rank, step, blocked, ts=None, ops=None):
    """rank's window closing ``step``: one dp0 allreduce entry blocking ``blocked`` s."""
    ts = T0 + step if ts is None else ts
    entry = {"group": "dp0", "group_size": 4, "op": "allreduce", "n": 2, "blocked_s": blocked,
             "min_s": 0.01, "max_s": blocked / 2 + 0.01, "bytes": 1 << 20,
             "first_seq": 2 * step, "last_seq": 2 * step + 1, "first_start_ts": ts - 0.9}
    return {"v": 1, "kind": "comm", "ts": ts, "job_id": "job0", "rank": rank,
            "host": f"h{rank // 2}", "window_start_ts": ts - 1.0,
            "ops": [entry] if ops is None else ops, "step": step, "step_end": True,
            "world_size": 4, "gpu": rank % 2}


def _job(slow_rank=2, steps=5):
    # everyone waits for the slow rank: it blocks least (it arrives last)
    return [_comm(r, s, 0.05 if r == slow_rank else 0.3 + 0.01 * r)
            for s in range(steps) for r in range(4)]


def test_operators_sql_whom_a_group_waits_for_and_blocked_time_per_rank_step(ch):  # noqa: F811
    result = Writer(ch).write(_job())
    assert result.rows == 20 and result.events == 20 and not result.rejected
    _, rows = ch.query("SELECT rank FROM comm WHERE job_id = 'job0' AND `group` = 'dp0' "
                       "GROUP BY rank ORDER BY sum(blocked_s) LIMIT 1")
    assert rows == [(2,)]
    _, rows = ch.query("SELECT step, rank, sum(blocked_s) FROM comm WHERE job_id = 'job0' "
                       "GROUP BY step, rank ORDER BY step, rank")
    assert len(rows) == 20
    assert [r[2] for r in rows[:4]] == pytest.approx([0.3, 0.31, 0.05, 0.33])


def test_every_entry_is_a_row_and_an_empty_window_one_row_with_n_0(ch):  # noqa: F811
    send = {"group": "pp0-1", "group_size": 2, "op": "send", "n": 1, "blocked_s": 0.0,
            "min_s": 0.002, "max_s": 0.002, "bytes": 4096, "peer": 1}
    two = _comm(0, 1, 0.2)
    two["ops"].append(send)
    empty = {**_comm(1, 1, 0.0, ops=[]), "step": None, "step_end": None}
    Writer(ch).write([two, empty])
    _, rows = ch.query("SELECT rank, `group`, op, peer, n, bytes, step, step_end FROM comm "
                       "ORDER BY rank, `group`")
    assert rows == [(0, "dp0", "allreduce", None, 2, 1 << 20, 1, True),
                    (0, "pp0-1", "send", 1, 1, 4096, 1, True),
                    (1, "", "", None, 0, 0, None, None)]
    # the window's own fields are on each of its rows
    _, rows = ch.query("SELECT DISTINCT toFloat64(window_start_ts), host FROM comm "
                       "WHERE rank = 0")
    assert rows == [(T0, "h0")]


def test_the_rollup_follows_and_skips_empty_windows(ch):  # noqa: F811
    w = Writer(ch)
    w.write(_job(steps=5))
    w.write([_comm(3, 7, 0.0, ops=[])])
    _, rows = ch.query("SELECT rank, sum(windows), sum(n_sum), sum(blocked_s_sum), "
                       "min(min_s_min), sum(bytes_sum) FROM comm_1m WHERE `group` = 'dp0' "
                       "GROUP BY rank ORDER BY rank")
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert rows[2][1:3] == (5, 10) and rows[2][3] == pytest.approx(0.25)
    assert rows[3][4] == 0.01 and rows[3][5] == 5 << 20
    _, rows = ch.query("SELECT count() FROM comm_1m WHERE `group` = ''")
    assert rows == [(0,)]


def test_a_record_that_does_not_fit_is_rejected_whole(ch):  # noqa: F811
    good = _comm(0, 1, 0.2)
    bad = _comm(1, 1, 0.2)
    # past the validator (which the sink runs first): its 2nd entry overflows Int64
    bad["ops"] = [bad["ops"][0], {**bad["ops"][0], "group": "dp1", "bytes": 2**70}]
    result = Writer(ch).write([good, bad])
    assert result.events == 1 and result.rows == 1
    assert len(result.rejected) == 1 and result.rejected[0][0] is bad
    assert result.rejected[0][1].startswith("comm:")
    assert ch.query("SELECT rank FROM comm") == (["rank"], [(0,)])


def test_buffered_comm_records_count_their_rows(ch):  # noqa: F811
    w = Writer(ch, max_rows=3)
    three = _comm(0, 1, 0.2)
    three["ops"] = [{**three["ops"][0], "group": g} for g in ("dp0", "dp1", "tp0")]
    assert w.add(three) and w.pending == 3 and w.full
    assert not w.add(_comm(1, 1, 0.2))
    result = w.flush()
    assert result.rows == 3 and result.events == 1
    assert len(rows_of(three)) == 3 and all(r["_event"] is three for r in rows_of(three))


def test_sink_routes_comm_and_collectives_and_dead_letters_bad_ops(broker, topics, ch):  # noqa: F811
    from confluent_kafka import Producer

    coll = {"v": 1, "kind": "collective", "ts": T0, "job_id": "job0", "rank": 0, "host": "h0",
            "group": "dp0", "group_size": 4, "op": "allreduce", "seq": 1, "start_ts": T0 - 0.1,
            "duration_s": 0.1, "bytes": 10}
    bad = _comm(3, 0, 0.2)
    bad["ops"][0]["min_s"] = 5.0  # above max_s
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    topic = topics.for_kind("comm")
    p.produce(topic, encode(_job(steps=2)[:4] + [bad]), key=b"job0")
    p.produce(topic, encode(_job(steps=2)[4:]), key=b"job0")
    p.produce(topic, encode(coll), key=b"job0/dp0")
    assert p.flush(15) == 0
    sink = Sink(ch, broker.bootstrap, topics, group_id=f"sink-{uuid.uuid4().hex[:8]}",
                max_delay_s=0.2)
    stats = sink.run(max_seconds=60, idle_exit_s=2.0)
    assert stats.events == 9 and stats.dead_letters == 1
    assert ch.query("SELECT count() FROM comm")[1] == [(8,)]
    assert ch.query("SELECT count() FROM collectives")[1] == [(1,)]
    _, rows = ch.query("SELECT error FROM dead_letters")
    assert rows == [("[4] comm.ops[0]: min_s 5.0 is above max_s 0.11",)]


def test_records_of_one_window_for_two_steps_both_survive_a_merge(ch):  # noqa: F811
    # ops of steps 7 and 8 that ended in one window: two records, same ts, group, op, peer
    a, b = _comm(0, 7, 0.2), _comm(0, 7, 0.3)
    b["step"] = 8
    w = Writer(ch)
    w.write([a])
    w.write([b])
    ch.execute(f"OPTIMIZE TABLE {ch.database}.comm FINAL")
    _, rows = ch.query("SELECT step, blocked_s FROM comm ORDER BY step")
    assert rows == [(7, 0.2), (8, 0.3)]
