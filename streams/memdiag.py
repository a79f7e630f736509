"""Opt-in memory diagnostics of a long-running process (issue 17, "worker memory flat").

``FAILSLOW_TRACEMALLOC=DIR`` (``{pid}`` in it: the process id) starts ``tracemalloc``
(``FAILSLOW_TRACEMALLOC_FRAMES`` frames, 10 by default) and a daemon thread that, every ``FAILSLOW_TRACEMALLOC_EVERY_S``
seconds (300 by default) and at exit, dumps a snapshot to ``DIR/snap-NNN.tracemalloc``
and appends one JSON line to ``DIR/stats.jsonl``: wall time, VmRSS, traced current/peak
bytes and the 40 commonest ``gc`` object types with their counts. With
``FAILSLOW_TRACEMALLOC_FRAMES=0`` tracemalloc stays off (it slows the process 2-3x: a
loaded worker falls behind and its backlog hides a slow leak): only the lines. Compare two snapshots
with ``python -m failslow.streams.memdiag DIR/snap-001.tracemalloc DIR/snap-005.tracemalloc``.
Off (the default), it costs one environment lookup at start-up.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

ENV_DIR = "FAILSLOW_TRACEMALLOC"
ENV_EVERY = "FAILSLOW_TRACEMALLOC_EVERY_S"
ENV_FRAMES = "FAILSLOW_TRACEMALLOC_FRAMES"


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemDiag:
    """Snapshots every ``every_s`` seconds into ``folder`` (see the module doc)."""

    def __init__(self, folder: Path, every_s: float = 300.0, frames: int = 10) -> None:
        self.folder, self.every_s = folder, every_s
        folder.mkdir(parents=True, exist_ok=True)
        self.n = 0
        self.t0 = time.time()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.tracing = frames > 0
        if self.tracing and not tracemalloc.is_tracing():
            tracemalloc.start(frames)

    def dump(self, label: str = "") -> None:
        with self._lock:
            self.n += 1
            cur = peak = 0
            if self.tracing:
                snap = tracemalloc.take_snapshot()
                snap.dump(str(self.folder / f"snap-{self.n:03d}.tracemalloc"))
                cur, peak = tracemalloc.get_traced_memory()
            types = Counter(type(o).__name__ for o in gc.get_objects())
            line = {"n": self.n, "label": label, "t_s": round(time.time() - self.t0, 1),
                    "rss_mib": round(rss_bytes() / 2**20, 1),
                    "traced_mib": round(cur / 2**20, 1), "traced_peak_mib": round(peak / 2**20, 1),
                    "gc_objects": sum(types.values()), "gc_counts": gc.get_count(),
                    "gc_garbage": len(gc.garbage), "types": dict(types.most_common(40))}
            with open(self.folder / "stats.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.dump("periodic")

    def start(self) -> MemDiag:
        self.dump("start")
        threading.Thread(target=self._loop, name="memdiag", daemon=True).start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self.dump("exit")


ENV_TRIM = "FAILSLOW_MALLOC_TRIM_S"
_libc: Any = None
_last_trim = 0.0


def trim(now: float) -> bool:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim(0)``), at most every
    ``FAILSLOW_MALLOC_TRIM_S`` seconds (60; 0: never). Issue 17: a burst (the backlog after
    a broker cut) raised the worker's RSS by 10-30 MiB and most of it stayed although the
    objects were freed: the message buffers live in glibc's heap, whose free pages are not
    returned by themselves. Returns True when it trimmed."""
    global _libc, _last_trim
    every = float(os.environ.get(ENV_TRIM, "60"))
    if every <= 0 or now - _last_trim < every:
        return False
    _last_trim = now
    if _libc is None:
        import ctypes

        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):   # not glibc: nothing to trim
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True


def start_from_env() -> MemDiag | None:
    """Start the diagnostics when ``FAILSLOW_TRACEMALLOC`` names a folder; else None."""
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return None
    folder = folder.replace("{pid}", str(os.getpid()))  # several processes, one setting
    every = float(os.environ.get(ENV_EVERY, "300"))
    frames = int(os.environ.get(ENV_FRAMES, "10"))
    return MemDiag(Path(folder), every, frames).start()


def compare(old: str, new: str, top: int = 25) -> None:
    """Print the largest growths between two dumped snapshots, by traceback."""
    a = tracemalloc.Snapshot.load(old)
    b = tracemalloc.Snapshot.load(new)
    filt = [tracemalloc.Filter(False, tracemalloc.__file__)]
    a, b = a.filter_traces(filt), b.filter_traces(filt)
    ta = sum(s.size for s in a.statistics("filename"))
    tb = sum(s.size for s in b.statistics("filename"))
    print(f"traced {ta / 2**20:.1f} -> {tb / 2**20:.1f} MiB")
    for st in b.compare_to(a, "traceback")[:top]:
        print(f"{st.size_diff / 1024:+9.1f} KiB {st.count_diff:+7d} blocks "
              f"(now {st.size / 1024:.1f} KiB)")
        for line in st.traceback.format()[-8:]:
            print("    " + line)


if __name__ == "__main__":
    compare(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 25)
