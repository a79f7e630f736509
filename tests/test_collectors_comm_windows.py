"""failslow.collectors.comm_windows: blocked time shared among concurrent ops, never double counted;
``ops`` entries that equal the raw ``collective`` events they summarize.

Checked against a brute-force computation on a fine grid for random intervals."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.collectors.comm_windows import (
    INF,
    clip_to_issues,
    comm_record,
    comm_records,
    split_blocked,
    summarize,
)
from failslow.collectors.intervals import clip_to_last_issue, union_length
from failslow.schema import validate
from failslow.schema.events import OPS_MAX

GRID = 60  # intervals on integer ticks, so the grid computation is exact

ticks = st.integers(0, GRID)
spans = st.lists(st.tuples(ticks, ticks).map(sorted).map(tuple), max_size=8)
ops = st.lists(st.tuples(ticks, ticks).map(sorted).map(tuple), min_size=1, max_size=8)


def _brute_shares(mine, others, blocked):
    """Tick by tick: a blocked tick goes in equal parts to the ops open during it."""
    everyone = list(mine) + list(others)
    shares = [Fraction(0)] * len(mine)
    for t in range(GRID + 1):
        if not any(a <= t < b for a, b in blocked):
            continue
        n_open = sum(a <= t < b for a, b in everyone)
        for i, (a, b) in enumerate(mine):
            if a <= t < b:
                shares[i] += Fraction(1, n_open)
    return shares


@settings(max_examples=300, deadline=None)
@given(ops, spans, spans)
def test_each_op_gets_its_equal_part_of_every_blocked_instant(mine, others, blocked):
    got = split_blocked(mine, others, blocked)
    want = _brute_shares(mine, others, blocked)
    assert all(abs(g - float(w)) < 1e-9 for g, w in zip(got, want, strict=True))


@settings(max_examples=300, deadline=None)
@given(ops, spans, st.data())
def test_windows_never_double_count(all_ops, blocked, data):
    """However the ops are cut into windows (each summarized with the others open beside
    it), the shares add up to the blocked time covered by ops, never more."""
    window = data.draw(st.lists(st.integers(0, 3), min_size=len(all_ops),
                                max_size=len(all_ops)))
    total = 0.0
    for w in set(window):
        mine = [o for o, k in zip(all_ops, window, strict=True) if k == w]
        others = [o for o, k in zip(all_ops, window, strict=True) if k != w]
        total += sum(split_blocked(mine, others, blocked))
    covered = sum(1 for t in range(GRID + 1) if any(a <= t < b for a, b in blocked)
                  and any(a <= t < b for a, b in all_ops))
    assert abs(total - covered) < 1e-9
    assert total <= union_length(blocked) + 1e-9


def test_concurrent_ops_share_the_time_they_block():
    # two all-reduces in flight together while the rank waits 10 ms: 5 ms each, not 10
    assert split_blocked([(0.0, 0.01), (0.0, 0.01)], [], [(0.0, 0.01)]) == [0.005, 0.005]
    # one still in flight takes its part of the instants it is open
    got = split_blocked([(0.0, 0.02)], [(0.01, INF)], [(0.0, 0.02)])
    assert abs(got[0] - 0.015) < 1e-12
    # blocked time while no op is open belongs to none (a wait on an op already done)
    assert split_blocked([(0.0, 1.0)], [], [(0.5, 2.0)]) == [0.5]
    assert split_blocked([], [(0, 1)], [(0, 1)]) == []


@settings(max_examples=200, deadline=None)
@given(spans, st.lists(ticks, max_size=8))
def test_clip_to_issues_is_clip_to_last_issue_of_each(async_ops, issues):
    issues = sorted(issues)
    assert clip_to_issues(async_ops, issues) == [clip_to_last_issue(a, b, issues)
                                                 for a, b in async_ops]


def _raw(seq, op="allreduce", group="dp0", duration=0.01, nbytes=100, peer=None, start=10.0):
    return {"v": 1, "kind": "collective", "ts": start + duration, "job_id": "j", "rank": 0,
            "host": "h", "group": group, "group_size": 4, "op": op, "seq": seq,
            "start_ts": start, "duration_s": duration, "bytes": nbytes, "step": 3,
            "peer": peer}


def test_entries_equal_the_raw_events_they_summarize():
    evs = [_raw(5, duration=0.03, start=10.2), _raw(4, duration=0.01, start=10.1),
           _raw(6, duration=0.02, nbytes=50), _raw(0, op="send", group="p2p0-1", peer=1),
           _raw(1, op="send", group="p2p0-1", peer=1, nbytes=7, duration=0.5),
           _raw(0, op="allgather", group="dp0")]
    blocked = [0.01, 0.0, 0.02, 0.001, 0.2, 0.0]
    entries = {(e["group"], e["op"], e.get("peer")): e for e in summarize(evs, blocked)}
    assert list(entries) == [("dp0", "allreduce", None), ("p2p0-1", "send", 1),
                             ("dp0", "allgather", None)]
    ar = entries[("dp0", "allreduce", None)]
    assert (ar["n"], ar["bytes"], ar["min_s"], ar["max_s"]) == (3, 250, 0.01, 0.03)
    assert (ar["first_seq"], ar["last_seq"], ar["first_start_ts"]) == (4, 6, 10.0)
    assert abs(ar["blocked_s"] - 0.03) < 1e-12 and ar["group_size"] == 4 and "peer" not in ar
    send = entries[("p2p0-1", "send", 1)]
    assert (send["n"], send["bytes"], send["max_s"], send["peer"]) == (2, 107, 0.5, 1)
    rec = comm_record("j", 0, "h", 9.0, 11.0, list(entries.values()), step=3, step_end=True)
    assert rec["kind"] == "comm" and rec["window_start_ts"] == 9.0 and rec["step_end"]



def test_a_window_with_more_entries_than_a_record_holds_is_split():
    evs = [_raw(0, group=f"p2p0-{i}", op="send", peer=i) for i in range(1, OPS_MAX + 3)]
    entries = summarize(evs, [0.001] * len(evs))
    recs = comm_records("j", 0, "h", 9.0, 11.0, entries, step=3, step_end=True)
    assert [len(r["ops"]) for r in recs] == [OPS_MAX, 2]
    assert [r["step_end"] for r in recs] == [False, True]
    for r in recs:
        validate(r)
    assert comm_records("j", 0, "h", 9.0, 11.0, [], step=3, step_end=True) == []
    tailer = comm_records("j", 0, "h", 9.0, 11.0, entries, step=None, step_end=None)
    assert [r["step_end"] for r in tailer] == [None, None]
