"""A publisher that writes JSON Lines instead of Kafka: trace a job with no broker.

Same surface as ``collectors.publisher.Publisher`` (``publish(events)``,
``flush()``, ``close()``), so the training hook (or any collector) can write a
trace file that ``failslow detect FILE`` and ``failslow replay FILE`` read.
Each rank writes its own file (``rank{N}.jsonl``); ``failslow detect`` orders
the concatenation of several files by ``ts`` itself.

Every ``publish`` appends its events and flushes them to the operating system,
so a job killed mid-way leaves a readable trace (at most the last line cut,
which ``detect`` reports and skips).

An existing file is refused (``FileExistsError``) unless ``append=True``: a rerun that
wrote into the previous run's file would make ``failslow detect`` judge both runs as
one, with one incident spanning them. ``collectors.runs.trace_path`` gives each run its
own folder.

>>> import tempfile, os, orjson
>>> path = os.path.join(tempfile.mkdtemp(), "rank0.jsonl")
>>> pub = FilePublisher(path)
>>> pub.publish([{"v": 1, "kind": "host", "ts": 1.0, "host": "h0"}])
>>> pub.close()
0
>>> [orjson.loads(line)["host"] for line in open(path, "rb")]
['h0']
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson


class FilePublisher:
    """Append CONTRACT.md events to a JSON Lines file (thread-safe).

    path: the file, created with its folder if missing. append: add to the file when it
    exists; by default an existing file raises ``FileExistsError`` (another run's trace).
    """

    def __init__(self, path: str | Path, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._file = open(self.path, "ab" if append else "xb")  # noqa: SIM115 - close()
        except FileExistsError:
            raise FileExistsError(
                f"{self.path} exists (an earlier run's trace?): give each run its own "
                "file, or pass append=True to add to it") from None
        self._lock = threading.Lock()
        self.stats = {"published": 0}

    def publish(self, events: Iterable[dict[str, Any]]) -> None:
        lines = b"".join(orjson.dumps(ev) + b"\n" for ev in events)
        if not lines:
            return
        with self._lock:
            self._file.write(lines)
            self._file.flush()
            self.stats["published"] += lines.count(b"\n")

    def flush(self, timeout: float = 10.0) -> int:
        """Nothing is ever pending: returns 0 (as ``Publisher.flush``, events left)."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
        return 0

    def close(self, timeout: float = 10.0) -> int:
        """Close the file; returns 0 (events left undelivered, as ``Publisher.close``)."""
        with self._lock:
            if not self._file.closed:
                self._file.close()
        return 0
