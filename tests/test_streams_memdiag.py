"""Issue 17: the worker's memory tools. ``memdiag.trim`` gives freed C-heap pages back to
the OS at most every ``FAILSLOW_MALLOC_TRIM_S`` (off with 0); ``FAILSLOW_TRACEMALLOC``
writes snapshots and a stats line that ``python -m failslow.streams.memdiag`` compares; unset, it
starts nothing."""

from __future__ import annotations

import json
import sys

import pytest

from failslow.streams import memdiag


def test_trim_runs_at_most_once_per_interval_and_not_when_off(monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc only")
    monkeypatch.setattr(memdiag, "_last_trim", 0.0)
    monkeypatch.setenv(memdiag.ENV_TRIM, "60")
    assert memdiag.trim(1000.0) is True
    assert memdiag.trim(1030.0) is False     # within the interval
    assert memdiag.trim(1061.0) is True
    monkeypatch.setenv(memdiag.ENV_TRIM, "0")
    assert memdiag.trim(5000.0) is False


def test_a_burst_freed_among_kept_buffers_goes_back_to_the_os(monkeypatch):
    monkeypatch.setattr(memdiag, "_last_trim", 0.0)
    monkeypatch.setenv(memdiag.ENV_TRIM, "60")
    kept, burst = [], []
    for i in range(40_000):                  # ~80 MiB of 2 KB buffers, 1 in 20 kept
        burst.append(bytes(2000))
        if i % 20 == 0:
            kept.append(bytes(2000))
    del burst
    before = memdiag.rss_bytes()
    if not memdiag.trim(1e9):
        pytest.skip("no glibc malloc_trim here")
    assert memdiag.rss_bytes() < before - 20 * 2**20, (before, memdiag.rss_bytes())
    assert len(kept) == 2000


def test_off_unless_asked_and_on_it_writes_snapshots_and_stats(tmp_path, monkeypatch):
    monkeypatch.delenv(memdiag.ENV_DIR, raising=False)
    assert memdiag.start_from_env() is None
    d = memdiag.MemDiag(tmp_path, every_s=3600, frames=0)
    d.dump("a")
    d.dump("b")
    lines = [json.loads(x) for x in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert [x["label"] for x in lines] == ["a", "b"]
    assert lines[0]["rss_mib"] > 0 and lines[0]["gc_objects"] > 0
    assert not list(tmp_path.glob("*.tracemalloc"))   # frames 0: no tracemalloc
