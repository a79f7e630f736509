"""Event-time ordering of one home partition.

Events of one partition come from many producers, interleaved by message. Step and
collective events are held in a buffer (one ts-sorted chunk per message) and handed
to the Detector in ``ts`` order once the *watermark* passes them. Each source (see
``WATERMARK_SOURCE``) produces in order, so the watermark is the lowest newest-``ts`` over the
sources: everything at or below it has arrived. The Detector applies device samples
by event time, ``telemetry_delay_s`` behind the steps it judges
(``models.pipeline``), so samples are released that much behind the watermark, and a
telemetry source counts ``telemetry_delay_s`` ahead in the watermark: a step at T
waits only for the samples up to T minus the delay, which a collector sampling once
a second has sent by then. Only the telemetry of the partition's own job hosts
(learned from step events) counts, and a job host whose samples of a kind (gpu, nic,
host) have not shown up yet holds the watermark for up to ``expect_s`` (=
``lateness``) wall seconds: another worker may be routing them a little later (a
rebalance, a backlog), and the root cause must not depend on which worker forwarded
what first. A job whose collectives arrived before any of its step events is held
the same way, so its steps are never rebuilt from collectives alone because the
steps topic was fetched later. In a live stream (the newest events are less than
``lateness`` old), an event that arrived ``jitter_s`` ago no longer waits for quiet
sources. The watermark never moves back, it waits at the start (or after a restore)
until the sources have shown up (``idle_s`` wall seconds or ``lateness`` of event
time), and it stops waiting for a source that fell ``lateness`` behind the median
source and sent nothing for ``lateness`` wall seconds (it left, or its host's clock
is far behind), or, in a live stream, fell 6 x ``lateness`` behind (while a backlog
is read, a source still delivering is never dropped). A partition that received
nothing for ``idle_s`` releases everything it holds, except the samples of hosts the
route placed on the partition that came before any step of their job while a backlog
is read: they wait for the steps (``HOLD_LATENESS`` x ``lateness`` at most), or they
would make them late. An event that arrives behind the watermark (late, or from a host
whose clock is behind) is handed over at once: nothing is dropped for being late, it is
counted.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from heapq import heappop, heappush
from itertools import compress, repeat
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
import orjson

from failslow.models.pipeline import TELEMETRY_KINDS
from failslow.schema.batches import BATCH_KINDS, expand
from failslow.schema.codec import pack
from failslow.streams.rows import column, first_ts, has_absent, max_ts, rows_of, subset

RECOMPUTE_S = 0.1  # s; each recompute scans every source and buffered chunk
# While a backlog is read, the device samples of hosts placed on a partition (the route
# saw their job's ranks here) can arrive long before the job's first step and comm events:
# the consumer reaches the telemetry topics first. Released after ``lateness`` wall
# seconds, they moved the watermark ahead of every step still on its way, which then
# arrived late and out of order (a 16,384-rank job in 32 shards: 344,513 late events, its
# incidents no longer byte-identical to detect's). They wait for the steps up to
# HOLD_LATENESS x ``lateness`` wall seconds and HOLD_MAX_EVENTS buffered events.
HOLD_LATENESS = 6
HOLD_MAX_EVENTS = 1 << 18
# A partition holding more than PACK_ABOVE events (a backlog waiting for a slower topic,
# a large job's shard at its first steps) keeps each further chunk as its JSON bytes, not
# as dicts: a decoded event costs 3-5x its JSON (600-3,200 B for a sample or a comm
# window), and a 131,072-rank job read as a backlog held 3 M of them per worker (6.4 GB,
# issue 16). Packing and unpacking cost about 5 us per event, only where the buffer is
# that large (live: LIVE_PACK_ABOVE). The events come back equal (orjson round-trips
# floats exactly), so what the Detector sees does not change.
PACK_ABOVE = 20_000
# A live stream's buffer is released within a second or two: there packing only cost
# time (issue 31: a partition judging 4,096 ranks held up to 87,000 rows live, and the
# shards of a 16,384-rank job packed 97 % of their chunks to read them back a second
# later, ~100 us a judged rank-step, a tenth of the worker's). Live, chunks are packed only past LIVE_PACK_ABOVE.
LIVE_PACK_ABOVE = 1 << 18
OFFSET_WINDOW_S = 60.0  # s; a host's clock offset is read over the last one to two of these
_EV_TS = itemgetter("ts")
_HOST_OF = itemgetter(1)  # a telemetry watermark source's host: (kind, host)
# Release order: by ts, and at equal ts by kind. A rank's comm window that closes a step
# has the step event's ts, and the two come from different topics in either order; the
# window goes first ("comm" < "step"), as its producer and the simulator write them.
_EV_TS_KIND = itemgetter("ts", "kind")


def _first_ts_kind(ev: dict) -> tuple[float, str]:
    return first_ts(ev), ev["kind"]


class _Chunk(NamedTuple):
    """Events of one message held in the buffer, ordered in the heap by ``first``
    (then ``seq``: arrival order). ``shift`` is -telemetry_delay_s for device samples
    (released that much behind the steps), else 0; ``first`` and ``last`` include it."""

    first: float            # ts of the first event - shift
    seq: int                # arrival order, unique: ties never compare the events
    last: float             # ts of the last event - shift
    offset: int             # Kafka offset of the message
    events: list[dict] | bytes  # sorted by ts; bytes: packed (orjson), see PACK_ABOVE
    arrived: float          # wall time it arrived
    shift: float

# kind -> source id getter (C itemgetters: this runs for every event). A source id starts
# with the kind, so ids of different kinds never meet.
SOURCE_FIELDS = {
    "step": ("job_id", "rank"),
    "collective": ("job_id", "group", "rank"),
    "comm": ("job_id", "rank"),
    "gpu": ("host", "gpu"),
    "nic": ("host", "nic", "port"),
    "host": ("host",),
}
SOURCE = {kind: itemgetter("kind", *fields) for kind, fields in SOURCE_FIELDS.items()}
# The watermark's telemetry sources: one per (kind, host), not per device. A host's agent
# publishes its samples in time order and at least one of each kind every cycle, but a
# device only when it changed or its heartbeat is due (collectors.samplers.OnChange): a
# quiet GPU's newest sample can be seconds old while its host is current, and keyed per
# device it would hold the watermark (live for ``jitter_s``, for longer in a backlog).
WATERMARK_FIELDS = {**SOURCE_FIELDS, "gpu": ("host",), "nic": ("host",)}
WATERMARK_SOURCE = {kind: itemgetter("kind", *fields)
                    for kind, fields in WATERMARK_FIELDS.items()}


class EventOrder:
    """The buffer and watermark of one home partition.

    ``lateness`` (event-time s): the most the watermark trails the median host.
    ``idle_s`` (wall s): silence after which the partition stops holding events.
    ``expect_s`` (wall s): how long a job host's missing telemetry kind holds the watermark
    (default: ``lateness``; another worker may start forwarding it only after joining).
    ``jitter_s`` (wall s): in a live stream, how long an event waits for the stragglers of
    other sources; 0 turns this off (the watermark then waits for every source).
    ``delay`` (event-time s): how far the Detector's device samples trail its steps.
    ``counts``: the partition's counters; ``late`` and ``replay_skipped`` are kept here
    (``events`` is not: ``JobPartition.ingest`` counts each event once, before the caps).
    """

    def __init__(self, lateness: float, idle_s: float, expect_s: float | None,
                 jitter_s: float, delay: float, counts: dict[str, int]) -> None:
        self.lateness = lateness
        self.idle_s = idle_s
        self.expect_s = lateness if expect_s is None else expect_s
        self.jitter_s = jitter_s
        self.delay = delay
        self.counts = counts
        self._tel_hw: dict[tuple, float] = {}   # telemetry source -> newest ts that arrived
        self._job_hosts: dict[str, float] = {}  # host of a job here -> newest step ts from it
        # (kind, host) whose samples arrived, and ("step", job) whose step events arrived
        self._arrived: set[tuple[str, str]] = set()
        self._coll_jobs: set[str] = set()  # jobs whose collective events arrived
        self._expect: dict[tuple[str, str], float] = {}  # (kind, host) awaited since (wall s)
        self._unsent: set[tuple[str, str]] = set()       # (kind, host) that never came
        self._awaiting = False      # some (kind, host) is awaited
        self._tel_bound = math.inf  # steps up to here have the samples they need
        # ``_telemetry_bound``'s view of the job hosts and telemetry sources, rebuilt when
        # either's keys may have changed (``_dirty``): which sources are a job host's, the
        # hosts in order, each such source's host's place among them
        self._bound_keys: tuple[np.ndarray, bool, list[str], np.ndarray] | None = None
        # job host -> least (arrival wall time - ts) of its step events, in this window and
        # the previous one (``OFFSET_WINDOW_S``): its clock's offset plus the fastest delivery
        self._step_lag: dict[str, float] = {}
        self._step_lag_prev: dict[str, float] = {}
        self._lag_wall = -math.inf
        self._dirty = True          # a new job host or telemetry source: recompute the two
        self.wm = -math.inf
        # A heap of chunks, oldest first. Releasing takes only the chunks it releases
        # from, so a large buffer (a backlog waiting for a slower topic) costs nothing per
        # watermark move.
        self._buf: list[_Chunk] = []
        self._seq = 0
        self.buffered = 0  # events in _buf
        self._wm_wall = -math.inf
        self._hw: dict[tuple, float] = {}  # step / collective source -> newest ts that arrived
        self._hw_top = -math.inf  # the newest of them (``_live``; recomputed when one is dropped)
        self._seen: dict[tuple, float] = {}  # source -> wall time of its latest arrival
        # wall time of the latest arrival per (kind, job) of step / comm / collective
        # sources, and per telemetry kind: the topic a source comes on still delivers
        self._topic_seen: dict[str | tuple, float] = {}
        self._ref = -math.inf  # median of the sources' newest ts (event-time "now")
        self._ref_wall = -math.inf
        self._last_wall = 0.0
        self._first_wall: float | None = None
        self._settling = True
        # wall time the first sample of a placed host arrived while no step, comm or
        # collective had (the samples then wait for the steps, HOLD_LATENESS)
        self._held_since: float | None = None

    def add(self, events: list[dict], offset: int, now: float, skip_ts: float,
            placed: bool = False) -> list[dict]:
        """Take the valid events of the message at ``offset``; return those that are late
        (behind the watermark: the caller hands them over at once). Events up to ``skip_ts``
        (a replay below the snapshot's offsets) are already in the Detector's state: they
        only tell which sources exist and how far they got. ``placed``: device samples
        of a host the route placed on this partition (its job's steps will come here)."""
        self._last_wall = now
        if self._first_wall is None:
            self._first_wall = now
        if (placed and self._held_since is None and not self._hw and events
                and max_ts(events[-1]) < now - self.lateness):
            self._held_since = now      # a backlog's samples (live ones are newer)
        late: list[dict] = []
        keep: list[dict] = []
        samples: list[dict] = []
        wm = self.wm
        delay = self.delay
        hw = self._hw
        tel_hw = self._tel_hw
        step_lag = self._step_lag
        job_hosts = self._job_hosts
        coll_jobs, arrived = self._coll_jobs, self._arrived
        seen = self._seen
        topic_seen = self._topic_seen
        source = WATERMARK_SOURCE
        batched = False
        for ev in events:
            kind = ev["kind"]
            if kind in BATCH_KINDS:
                # issue 31: a host's batch kept whole, its rows' sources from its columns
                batched = True
                late += self._add_batch(ev, offset, now, skip_ts, placed, keep, samples)
                continue
            ts = ev["ts"]
            src = source[kind](ev)
            seen[src] = now
            if kind in TELEMETRY_KINDS:
                topic_seen[kind] = now
                last = tel_hw.get(src)
                if last is None or ts > last:
                    tel_hw[src] = ts
                    if last is None:           # a new source: the bound must include it now
                        arrived.add((kind, ev["host"]))
                        self._dirty = True
                # A step judged at T needs the samples up to T - delay: they go to the
                # Detector ``delay`` behind the steps and wait here until then (here they
                # are rebuilt by a replay; in the Detector they would be in every snapshot).
                if ts + delay <= skip_ts:
                    self.counts["replay_skipped"] += 1
                elif ts + delay <= wm:
                    late.append(ev)
                else:
                    samples.append(ev)
                continue
            topic_seen[src[:2]] = now
            if ts > hw.get(src, -math.inf):
                hw[src] = ts
                if ts > self._hw_top:
                    self._hw_top = ts
            if kind == "step":
                if now - ts < step_lag.get(ev["host"], math.inf):
                    step_lag[ev["host"]] = now - ts
                last = job_hosts.get(ev["host"])
                if last is None or ts > last:
                    job_hosts[ev["host"]] = ts
                    if last is None:           # a new job host: await its telemetry now
                        self._dirty = True
                got = ("step", ev["job_id"])
                if got not in arrived:
                    arrived.add(got)
                    self._dirty = True
            elif ev["job_id"] not in coll_jobs:
                # A job's collectives came first: await its step events (another worker
                # may route them a little later), or the Detector would build the
                # job's steps from its collectives alone.
                coll_jobs.add(ev["job_id"])
                self._dirty = True
            if ts <= skip_ts:
                self.counts["replay_skipped"] += 1
            elif ts <= wm:
                late.append(ev)
                self.counts["late"] += 1
            else:
                keep.append(ev)
        packs = self.buffered >= PACK_ABOVE and (self.buffered >= LIVE_PACK_ABOVE
                                                 or not self._live(now))
        for chunk, shift in ((keep, 0.0), (samples, -delay)):
            if chunk:
                # a batch is placed at its first row's ts, as `failslow detect` places it
                chunk.sort(key=first_ts if batched else _EV_TS)
                self._seq += 1
                first = first_ts(chunk[0]) - shift
                # a live stream's watermark goes to the newest row that waited (``_progress``)
                last = (max(map(max_ts, chunk)) if batched else chunk[-1]["ts"]) - shift
                heappush(self._buf, _Chunk(first, self._seq, last, offset,
                                           pack(chunk) if packs else chunk, now, shift))
                self.buffered += rows_of(chunk) if batched else len(chunk)
        return late

    def _add_batch(self, ev: dict, offset: int, now: float, skip_ts: float, placed: bool,
                   keep: list[dict], samples: list[dict]) -> list[dict]:
        """``add``'s work for one batch: its rows' sources marked from its columns, the
        batch put whole into ``keep`` (job kinds) or ``samples`` (telemetry), or cut
        where its rows fall on both sides of the watermark or of ``skip_ts``; returns
        what is late."""
        bk = BATCH_KINDS[ev["kind"]]
        rk = bk.row_kind
        n = len(ev[bk.row_key])
        fields = WATERMARK_FIELDS[rk]
        if has_absent(ev, (*fields, "ts", "host")):
            return self.add(expand(ev), offset, now, skip_ts, placed)
        ts = column(ev, "ts", n)
        srcs = list(zip([rk] * n, *(column(ev, f, n) for f in fields), strict=True))
        self._seen.update(dict.fromkeys(srcs, now))
        if rk in TELEMETRY_KINDS:
            self._topic_seen[rk] = now
            tel_hw = self._tel_hw
            host = ev.get("host")
            if type(host) is str and fields == ("host",):
                # issue 31: one host's samples are one watermark source: its newest row
                # at once (the same high-water mark, and arrival, as row by row)
                marks: Iterable[tuple[Any, float, Any]] = ((srcs[0], max(ts), host),)
            else:
                marks = zip(srcs, ts, column(ev, "host", n), strict=True)
            for src, t, host in marks:
                last = tel_hw.get(src)
                if last is None or t > last:
                    tel_hw[src] = t
                    if last is None:
                        self._arrived.add((rk, host))
                        self._dirty = True
            return self._place(ev, ts, self.delay, skip_ts, samples, False)
        hw, topic_seen = self._hw, self._topic_seen
        if n:
            self._hw_top = max(self._hw_top, max(ts))
        jobs = column(ev, "job_id", n)
        # a source's kind and job: its topic still delivers (``_drop_stalled``)
        job_set = set(jobs)
        topic_seen.update(dict.fromkeys([(rk, job) for job in job_set], now))
        if rk != "step":
            # issue 31: one pass over the rows of a comm / collective batch, the rest per job
            get = hw.get
            for src, t in zip(srcs, ts, strict=True):
                if t > get(src, -math.inf):
                    hw[src] = t
            for job in job_set.difference(self._coll_jobs):
                self._coll_jobs.add(job)
                self._dirty = True
            return self._place(ev, ts, 0.0, skip_ts, keep, True)
        hosts = column(ev, "host", n)
        for src, t, job, host in zip(srcs, ts, jobs, hosts, strict=True):
            if t > hw.get(src, -math.inf):
                hw[src] = t
            if now - t < self._step_lag.get(host, math.inf):
                self._step_lag[host] = now - t
            last = self._job_hosts.get(host)
            if last is None or t > last:
                self._job_hosts[host] = t
                if last is None:
                    self._dirty = True
            if ("step", job) not in self._arrived:
                self._arrived.add(("step", job))
                self._dirty = True
        return self._place(ev, ts, 0.0, skip_ts, keep, True)

    def _place(self, ev: dict, ts: list[float], delay: float, skip_ts: float,
               keep: list[dict], count_late: bool) -> list[dict]:
        """A batch's rows (ts + ``delay``) by where they fall: up to ``skip_ts`` skipped
        (a replay), up to the watermark late (returned), the rest into ``keep``; the
        batch whole when all fall in one, else cut."""
        wm = self.wm

        def where(t: float) -> int:
            t += delay
            return 0 if t <= skip_ts else 1 if t <= wm else 2

        lo, hi = where(min(ts)), where(max(ts))
        if BATCH_KINDS[ev["kind"]].at_last:
            # A batch placed at its newest row (a host's step ends) is released whole at
            # that row's ts: its older rows were not handed on before it, so a replay
            # must not skip them below the snapshot's watermark (they would be lost).
            lo = hi
        if lo == hi:
            parts = {lo: [ev]}
        else:
            idxs: dict[int, list[int]] = {}
            for i, t in enumerate(ts):
                idxs.setdefault(where(t), []).append(i)
            parts = {w: subset(ev, ix) for w, ix in idxs.items()}
        late: list[dict] = []
        for w, got in parts.items():
            if w == 0:
                self.counts["replay_skipped"] += rows_of(got)
            elif w == 1:
                late += got
                if count_late:
                    self.counts["late"] += rows_of(got)
            else:
                keep += got
        return late

    def runs_on(self, host: str) -> bool:
        """True when a job of this partition has sent step events from ``host``."""
        return host in self._job_hosts

    def pause(self, seconds: float) -> None:
        """The worker could not process for ``seconds`` (taking over a partition, a
        rebalance): move the wall-clock marks on, so the pause does not look like idle input."""
        self._last_wall += seconds
        if self._first_wall is not None:
            self._first_wall += seconds
        self._seen = {s: t + seconds for s, t in self._seen.items()}
        self._topic_seen = {k: t + seconds for k, t in self._topic_seen.items()}

    def tick(self, now: float, busy: bool = False) -> list[dict]:
        """Called periodically: what idle sources / an idle partition no longer hold.
        ``busy``: the worker received messages for other partitions in the last
        ``idle_s``. While a backlog is read (the newest step is more than ``lateness``
        old), a partition of a busy worker may be silent only because its messages wait
        behind the others' (one agent takes them in turn): releasing everything then made
        the rest of its steps late (a 16,384-rank job in 32 shards). There its silence
        must last HOLD_LATENESS x ``lateness``, or until the worker is idle too."""
        quiet = now - self._last_wall
        return self.advance(now, force=quiet >= self.idle_s and not self._holding(now)
                            and (not busy or self._live(now)
                                 or quiet >= HOLD_LATENESS * self.lateness))

    def _holding(self, now: float) -> bool:
        """True while placed hosts' samples wait for their job's first steps: no step,
        comm or collective source yet, samples of a backlog (more than ``lateness`` old
        when they arrived; live samples are released as before: the steps they explain
        are newer), for HOLD_LATENESS x ``lateness`` wall seconds since the first such
        sample and HOLD_MAX_EVENTS buffered events at most."""
        since = self._held_since
        return (since is not None and not self._hw
                and now - since < HOLD_LATENESS * self.lateness
                and self.buffered < HOLD_MAX_EVENTS)

    # -- ordering ------------------------------------------------------------------------

    def _progress(self, now: float) -> float:
        """The watermark the sources' progress allows now (event-time s)."""
        hw = self._hw
        if not hw:
            # Only device samples so far (hosts whose jobs live elsewhere, or whose steps
            # have not reached this partition yet): release those that waited ``lateness``
            # wall seconds for a job's steps, so samples of hosts without a job here do not
            # pile up. Sooner would be wrong while a backlog is read: the steps they explain
            # may still be on their way, and the Detector must not see samples far ahead
            # of them; placed hosts' samples wait longer there (``_holding``).
            if self._holding(now):
                return self.wm
            waited = [c.last for c in self._buf if now - c.arrived >= self.lateness]
            return max(waited) if waited else -math.inf
        if self._settling:
            # Starting (or restored): let every source show up before anything is released,
            # or the first to arrive would make all the others late.
            first = now if self._first_wall is None else self._first_wall
            if (now - first < self.idle_s
                    and max(hw.values()) - min(hw.values()) < self.lateness):
                return self.wm
            self._settling = False
        if now - self._ref_wall >= 0.5 or self._ref == -math.inf:
            # Every half second: the median over every source, samples counted
            # ``telemetry_delay_s`` ahead (while a backlog is consumed one topic can run far
            # ahead of another, and a source that is behind and still delivering must keep
            # holding the watermark), stalled sources, awaited telemetry, and the bound the
            # job hosts' telemetry puts on the steps (samples arrive once a second or so).
            tel = self._tel_hw
            pos = np.fromiter(hw.values(), float, len(hw))
            if tel:
                pos = np.concatenate((pos, np.fromiter(tel.values(), float, len(tel))
                                      + self.delay))
            self._ref = float(np.median(pos))
            self._ref_wall = now
            self._drop_stalled(now)
            hw = self._hw
            self._dirty = True
        live = self.jitter_s > 0 and self._live(now)
        dirty = self._dirty
        if dirty or live:
            # A live stream refreshes the bound at every recompute (it holds the steps
            # that long); a backlog only when a source or job host is new, or every 0.5 s.
            if dirty:
                self._awaiting = self._awaited(now)
            self._dirty = False
            self._tel_bound = self._telemetry_bound(now, live, dirty)
        if self._awaiting:
            return self.wm
        wm = min(hw.values()) if hw else self._ref
        bound = self._tel_bound
        if live:
            # Live (the newest events are seconds old, not a backlog): a source that is
            # quiet (a pipeline bubble, a data-parallel group between two all-reduces, a
            # rank that ended its step early) is idle, not behind; waiting for its next event
            # would hold everything for up to a step. Events that arrived ``jitter_s`` ago
            # have waited long enough for the other sources' stragglers.
            ready = [c.last for c in self._buf if not c.shift and now - c.arrived >= self.jitter_s]
            if ready:
                wm = max(wm, min(max(ready), bound))
        return min(wm, bound)

    def _telemetry_bound(self, now: float, live: bool, keys_changed: bool = True) -> float:
        """Steps up to this ts have the device samples they need: the job hosts' oldest
        newest sample, plus the delay. In a live stream a host whose clock is behind
        would hold every step by its offset (its newest sample is always that old): its
        samples count that much later. The offset is how much later than the median host
        its step events arrive, at best (over the last one to two ``OFFSET_WINDOW_S``,
        so a corrected clock is followed). The steps come from the training job, the
        samples from the collector: a host whose samples merely arrive late still holds
        the steps."""
        # issue 31: in arrays (this ran at every recompute of a live stream, in Python
        # over every job host and telemetry source); the same floats, the same minimum.
        # Which sources are a job host's, and where their host is in ``names``, change
        # only with the keys of the two dicts: a source or job host is added (``_dirty``
        # is set then) or dropped (``_drop_stalled``, which sets it): reused otherwise,
        # the values read in the same (insertion) order
        hosts, tel_hw = self._job_hosts, self._tel_hw
        keys = self._bound_keys
        if (keys_changed or keys is None or len(keys[0]) != len(tel_hw)
                or len(keys[2]) != len(hosts)):
            of = list(map(_HOST_OF, tel_hw))      # a telemetry source's host
            here = np.fromiter(map(hosts.__contains__, of), bool, len(of))
            names = list(hosts)
            index = dict(zip(names, range(len(names)), strict=True))
            at = np.fromiter(map(index.__getitem__, compress(of, here)), np.intp)
            keys = self._bound_keys = (here, bool(here.any()), names, at)
        here, any_here, names, at = keys
        if not any_here:
            return math.inf
        tel = np.fromiter(tel_hw.values(), float, len(here))[here]
        if not live:
            return float(tel.min()) + self.delay
        if now - self._lag_wall >= OFFSET_WINDOW_S:
            self._step_lag_prev, self._step_lag, self._lag_wall = self._step_lag, {}, now
        cur, prev = self._step_lag, self._step_lag_prev
        inf = repeat(math.inf)
        lag = np.minimum(np.fromiter(map(cur.get, names, inf), float, len(names)),
                         np.fromiter(map(prev.get, names, inf), float, len(names)))
        known = lag < math.inf
        usual = float(np.median(lag[known])) if known.any() else 0.0
        behind = np.where(known, np.maximum(lag - usual, 0.0), 0.0)
        return float((tel + behind[at]).min()) + self.delay

    def _live(self, now: float) -> bool:
        """True when the newest step or collective is less than ``lateness`` old (wall
        clock): a live stream, not a backlog being read."""
        return bool(self._hw) and now - self._hw_top < self.lateness

    def _awaited(self, now: float) -> bool:
        """True while a job host has not sent a telemetry kind yet, or a job whose
        collectives arrived has sent no step event yet (for at most ``expect_s`` wall
        seconds each: a host without that collector, a job whose hook sends no steps, is
        then not awaited)."""
        expect, have, unsent = self._expect, self._arrived, self._unsent
        wanted = [(k, h) for h in self._job_hosts for k in TELEMETRY_KINDS]
        wanted += [("step", j) for j in self._coll_jobs]
        for kh in wanted:
            if kh not in have and kh not in unsent and kh not in expect:
                expect[kh] = now
        for kh, since in list(expect.items()):
            if kh in have:
                del expect[kh]
            elif now - since > self.expect_s:
                del expect[kh]
                unsent.add(kh)
        return bool(expect)

    def _drop_stalled(self, now: float) -> None:
        """Stop waiting for sources that fell ``lateness`` behind the median and sent nothing
        for ``lateness`` wall seconds while its topic delivered other sources' events for
        ``lateness`` more (a source that is behind but still delivering, or whose topic
        the consumer reaches later while catching up on a backlog, keeps holding the
        watermark: a busy worker reading a backlog can leave a whole topic unread for
        longer than ``lateness``, and dropping its sources then made the rest of their
        events late). In a live stream, also for sources that fell 6 x
        ``lateness`` behind (a host whose clock is that far behind), and forget job hosts
        whose steps stopped that long ago (the job ended or moved). Not while a backlog
        is read: there a source can be minutes of event time behind the others only
        because its partition is fetched later, and dropping it would judge steps
        without its samples."""
        floor, hard = self._ref - self.lateness, self._ref - 6 * self.lateness
        if not self._live(now):
            hard = -math.inf
        seen, topic_seen, lateness = self._seen, self._topic_seen, self.lateness
        dropped = 0
        for hw, shift in ((self._hw, 0.0), (self._tel_hw, self.delay)):
            gone = [s for s, t in hw.items()
                    if t + shift < hard or (
                        t + shift < floor and now - seen[s] > lateness
                        and topic_seen.get(s[0] if s[0] in TELEMETRY_KINDS else s[:2], now)
                        - seen[s] > lateness)]
            for s in gone:
                del hw[s], seen[s]
            dropped += len(gone)
        if dropped:
            self._hw_top = max(self._hw.values(), default=-math.inf)
        hosts = len(self._job_hosts)
        self._job_hosts = {h: t for h, t in self._job_hosts.items() if t >= hard}
        if dropped or len(self._job_hosts) != hosts:
            self._forget_gone()

    def _forget_gone(self) -> None:
        """Forget what arrived (or never came) from jobs none of whose step / collective
        sources is left and from telemetry sources that were dropped on hosts no job here
        runs on (issue 17: these sets grew with every job and host the partition ever saw).
        A job or host that comes back is new again: its first event adds it, as at first."""
        jobs = {src[1] for src in self._hw}
        hosts, tel = self._job_hosts, self._tel_hw

        def known(kh: tuple[str, str]) -> bool:
            return kh[1] in jobs if kh[0] == "step" else (kh[1] in hosts or kh in tel)

        self._arrived = {kh for kh in self._arrived if known(kh)}
        self._topic_seen = {k: t for k, t in self._topic_seen.items()
                            if isinstance(k, str) or k[1] in jobs}
        self._unsent = {kh for kh in self._unsent if known(kh)}
        self._coll_jobs = {j for j in self._coll_jobs if j in jobs}

    def advance(self, now: float, force: bool = False) -> list[dict]:
        """The events the watermark releases now, in ts order (``force``: all of them)."""
        # The watermark is recomputed at most every ``RECOMPUTE_S`` of wall time: a lower
        # watermark only holds events a little longer, it never reorders them.
        if not self._buf or (not force and now - self._wm_wall < RECOMPUTE_S):
            return []
        self._wm_wall = now
        buf = self._buf
        new = max(c.last for c in buf) if force else self._progress(now)
        if new <= self.wm:
            return []
        self.wm = new
        ready: list[dict] = []
        while buf and buf[0].first <= new:
            c = heappop(buf)
            events: list[dict] = (orjson.loads(c.events) if isinstance(c.events, bytes)
                                  else c.events)
            cut = len(events) if c.last <= new else bisect_right(events, new + c.shift,
                                                                 key=first_ts)
            if cut == len(events):   # (a batch's later rows may be newer than ``new``)
                ready.extend(events)
            else:
                ready.extend(events[:cut])
                heappush(buf, c._replace(first=first_ts(events[cut]) - c.shift,
                                         events=events[cut:]))
        if list in map(type, map(_EV_TS, ready)):
            # batches among them, at their first row's ts
            self.buffered -= rows_of(ready)
            ready.sort(key=_first_ts_kind)
            return ready
        self.buffered -= rows_of(ready)
        ready.sort(key=_EV_TS_KIND)  # a merge of sorted runs for timsort
        return ready

    def o_min(self, default: int) -> int:
        """The oldest offset still holding an unreleased event (``default`` if none)."""
        return min((c.offset for c in self._buf), default=default)
