"""The worker's collector policy (streams.gcwork, issue 31): frozen after each unit of work,
cycles found by a full collection once one is due, nothing done while off."""

import gc
import time
import weakref

from failslow.streams import gcwork


class _Node:
    pass


def _cycle() -> weakref.ref:
    a = _Node()
    a.self = a
    return weakref.ref(a)


def test_off_settle_leaves_the_collector_alone() -> None:
    gcwork.disable()
    ref = _cycle()
    gcwork.settle()
    gc.collect()
    assert ref() is None


def test_settle_freezes_and_a_due_full_collection_frees_cycles(monkeypatch) -> None:
    monkeypatch.setitem(gcwork._state, "full", 0)
    gcwork.enable()
    try:
        ref = _cycle()
        gcwork.settle()              # not due yet: frozen, the cycle waits
        gc.collect()                 # a collection does not walk frozen objects
        assert ref() is not None
        monkeypatch.setitem(gcwork._state, "due", 0.0)
        gcwork.settle()              # due: unfreeze, collect, freeze
        assert ref() is None
        assert gcwork.stats()["full"] == 1
        # the next one waits at least GC_FULL_MIN_CPU_S of the process's CPU
        assert gcwork._state["due"] >= time.process_time() + gcwork.GC_FULL_MIN_CPU_S - 1.0
        ref = _cycle()
        gcwork.settle()
        gc.collect()
        assert ref() is not None
    finally:
        gcwork.disable()
        gc.unfreeze()
        gc.collect()
