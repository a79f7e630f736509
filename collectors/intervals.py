"""Time blocked on communication, from op intervals that may overlap: never double counted.

A rank is *blocked* on communication when its training thread cannot go on until an op
ends. What the hook observes:

* waits: intervals the thread spent inside a call that returns only when data moved
  (``Work.wait()``, ``wait_tensor``, a synchronous collective): blocked for sure;
* issues: the instants the job issued an op;
* async ops: ``[start, end]`` of an op nobody was seen waiting on (waited on from
  C++, or through a future). While the job keeps issuing ops it is still working
  (backward issues the next bucket); so only the part of such an op after the last
  issue before its end counts: ``[max(start, last issue <= end), end]``.

``blocked_s`` is the length of the union of those intervals inside a window, so two
concurrent ops blocking the same 10 ms count 10 ms, not 20.

>>> b = BlockedTime()
>>> b.issue(0.0); b.op(0.0, 0.5)          # bucket 1, overlapped by backward ...
>>> b.issue(0.4); b.op(0.4, 0.6)          # ... until bucket 2 was issued at 0.4
>>> b.wait(0.7, 0.8)                      # a synchronous all-reduce of the loss
>>> round(b.blocked_s(0.0, 1.0), 3)       # [0.4, 0.6] + [0.7, 0.8]
0.3
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable


def union_length(intervals: Iterable[tuple[float, float]], lo: float = float("-inf"),
                 hi: float = float("inf")) -> float:
    """Length of the union of ``[a, b]`` intervals clipped to ``[lo, hi]``, in their unit.

    >>> union_length([(0, 2), (1, 3), (5, 6)])
    4
    >>> union_length([(0, 2), (1, 3)], lo=1.5, hi=2.5)
    1.0
    """
    total: float = 0
    end = lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a or b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def clip_to_last_issue(start: float, end: float, issues: list[float]) -> tuple[float, float]:
    """``[start, end]`` of an async op, starting no earlier than the last issue at or
    before ``end`` (``issues`` sorted): before that the job was still issuing work.

    >>> clip_to_last_issue(0.0, 1.0, [0.0, 0.3, 0.7, 1.2])
    (0.7, 1.0)
    """
    i = bisect_right(issues, end)
    return (max(start, issues[i - 1]) if i else start), end


class BlockedTime:
    """Accumulates issues, waits and async op intervals; ``blocked_s`` over a window.

    Not thread-safe by itself: the hook appends under its lock. Times in seconds, any
    one monotonic clock.
    """

    __slots__ = ("issues", "waits", "ops")

    def __init__(self) -> None:
        self.issues: list[float] = []
        self.waits: list[tuple[float, float]] = []
        self.ops: list[tuple[float, float]] = []

    def issue(self, t: float) -> None:
        self.issues.append(t)

    def wait(self, start: float, end: float) -> None:
        self.waits.append((start, end))

    def op(self, start: float, end: float) -> None:
        """An async op that no one was seen waiting on."""
        self.ops.append((start, end))

    def intervals(self) -> list[tuple[float, float]]:
        issues = sorted(self.issues)
        return self.waits + [clip_to_last_issue(a, b, issues) for a, b in self.ops]

    def blocked_s(self, lo: float, hi: float) -> float:
        """Seconds blocked inside ``[lo, hi]``: the union, each instant counted once."""
        return union_length(self.intervals(), lo, hi)
