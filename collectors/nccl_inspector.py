"""NCCL Inspector tailer: NCCL's per-collective JSON records -> ``collective`` events.

NCCL's Inspector profiler plugin (``ext-profiler/inspector`` in the NCCL repository)
writes one JSON object per collective per communicator into files under
``NCCL_INSPECTOR_DUMP_DIR`` (docs/collectors.md lists the variables to set). Each
record has ``header`` (communicator ``id``, ``rank`` in it, ``n_ranks``),
``metadata`` (``hostname``, ``pid``, ``dump_timestamp_us``) and ``coll_perf``
(``coll``, ``coll_sn``, ``coll_msg_size_bytes``, ``coll_exec_time_us`` and, with
``NCCL_INSPECTOR_DUMP_VERBOSE=1``, ``event_trace_ts.coll_start_ts`` in µs).

The tailer follows every file in the folder (new files included), parses the
complete objects appended since the last call (one per line, or pretty-printed),
and keeps a partly written object for the next call. The start time is the
verbose ``coll_start_ts`` when present, else the dump time minus the execution
time (the dump happens after the collective ends, so this is an upper bound).
``coll_sn`` becomes ``seq`` (NCCL numbers a communicator's collectives the same way
on every rank) and the communicator id the group (``nccl-<id>``, or a name from
``groups``). ``rank`` is the rank inside the communicator unless ``rank_of`` maps
a record to the job's global rank (e.g. by pid).

By default (``grain="comm"``) each ``sample()`` sums what it read into one ``comm``
record per (rank, host): the window runs from the previous sample (or the earliest op
end read, if older: records arrive one dump interval late) to now, ``step`` is null
(NCCL does not know the job's steps), and an op's ``blocked_s`` is its share of the
union of that rank's op intervals (``collectors.comm_windows.split_blocked``: ops of
several communicators running at once never double count). NCCL's execution time is
GPU time, so ``blocked_s`` here is time inside collectives, not time the training
thread waited. ``grain="collective"`` publishes one ``collective`` event per record.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any, cast

from failslow.collectors.comm_windows import comm_records, split_blocked, summarize
from failslow.schema.events import CollectiveEvent

log = logging.getLogger(__name__)

_OPS = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reducescatter",
        "broadcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall",
        "send": "send", "recv": "recv", "barrier": "barrier"}
_DECODER = json.JSONDecoder()


class _File:
    __slots__ = ("offset", "buffer")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.buffer = ""


class InspectorTailer:
    """Follows NCCL Inspector output under ``directory``; ``sample()`` returns new events.

    from_start: read files that exist at start from their beginning (default: from
    their end, like ``tail -f``, so a restarted collector does not publish history twice).
    grain: ``comm`` (default: one summary per rank per sample) or ``collective`` (one
    event per record). clock: wall clock, seconds (tests inject one).
    """

    name = "nccl"

    def __init__(self, directory: str, job_id: str, host: str | None = None,
                 groups: dict[str, str] | None = None,
                 rank_of: Callable[[dict], int | None] | None = None,
                 from_start: bool = False, grain: str = "comm",
                 clock: Callable[[], float] = time.time) -> None:
        if grain not in ("comm", "collective"):
            raise ValueError(f"grain must be comm or collective, not {grain!r}")
        self.directory = directory
        self.grain = grain
        self.clock = clock
        self._last_sample = clock()
        self.job_id = job_id
        self.host = host
        self.groups = groups or {}
        self.rank_of = rank_of
        self.bad_records = 0
        self.skipped_ops = 0
        self._files: dict[str, _File] = {}
        if not from_start:
            for path in self._list():
                self._files[path] = _File(os.path.getsize(path))

    def _list(self) -> list[str]:
        out = []
        for root, _dirs, names in os.walk(self.directory):
            out += [os.path.join(root, n) for n in names if not n.startswith(".")]
        return sorted(out)

    def sample(self) -> list[Any]:
        """New records as ``collective`` events, or (grain ``comm``) as ``comm`` records."""
        events: list[CollectiveEvent] = []
        seen = set()
        for path in self._list():
            seen.add(path)
            state = self._files.setdefault(path, _File(0))
            try:
                size = os.path.getsize(path)
                if size < state.offset:  # truncated or replaced: start over
                    state.offset, state.buffer = 0, ""
                if size == state.offset:
                    continue
                with open(path, "rb") as f:
                    f.seek(state.offset)
                    chunk = f.read(size - state.offset)
            except OSError:
                continue
            state.offset += len(chunk)
            state.buffer += chunk.decode("utf-8", errors="replace")
            for record in self._parse(state):
                ev = self._event(record)
                if ev is not None:
                    events.append(ev)
        for gone in set(self._files) - seen:
            del self._files[gone]
        if self.grain == "comm":
            return self._summarize(events)
        return events

    def _summarize(self, events: list[CollectiveEvent]) -> list[dict]:
        now, since = self.clock(), self._last_sample
        self._last_sample = now
        by_rank: dict[tuple[int, str], list[CollectiveEvent]] = {}
        for ev in events:
            by_rank.setdefault((ev["rank"], ev["host"]), []).append(ev)
        out = []
        for (rank, host), evs in by_rank.items():
            spans = [(ev["start_ts"], ev["ts"]) for ev in evs]
            out.extend(comm_records(self.job_id, rank, host,
                                    min(since, min(ev["ts"] for ev in evs)),
                                    max(now, max(ev["ts"] for ev in evs)),
                                    summarize(cast(list[dict], evs),
                                              split_blocked(spans, [], spans)),
                                    step=None, step_end=None))
        return out

    def _parse(self, state: _File) -> list[dict]:
        text, pos, out = state.buffer, 0, []
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            try:
                obj, pos = _DECODER.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                nl = text.find("\n", exc.pos)
                if nl < 0:
                    break  # an object still being written: wait for the rest
                self.bad_records += 1
                log.warning("NCCL Inspector: unreadable record in %s skipped (%s)",
                            self.directory, exc.msg)
                pos = nl + 1
                continue
            if isinstance(obj, dict):
                out.append(obj)
        state.buffer = text[pos:]
        return out

    def _event(self, rec: dict) -> CollectiveEvent | None:
        try:
            header, meta, perf = rec["header"], rec.get("metadata", {}), rec["coll_perf"]
            op = _OPS.get(str(perf["coll"]).lower())
            if op is None:
                self.skipped_ops += 1
                return None
            duration = float(perf["coll_exec_time_us"]) / 1e6
            trace = perf.get("event_trace_ts") or {}
            if trace.get("coll_start_ts") is not None:
                start = float(trace["coll_start_ts"]) / 1e6
            else:
                start = float(meta["dump_timestamp_us"]) / 1e6 - duration
            comm = str(header["id"])
            rank = self.rank_of(rec) if self.rank_of else None
            return {"v": 1, "kind": "collective", "ts": start + duration,
                    "job_id": self.job_id,
                    "rank": int(header["rank"]) if rank is None else rank,
                    "host": self.host or meta.get("hostname") or socket.gethostname(),
                    "group": self.groups.get(comm, f"nccl-{comm}"),
                    "group_size": int(header["n_ranks"]), "op": op,
                    "seq": int(perf["coll_sn"]), "start_ts": start, "duration_s": duration,
                    "bytes": int(perf["coll_msg_size_bytes"])}
        except (KeyError, TypeError, ValueError) as exc:
            self.bad_records += 1
            log.warning("NCCL Inspector: record without %s skipped", exc)
            return None
