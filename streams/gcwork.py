"""The cyclic garbage collector in a worker, run as `failslow detect` runs it (issue 31).

The job stage decodes a few containers per event and holds them for ordering (a second or
two), the Detector keeps millions of long-lived objects: at the worker's thresholds
(``failslow worker``'s ``tune_gc``) the young collections walked every decoded event once
or twice more, 4.75 of the 40.4 CPU s the worker's path took for a 16,384-rank job in 4
shards (`failslow detect`, which freezes each chunk it decodes and judges: 0.07 s).

Once ``enable``d (``tune_gc``), ``settle`` (the judge thread, after each message, tick and
snapshot) freezes what lives (``gc.freeze``: O(1); a frozen object is still freed by its
reference count, only cycles wait), and a full collection (unfreeze, collect, freeze)
finds the cycles once the process has used ``took / GC_FULL_SHARE`` CPU seconds since the
last one (``took``: how long that one took), ``GC_FULL_MIN_CPU_S`` at least: the full
collections take at most that share of the worker, whatever its heap, and cyclic garbage
lives that long at most. Off (tests, other processes), ``settle`` does nothing.
"""

from __future__ import annotations

import gc
import time

# The most of the process's CPU the full collections take (a 16,384-rank job's 4 shards
# in one process: ~0.5 s each, so every 50 CPU s)
GC_FULL_SHARE = 0.01
# ... and the least CPU between two (a small heap's take a few ms)
GC_FULL_MIN_CPU_S = 10.0

_state = {"on": False, "due": 0.0, "full": 0, "full_cpu_s": 0.0}


def enable() -> None:
    """Settle after each unit of work from now on; the first full collection is due in
    ``GC_FULL_MIN_CPU_S``."""
    _state["on"] = True
    _state["due"] = time.process_time() + GC_FULL_MIN_CPU_S


def disable() -> None:
    _state["on"] = False


def settle() -> None:
    """Freeze what lives now; collect cycles when a full collection is due."""
    if not _state["on"]:
        return
    gc.freeze()
    now = time.process_time()
    if now < _state["due"]:
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    done = time.process_time()
    took = done - now
    _state["full"] += 1
    _state["full_cpu_s"] += took
    _state["due"] = done + max(GC_FULL_MIN_CPU_S, took / GC_FULL_SHARE)


def stats() -> dict[str, float]:
    """Full collections so far and their CPU seconds."""
    return {"full": _state["full"], "full_cpu_s": _state["full_cpu_s"]}
