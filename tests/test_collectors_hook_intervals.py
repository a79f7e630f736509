"""failslow.collectors.intervals: blocked time never double counts concurrent ops.

Checked against a brute-force computation on a fine grid for random intervals."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.collectors.intervals import BlockedTime, clip_to_last_issue, union_length

GRID = 1000  # intervals on integer ticks, so the grid count is exact

ticks = st.integers(0, GRID)
spans = st.lists(st.tuples(ticks, ticks).map(sorted).map(tuple), max_size=12)


def _brute(intervals, lo=0, hi=GRID):
    covered = set()
    for a, b in intervals:
        covered.update(range(max(a, lo), min(b, hi)))
    return len(covered)


@settings(max_examples=200, deadline=None)
@given(spans, ticks, ticks)
def test_union_length_matches_brute_force(intervals, x, y):
    lo, hi = min(x, y), max(x, y)
    assert union_length(intervals, lo, hi) == _brute(intervals, lo, hi)
    assert union_length(intervals) <= sum(b - a for a, b in intervals)


@settings(max_examples=200, deadline=None)
@given(spans, st.lists(ticks, max_size=8), spans)
def test_blocked_time_is_the_union_of_waits_and_clipped_ops(waits, issues, ops):
    b = BlockedTime()
    for t in issues:
        b.issue(t)
    for w in waits:
        b.wait(*w)
    for o in ops:
        b.op(*o)
    clipped = [clip_to_last_issue(a, e, sorted(issues)) for a, e in ops]
    assert b.blocked_s(0, GRID) == _brute(list(waits) + clipped)
    assert b.blocked_s(0, GRID) <= _brute(list(waits) + list(ops))


def test_async_ops_overlapped_by_issuing_cost_only_the_tail():
    # backward issues buckets at 0, 40, 80 ms; each all-reduce takes 100 ms (the last
    # ends at 180): the rank was blocked from its last issue (80) to 180, once.
    b = BlockedTime()
    for t in (0.0, 0.04, 0.08):
        b.issue(t)
        b.op(t, t + 0.1)
    assert abs(b.blocked_s(0.0, 0.3) - 0.1) < 1e-12
    # a synchronous loss all-reduce afterwards adds its own wait
    b.wait(0.2, 0.21)
    assert abs(b.blocked_s(0.0, 0.3) - 0.11) < 1e-12
    # the window clips: only [0.15, 0.18] of the tail lies in [0.15, 0.3]
    assert abs(b.blocked_s(0.15, 0.3) - 0.04) < 1e-12
