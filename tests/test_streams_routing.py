"""Splitting an input message too large to forward through the internal job topic."""

from __future__ import annotations

import orjson

from failslow.streams.routing import split_value


def test_a_large_array_is_cut_into_parts_that_fit_in_order():
    events = [{"v": 1, "kind": "host", "ts": float(i), "host": f"h{i}", "pad": "x" * 50}
              for i in range(1000)]
    value = orjson.dumps(events)
    parts = split_value(value, limit=10_000)
    assert parts is not None and len(parts) > 1
    assert all(len(p) <= 10_000 for p in parts)
    assert [e for p in parts for e in orjson.loads(p)] == events
    assert split_value(value, limit=len(value)) == [value]


def test_what_cannot_be_cut_is_refused():
    assert split_value(b'{"v": 1, "pad": "' + b"x" * 100 + b'"}', limit=50) is None
    assert split_value(b"not json" * 20, limit=50) is None
    assert split_value(orjson.dumps([{"pad": "x" * 100}, 1]), limit=50) is None


def test_repeated_client_errors_are_held_back_and_summarized():
    import logging

    from failslow.streams.quiet import RepeatFilter

    now = [0.0]
    held = []
    f = RepeatFilter(window_s=60.0, clock=lambda: now[0], on_suppress=lambda: held.append(1))

    def rec(name, msg):
        return logging.LogRecord(name, logging.ERROR, "", 0, msg, None, None)

    passed = [f.filter(rec("aiokafka", f"Unable connect to node with id {i}")) for i in range(50)]
    assert passed == [True] + [False] * 49 and len(held) == 49
    assert f.filter(rec("aiokafka", "Unable to update metadata from [1]"))  # another kind
    assert f.filter(rec("failslow.worker", "x")) and f.filter(rec("failslow.worker", "x"))
    now[0] = 61.0
    again = rec("aiokafka", "Unable connect to node with id 7")
    assert f.filter(again) and "and 49 more like it" in again.getMessage()
