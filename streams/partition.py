"""The state of one home partition: event-time ordering (``streams.ordering``),
de-duplication, the Detector, and the incidents already emitted. Pure Python, no
I/O, no asyncio.

De-duplication. Each source (a rank's steps, a rank's collectives in one
group, a rank's comm windows, one GPU / NIC port / host) produces in order and Kafka keeps per-key
order, so a source's ``(ts, step|seq)`` only grows: an event that does not
advance its source's mark is a duplicate (an at-least-once producer retry) and
is dropped, counted; a comm record at its rank's mark is dropped only when it equals
one already taken there (a producer may send one window as several records).
A job whose every source's mark was forgotten (``prune``: silent for 6 x lateness, so it
ended or paused) leaves its newest ts in a bounded memory of ended jobs (``ENDED_JOBS_MAX``,
in the snapshots): its events up to that ts are a replay (a producer's spool, ``failslow
replay`` of its file) and are dropped as duplicates before anything else sees them,
or they would re-create the job and page again (issue 33); newer ones are judged.
Emitted incidents are de-duplicated on their full content,
so a replay after a restart re-creates the same incident events and none is
emitted twice.

Producer clocks. First of all, ``ClockGuard`` (streams.clocks) takes out the events
stamped too far ahead of the worker's clock (``take_rejected``: for the dead-letter
topic), so one broken clock never moves the partition's time (issue 33).

Input caps. Before anything is buffered, ``InputLimits`` (streams.limits) holds the
events of new jobs on probation and drops those of jobs, hosts, ranks and groups beyond
its caps (``capped``: how many it dropped).

Recovery. ``snapshot()`` is small: the Detector's state, the watermark, the
de-duplication marks and two offsets: ``o_min`` (the oldest message still holding
an unreleased event: consumption must resume at or before it) and ``o_next``.
After ``restore``, a message below ``o_next`` contributes only its step and
collective events newer than the snapshot's watermark and its device samples
newer than the watermark minus ``telemetry_delay_s`` (the others are already
inside the Detector's state); from ``o_next`` on, processing is normal.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from itertools import repeat
from operator import gt, itemgetter
from typing import Any

import orjson

from failslow.schema.batches import BATCH_KINDS, expand
from failslow.streams.clocks import CLOCK_MAX_AHEAD_S, CLOCK_WARN_S, ClockGuard
from failslow.streams.detector import COUNTERS, StreamDetector
from failslow.streams.limits import InputLimits
from failslow.streams.ordering import SOURCE, SOURCE_FIELDS, EventOrder
from failslow.streams.rows import Row, column, event_of, has_absent, rows_of, subset

INPUT_KINDS = ("step", "collective", "comm", "gpu", "nic", "host")
_JOB_KINDS = frozenset(("step", "collective", "comm"))
# Ended jobs remembered per partition (about 100 B each): a replay of any of the last
# ENDED_JOBS_MAX jobs that left the partition is recognized.
ENDED_JOBS_MAX = 4096
_EV_TS = itemgetter("ts")

# kind -> (source id getter, position getter): a source's position only grows.
_MARK = {
    "step": (SOURCE["step"], itemgetter("ts", "step")),
    "collective": (SOURCE["collective"], itemgetter("ts", "seq")),
    # a rank's windows follow each other: (end, start) only grows
    "comm": (SOURCE["comm"], itemgetter("ts", "window_start_ts")),
    "gpu": (SOURCE["gpu"], _EV_TS),
    "nic": (SOURCE["nic"], _EV_TS),
    "host": (SOURCE["host"], _EV_TS),
}
# the same positions as fields, read from a batch's columns
_MARK_FIELDS = {"step": ("ts", "step"), "collective": ("ts", "seq"),
                "comm": ("ts", "window_start_ts"), "gpu": ("ts",), "nic": ("ts",),
                "host": ("ts",)}
# Below every position of a source with no mark yet: a ts, or a (ts, ...) tuple
_LOW = (-math.inf, (-math.inf,))


def source_mark(ev: dict) -> tuple[tuple, Any]:
    """(source id, position) of an input event; positions of one source only grow
    (``(ts, step|seq)`` for steps and collectives, ``(ts, window_start_ts)`` for comm
    windows, ``ts`` for telemetry)."""
    src, pos = _MARK[ev["kind"]]
    return src(ev), pos(ev)


def _digest(ev: dict) -> str:
    """A short digest of an event's content (comm records at their mark, in snapshots)."""
    return hashlib.blake2b(orjson.dumps(ev, option=orjson.OPT_SORT_KEYS),
                           digest_size=8).hexdigest()


