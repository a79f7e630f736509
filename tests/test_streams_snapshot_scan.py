"""Reading a partition back on a slow machine (issue 16): a scan that knows where the
partition ends (``until``) does not give up on a few empty polls before its first
message arrived (at load 12 half of a killed worker's partitions restarted without
their snapshot)."""

from __future__ import annotations

from failslow.streams import snapshots


class _Msg:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset


class _SlowConsumer:
    """Answers nothing for the first ``silent`` polls (a slow first fetch), then the
    partition's messages."""

    def __init__(self, silent: int, n: int) -> None:
        self.silent, self.left = silent, [_Msg(o) for o in range(n)]

    def assign(self, _parts) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
        if self.silent:
            self.silent -= 1
            return []
        out, self.left = self.left[:num_messages], self.left[num_messages:]
        return out

    def close(self) -> None:
        pass


def test_a_scan_that_knows_the_end_waits_for_a_slow_first_fetch(monkeypatch):
    monkeypatch.setattr(snapshots, "_reader", lambda _b: _SlowConsumer(silent=5, n=3))
    assert snapshots.scan("b", "t", 0) == []           # two empty polls: gave up
    monkeypatch.setattr(snapshots, "_reader", lambda _b: _SlowConsumer(silent=5, n=3))
    got = snapshots.scan("b", "t", 0, until=3)
    assert [m.offset() for m in got] == [0, 1, 2]


def test_a_scan_stops_waiting_for_an_end_that_never_comes(monkeypatch):
    monkeypatch.setattr(snapshots, "_reader", lambda _b: _SlowConsumer(silent=10**6, n=0))
    assert snapshots.scan("b", "t", 0, until=5, wait_s=0.5) == []