def _default_detector_factory() -> StreamDetector:
    from failslow.models.pipeline import Detector

    return Detector()


def _default_detector_restore(state: Any) -> StreamDetector:
    from failslow.models.pipeline import Detector

    return Detector.from_state(state)


class JobPartition:
    """Everything one home partition needs between two messages. ``lateness``,
    ``idle_s``, ``expect_s`` and ``jitter_s``: see ``EventOrder``; ``clock`` (the worker's
    wall clock, epoch s), ``clock_warn_s`` and ``max_ahead_s``: see ``ClockGuard``."""

    def __init__(self, partition: int, lateness: float = 10.0, idle_s: float = 2.0,
                 detector_factory: Callable[[], StreamDetector] = _default_detector_factory,
                 detector_restore: Callable[[Any], StreamDetector] = _default_detector_restore,
                 expect_s: float | None = None, jitter_s: float = 0.3,
                 limits: InputLimits | None = None, clock: Callable[[], float] = time.time,
                 clock_warn_s: float = CLOCK_WARN_S,
                 max_ahead_s: float = CLOCK_MAX_AHEAD_S) -> None:
        self.partition = partition
        self.limits = limits or InputLimits(partition=partition)
        self.clocks = ClockGuard(clock_warn_s, max_ahead_s, clock)
        self._rejected: list[tuple[str, dict]] = []
        self.lateness = lateness
        self._restore_detector = detector_restore
        self.detector: StreamDetector = detector_factory()
        # "events": valid events taken by ``ingest`` (counted there, once, capped ones
        # included); "judged_rank_steps": ranks' steps the Detector judged
        self.counts = {"events": 0, "late": 0, "duplicates": 0, "late_samples": 0,
                       "detector_errors": 0, "replay_skipped": 0, "incidents": 0,
                       "incidents_suppressed": 0, "capped": 0,
                       "jobs_ended": 0, "judged_rank_steps": 0,
                       "clock_ahead": 0, "clock_skewed": 0}
        self.order = EventOrder(lateness, idle_s, expect_s, jitter_s, self._delay, self.counts)
        self._marks: dict[tuple, tuple] = {}
        # comm source -> its records at the mark: a producer splits one window into several
        # records (past OPS_MAX entries, or one per step), all at the same (ts, start)
        self._at_mark: dict[tuple, list[Any]] = {}  # dicts, or Rows of a batch
        self._at_mark_restored: dict[tuple, set[str]] = {}  # the same, as digests, from a snapshot
        self._ended: OrderedDict[str, float] = OrderedDict()  # ended job -> its newest ts
        self.emitted: dict[str, set[bytes]] = {}
        self.open_ids: set[str] = set()
        self._resolved: dict[str, float] = {}   # incident id -> event ts it resolved at
        self.next_offset = 0
        self._skip_below = -1  # offsets below this replay only events newer than _skip_ts
        self._skip_ts = math.inf

    @property
    def _delay(self) -> float:
        """How far (event-time s) the Detector's device samples trail its steps."""
        return getattr(self.detector, "telemetry_delay_s", 0.0)

    @property
    def wm(self) -> float:
        """The watermark (event-time s): step and collective events up to it are released."""
        return self.order.wm

    @property
    def buffered(self) -> int:
        """Events held for ordering."""
        return self.order.buffered

    # -- input ---------------------------------------------------------------------------

    def ingest(self, events: list[dict], offset: int, now: float,
               placed: bool = False) -> list[dict]:
        """Take the valid events of the message at ``offset``; return incidents to emit.
        ``placed``: device samples of a host the route placed on this partition
        (``InputLimits.admit``)."""
        if offset >= self.next_offset:
            self.next_offset = offset + 1
        # Replaying below the snapshot's o_next: events up to its watermark are already in
        # the Detector's state; they still tell which sources exist and how far they got.
        skip_ts = self._skip_ts if offset < self._skip_below else -math.inf
        self.counts["events"] += rows_of(events)
        events, rejected = self.clocks.screen(events)
        if rejected or self.clocks.skewed != self.counts["clock_skewed"]:
            self._rejected.extend(rejected)
            self.counts["clock_ahead"] = self.clocks.ahead
            self.counts["clock_skewed"] = self.clocks.skewed
        if self._ended:
            events = self._drop_replayed(events)
        events = self.limits.admit(events, placed)
        self.counts["capped"] = sum(self.limits.counts.values())
        late = self.order.add(events, offset, now, skip_ts, placed)
        out = self._feed(late) if late else []
        ready = self.order.advance(now)
        if ready:
            out.extend(self._feed(ready))
        return out

    def _drop_replayed(self, events: list[dict]) -> list[dict]:
        """``events`` less the ended jobs' events up to their newest ts (duplicates)."""
        ended = self._ended
        kept: list[dict] = []
        dropped = 0
        for ev in events:
            bk = BATCH_KINDS.get(ev["kind"])
            if bk is None:
                if ev["kind"] not in _JOB_KINDS or ev["ts"] > ended.get(ev["job_id"],
                                                                         -math.inf):
                    kept.append(ev)
                else:
                    dropped += 1
                continue
            if bk.row_kind not in _JOB_KINDS:
                kept.append(ev)
                continue
            # a batch: its rows up to their job's end are dropped, the rest go on
            n = len(ev[bk.row_key])
            end = [ended.get(j, -math.inf) for j in column(ev, "job_id", n)]
            idxs = [i for i, t in enumerate(column(ev, "ts", n)) if t > end[i]]
            kept += subset(ev, idxs)
            dropped += n - len(idxs)
        self.counts["duplicates"] += dropped
        return kept

    def _ended_job(self, job: str, ts: float) -> None:
        """Remember that ``job`` left the partition after its event at ``ts``."""
        ended = self._ended
        if ts > ended.get(job, -math.inf):
            ended[job] = ts
            ended.move_to_end(job)
        while len(ended) > ENDED_JOBS_MAX:
            ended.popitem(last=False)

    def take_rejected(self) -> list[tuple[str, dict]]:
        """(reason, event) of the events ``ingest`` took out since the last call."""
        out, self._rejected = self._rejected, []
        self.clocks.origin.clear()
        return out

    def origin_of(self, ev: dict) -> dict:
        """The batch a rejected row was cut from (``ev`` itself when it came alone)."""
        return self.clocks.origin.get(id(ev), ev)

    def runs_on(self, host: str) -> bool:
        """True when a job of this partition has sent step events from ``host``."""
        return self.order.runs_on(host)

    def pause(self, seconds: float) -> None:
        """The worker could not process for ``seconds`` (taking over a partition, a
        rebalance): the pause must not look like idle input."""
        self.order.pause(seconds)

    def tick(self, now: float, busy: bool = False) -> list[dict]:
        """Called periodically: let idle sources / an idle partition release what they hold
        (``busy``: see ``EventOrder.tick``)."""
        ready = self.order.tick(now, busy)
        return self._feed(ready) if ready else []

    # -- detection -----------------------------------------------------------------------

    def _feed(self, events: list[dict]) -> list[dict]:
        fresh: list[dict] = []
        dropped = 0
        run: list[dict] = []       # per-rank events in a row: their marks in one pass

        def take(rows: list[dict]) -> None:
            nonlocal dropped
            kept = self._feed_rows(rows)
            fresh.extend(kept)
            dropped += len(rows) - len(kept)

        for ev in events:
            if ev["kind"] not in BATCH_KINDS:
                run.append(ev)
                continue
            if run:
                take(run)
                run = []
            # issue 31: a batch whose rows are new goes on whole
            got = self._batch_marks(ev)
            if got is not None:
                fresh += got
                if not got or got[0] is not ev:   # cut: the rows left out were duplicates
                    dropped += rows_of([ev]) - rows_of(got)
            else:
                take(expand(ev))   # a comm row at its mark: compared row by row
        if run:
            take(run)
        self.counts["duplicates"] += dropped
        if not fresh:
            return []
        det = self.detector
        before = [getattr(det, attr, 0) for attr, _ in COUNTERS]
        incidents = det.process_batch(fresh)
        counts = self.counts
        for (attr, name), was in zip(COUNTERS, before, strict=True):
            counts[name] += getattr(det, attr, 0) - was
        return self._dedupe(incidents)

    def _feed_rows(self, rows: list[dict]) -> list[dict]:
        """The rows of a batch that advance their sources' marks (a comm record at its
        rank's mark: when it is not one already taken there), marks moved."""
        marks, at_mark = self._marks, self._at_mark
        fresh = []
        for ev in rows:
            kind = ev["kind"]
            src, pos = _MARK[kind]
            src, pos = src(ev), pos(ev)
            last = marks.get(src)
            if last is not None and pos <= last:
                if (kind != "comm" or pos != last or ev in at_mark.get(src, ())
                        or _digest(ev) in self._at_mark_restored.get(src, ())):
                    continue
                at_mark.setdefault(src, []).append(ev)
                fresh.append(ev)
                continue
            marks[src] = pos
            if kind == "comm":
                at_mark[src] = [ev]
                if self._at_mark_restored:
                    self._at_mark_restored.pop(src, None)
            fresh.append(ev)
        return fresh

    def _batch_marks(self, ev: dict) -> list[dict] | None:
        """A batch's rows that advance their sources' marks, marks moved, read from its
        columns: the batch itself when all do (most), else a cut of it; None (nothing
        moved) when a comm row is at its rank's mark, which needs the rows compared
        (``_feed_rows``), or a mark field is absent from a row."""
        bk = BATCH_KINDS[ev["kind"]]
        rk = bk.row_kind
        n = len(ev[bk.row_key])
        fields, at = SOURCE_FIELDS[rk], _MARK_FIELDS[rk]
        if has_absent(ev, fields + at):
            return None
        srcs = list(zip([rk] * n, *(column(ev, f, n) for f in fields), strict=True))
        pos = column(ev, "ts", n) if len(at) == 1 else list(
            zip(*(column(ev, f, n) for f in at), strict=True))
        marks = self._marks
        # issue 31: a batch with one row per source (a host's batch, nearly all) compared
        # with its marks in C-level passes; a source twice in it takes the loop below
        new: dict[tuple, Any] = dict(zip(srcs, pos, strict=True))
        fresh = len(new) == n and all(map(gt, pos, map(marks.get, srcs,
                                                       repeat(_LOW[len(at) > 1]))))
        if rk == "comm":
            if not fresh:
                if len(new) == n:
                    return None     # a row at or below its rank's mark
                new = {}
                for src, p in zip(srcs, pos, strict=True):   # a rank twice in the batch
                    last = new.get(src) or marks.get(src)
                    if last is not None and p <= last:
                        return None
                    new[src] = p
            marks.update(new)
            cache: list = []
            at_mark = self._at_mark
            for i, src in enumerate(srcs):
                at_mark[src] = [Row(ev, i, cache)]
            if self._at_mark_restored:
                for src in srcs:
                    self._at_mark_restored.pop(src, None)
            return [ev]
        if fresh:
            marks.update(new)
            return [ev]
        idxs = []
        for i, (src, p) in enumerate(zip(srcs, pos, strict=True)):
            last = marks.get(src)
            if last is None or p > last:
                marks[src] = p
                idxs.append(i)
        return subset(ev, idxs)

    def _dedupe(self, incidents: list[dict]) -> list[dict]:
        out = []
        for inc in incidents:
            if self.remember(inc):
                out.append(inc)
            else:
                self.counts["incidents_suppressed"] += 1
        self.counts["incidents"] += len(out)
        return out

    def remember(self, inc: dict) -> bool:
        """Record an incident event as emitted; False when this exact event was emitted before."""
        sig = orjson.dumps(inc, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
        seen = self.emitted.setdefault(inc["incident_id"], set())
        if sig in seen:
            return False
        seen.add(sig)
        if inc.get("kind") == "action":  # issue 32: actions share the de-duplication only
            return True
        if inc["status"] == "open":
            self.open_ids.add(inc["incident_id"])
            self._resolved.pop(inc["incident_id"], None)
        else:
            self.open_ids.discard(inc["incident_id"])
            self._resolved[inc["incident_id"]] = inc["ts"]
        return True

    # -- recovery ------------------------------------------------------------------------

    def o_min(self) -> int:
        """The oldest offset consumption must resume from to rebuild the buffer."""
        return self.order.o_min(self.next_offset)

    def prune(self) -> None:
        """Forget de-duplication marks and input-cap entries of sources silent for
        6 x lateness (ended jobs)."""
        horizon = self.wm - 6 * self.lateness
        self.limits.prune(horizon)
        # incidents resolved long ago (their jobs ended or healed) need no de-duplication
        gone = [i for i, ts in self._resolved.items() if ts < horizon]
        for iid in gone:
            del self._resolved[iid]
            self.emitted.pop(iid, None)
        kept: dict[tuple, Any] = {}
        left: dict[str, float] = {}   # job -> newest ts of its sources forgotten now
        for src, pos in self._marks.items():
            ts = pos[0] if isinstance(pos, tuple) else pos
            if ts >= horizon:
                kept[src] = pos
            elif src[0] in _JOB_KINDS and ts > left.get(src[1], -math.inf):
                left[src[1]] = ts
        self._marks = kept
        if left:
            live = {src[1] for src in kept if src[0] in _JOB_KINDS}
            for job, ts in left.items():
                if job not in live:
                    self._ended_job(job, ts)
        self._at_mark = {s: evs for s, evs in self._at_mark.items() if s in self._marks}
        self._at_mark_restored = {s: d for s, d in self._at_mark_restored.items()
                                  if s in self._marks}

    def snapshot(self) -> dict:
        wm = self.wm if math.isfinite(self.wm) else None
        return {"v": 1, "partition": self.partition, "wm": wm, "o_min": self.o_min(),
                "o_next": self.next_offset,
                "marks": [[src, pos] for src, pos in self._marks.items()],
                "at_mark": [[src, sorted({*map(_digest, map(event_of, evs)),
                                          *self._at_mark_restored.get(src, ())})]
                            for src, evs in self._at_mark.items()],
                "ended": [[job, ts] for job, ts in self._ended.items()],
                "detector": self.detector.state_dict()}

    def restore(self, snap: dict) -> None:
        self.detector = self._restore_detector(snap["detector"])
        self.order.delay = self._delay
        self.order.wm = -math.inf if snap["wm"] is None else snap["wm"]
        # De-duplication survives the restart: a producer's retry of an event the
        # Detector already has is dropped, even before the replay re-marks its source.
        self._marks = {tuple(src): tuple(pos) if type(pos) is list else pos
                       for src, pos in snap.get("marks", ())}
        for src, pos in self._marks.items():
            if src[0] in ("step", "collective", "comm"):  # its jobs skip probation
                self.limits.track(src[1], pos[0])
        self._ended = OrderedDict((job, ts) for job, ts in snap.get("ended", ()))
        self._at_mark = {}
        self._at_mark_restored = {tuple(src): set(digests)
                                  for src, digests in snap.get("at_mark", ())}
        self._skip_below = snap["o_next"]
        self._skip_ts = self.wm

