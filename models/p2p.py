"""Point-to-point links between pipeline stages, judged as rank pairs.

A pipeline's ``send`` / ``recv`` traffic is judged per unordered rank pair ``(a, b)``
taken from the op's rank and ``peer``, whatever the communicator is called or how
large it is: a Megatron-style pipeline group (all stages of one data/tensor slot, group
size = the pipeline depth), a two-member ``pp{a}-{b}`` channel or NCCL's own p2p
communicator all give the same pairs. No data-parallel group needs to span the pair.

Evidence per pair and step, from durations only (no cross-host clock): the shortest
op, in seconds per byte. Each side of a transfer blocks from the moment it posted its
half until the data has moved; the side that posted last waits for nobody, so its
duration is the transfer itself, and the shortest op of a step is the one least
inflated by waiting for the other stage. A stage that computes slower (a slow GPU, a
last stage heavier by design) only makes its neighbours wait longer: their ops grow,
the shortest does not. A slower link makes every op of the pair longer, the shortest
too. The same number comes from both grains: ``collective`` events (each op's
``duration_s`` over its ``bytes``) and ``comm`` windows (each entry's ``min_s`` over its
bytes per op).

A pair's cost is compared with

- its own past (a rolling median that never learns a step of a suspected fault),
  normalized by the same ratio of the other pairs (a change of the whole network, or
  a new phase with other message sizes, is nobody's link fault); the full z counts
  from ``min_rel`` up;
- the other cross-host pairs that move ops of the same size, from the first step on
  (no past needed); the full z counts only from ``far_rel`` up (paths differ a little
  by design: rails, switches).

and confirmed by the capped CUSUM of z-scores the ranks use (``models.cusum``): a
one-step spike never confirms, a large slowdown in two steps. Pairs inside one host
(NVLink) are not judged. Slow pairs that all touch one host, and most of that host's
pairs, are that host's NICs (``slow_link:HOST``); otherwise each slow pair is named
(``slow_link:rA-rB``, both ranks and both hosts). The job's cost comes from measured
step durations (``Attribution``'s rule): the job's step time since the onset over its
step time before, bounded by the pair's own extra transfer time.

Inside a long step (``comm`` windows, one a second): the same shortest op per byte,
window by window (``add_comm``). Each side reports its half of a window; an
*observation* of a direction is the smaller of the two sides' costs over windows that
overlap in time (the side that posted last waited for nobody, so a rank that paused
leaves its neighbour's ops long but not its own). An observation is compared with the
latest observations of the other cross-host pairs moving ops of the same size (no past
needed): at least ``far_rel`` slower and ``z_min`` of their spread. A pair whose every
observation stays so for ``sustain_s`` seconds or more (two observations at least) is
confirmed from windows: a ``slow_link`` finding with ``sustained_s`` (the paging policy
weighs it, ``models.policy``) and ``p2p_windows``, kept while its run
lasts and the per-step evidence has not taken it over. One slow observation below the
bar ends the run; pairs slow together that share a rank or a host are left to the
per-step grouping (a host's NICs). Short steps (under 1.5 windows) keep the step rule.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from failslow.models.comm import CommRows, step_runs
from failslow.models.config import JobConfig
from failslow.models.cusum import capped_increment
from failslow.models.findings import Finding
from failslow.models.peers import KeyedValues, lower_half_ref, sorted_lower_half_ref, sorted_update
from failslow.models.stats import RollingMedian, RollingMedians, median

P2P_OPS = frozenset(("send", "recv"))
# ``wkey``: a rank (an i32) plus this fits 32 bits
RANK_OFF = 1 << 31


def wkey(rank: int, peer: int, d: int) -> int:
    """(rank, peer, direction 0/1) as one int: ``P2PMonitor.wrep`` / ``wlast``'s keys."""
    return (rank + RANK_OFF) << 33 | (peer + RANK_OFF) << 1 | d
# ``_quartile_low``'s sorted copy of a size class is taken again once the values set since
# pass 1 / SNAP_STALE of its bound's place (a cache: the bound only skips lower_half_ref)
SNAP_STALE = 8
# Thresholds: ``P2PConfig`` (``[rules.p2p]``: noise_floor, peers_min, size_bucket,
# warm_min), ``CostConfig`` (history_steps, base_steps, base_min_steps) and
# ``SubstepConfig.long_windows`` (a step of at least that many windows is long).


class PairState:
    """Baseline and evidence of one rank pair, as snapshots before version 14 kept them
    (``models.migrate`` turns them into a ``PairTable``; unpickling them needs the class)."""

    __slots__ = ("cost", "cusum", "streak", "onset_ts", "onset_step", "rel", "extra_s",
                 "base_s", "lost_s", "since_s", "since_n", "active", "size")

    def __init__(self, window: int) -> None:
        self.cost = RollingMedian(window)   # its usual seconds per byte
        self.cusum = 0.0
        self.streak = 0
        self.onset_ts = 0.0
        self.onset_step = 0
        self.rel = 0.0                  # excess over its reference, smoothed
        self.extra_s = 0.0              # extra transfer seconds per step, smoothed
        self.base_s = 0.0               # the job's step time before the onset
        self.lost_s = 0.0
        self.since_s = 0.0
        self.since_n = 0
        self.active = False             # a confirmed finding is running
        self.size = 0.0                 # bytes per op, smoothed


class PairTable:
    """Every cross-host rank pair of one job, one row each (``row``: pair -> row, ``keys``:
    the pairs in row order), in arrays (issue 31: one numpy expression per step over all
    pairs, not a Python object and a river median per pair): its usual seconds per byte
    (``cost``, a rolling median), its evidence (the capped CUSUM, the steps it confirmed in
    a row, its onset), its excess over its reference and extra transfer seconds per step
    (smoothed), the job's step time before its onset, the job time lost since, the step
    time summed since (and the steps), whether its confirmed finding runs, bytes per op
    (smoothed)."""

    FLOATS = ("cusum", "onset_ts", "rel", "extra_s", "base_s", "lost_s", "since_s", "size")
    INTS = ("streak", "onset_step", "since_n")

    def __init__(self, window: int) -> None:
        self.row: dict[tuple[int, int], int] = {}
        self.keys: list[tuple[int, int]] = []
        self.cost = RollingMedians(window)
        f, i = np.zeros(0), np.zeros(0, dtype=np.int64)
        self.cusum, self.onset_ts, self.rel, self.extra_s = f, f.copy(), f.copy(), f.copy()
        self.base_s, self.lost_s, self.since_s, self.size = f.copy(), f.copy(), f.copy(), f.copy()
        self.streak, self.onset_step, self.since_n = i, i.copy(), i.copy()
        self.active = np.zeros(0, dtype=bool)

    def __len__(self) -> int:
        return len(self.keys)

    def rows_for(self, pairs: list[tuple[int, int]]) -> np.ndarray:
        """The rows of ``pairs`` (new ones added, empty)."""
        row = self.row
        new = [p for p in pairs if p not in row]
        if new:
            for p in new:
                row[p] = len(self.keys)
                self.keys.append(p)
            n, have = len(self.keys), self.active.size
            if n > have:
                cap = max(n, 2 * have)
                for name in (*self.FLOATS, *self.INTS, "active"):
                    a = getattr(self, name)
                    b = np.zeros(cap, dtype=a.dtype)
                    b[:have] = a
                    setattr(self, name, b)
                self.cost.grow(cap)
        return np.fromiter(map(row.__getitem__, pairs), dtype=np.int64, count=len(pairs))

    def of_pairs(self, pairs: dict[tuple[int, int], PairState],
                 windows: list[np.ndarray | None]) -> None:
        """Take ``pairs`` as snapshots before version 14 kept them (``windows``: each one's
        cost window, oldest first, as river held it; None: out of reach, rebuilt from its
        median and sigma, ``RollingMedians.seed``)."""
        rows = self.rows_for(list(pairs))
        w = self.cost.window
        for i, st, vals in zip(rows.tolist(), pairs.values(), windows, strict=True):
            for name in (*self.FLOATS, *self.INTS, "active"):
                getattr(self, name)[i] = getattr(st, name)
            n = st.cost.n
            if vals is None:
                self.cost.seed(i, n, st.cost.median, st.cost.sigma)
            elif n:
                k = min(n, w)
                self.cost.win[i, [(n - k + j) % w for j in range(k)]] = vals[-k:]
                self.cost.n[i] = n
        self.cost.refresh(rows)


class P2PMonitor:
    """Send/recv evidence of one job, per rank pair; ``evaluate`` once per judged step."""

    # per size class, a lower bound of ``wcls``'s values (``_window``); a class default:
    # a cache, rebuilt after a restore from a snapshot taken before it existed
    _low: dict[float, float] | None = None
    # per size class whose ``_low`` is its smallest value exactly, the key holding it
    # (issue 31: an observation the bound cannot tell then needs no scan of the class);
    # never pickled: after a restore every bound is made exact again when it cannot tell
    _lowkey: dict[float, Any] | None = None
    # per size class, a sorted copy of ``wcls``'s values as they were (``_quartile_low``),
    # and how many values had been set (``_sets``) when it was taken; never pickled
    _snap: dict[float, tuple[KeyedValues, np.ndarray, int]] | None = None
    # per size class: [its KeyedValues, their sorted copy, values set in it since, values
    # replaced or taken out of it since] (``_sorted``); never pickled
    _order: dict[float, list[Any]] | None = None
    _sets = 0
    # (pairs, the hosts, pairs per host) of ``_per_host``; never pickled
    _hosts_seen: tuple[int, dict[int, str], dict[str, int]] | None = None
    # the latest ``CommRows`` and its entries as columns (``_entries``); never pickled
    _cc: tuple[CommRows, Any] | None = None

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.max_age = cfg.p2p.pending_steps
        # step -> pair -> [seconds per byte of the shortest op each way (lower rank sending,
        # higher rank sending), bytes sent, ops]
        self.pending: dict[int, dict[tuple[int, int], list[float]]] = {}
        # step -> the send/recv entries of its windows with a peer, in chunks of columns
        # (``_rows_entries``): lower rank, higher rank, seconds per byte each way, bytes
        # sent, ops (issue 31: added up per pair by ``_step_pairs`` once per step)
        self.pend_rows: dict[int, list[tuple[np.ndarray, ...]]] = {}
        self.table = PairTable(cfg.p2p.cost_window)    # the pairs judged so far
        self.hosts: dict[int, str] = {}
        self.hist: list[tuple[int, float]] = []      # (step, job step time)
        self.clean = RollingMedian(cfg.cost.clean_window)   # job step time, no pair out
        self.members: dict[str, list[tuple[int, int]]] = {}   # finding key -> its slow pairs
        # Sends/recvs that name no peer, on a group of two (an NCCL Inspector tailer): the
        # group's two ranks, and per step the ops waiting for the other rank to be seen.
        self.duo: dict[str, list[int]] = {}
        self.link_pct: dict[str, tuple[float, float]] = {}   # key -> the groups' estimate
        self.last: list[Finding] = []     # the last judged step's findings
        self.orphans: dict[int, list[tuple[str, int, str, float, float, int]]] = {}
        self._init_windows()

    def _init_windows(self) -> None:
        """Per-window evidence (``_window``): the producers' window (learned), each rank's
        step start, each side's latest report per direction, each direction's latest
        observation, and each pair's run of slow observations."""
        self.window_s = 0.0
        self.wstart: dict[int, tuple[int, float]] = {}
        # (rank, its peer, direction) -> (window start, window end, seconds per byte); the
        # key one int, ``wkey(rank, peer, direction)``
        self.wrep: dict[int, tuple[float, float, float]] = {}
        # (pair, direction) -> (seconds per byte, size class); the key ``wkey(*pair, d)``
        self.wlast: dict[int, tuple[float, float]] = {}
        self.wcls: dict[float, KeyedValues] = {}  # wlast's costs by size class
        # pair -> [since ts, since step, observations, rel (max), extra s, z (max), last ts,
        #          emitted (0/1), its slow direction]
        self.wrun: dict[tuple[int, int], list[float]] = {}
        self.world = 0

    # -- ingestion ---------------------------------------------------------------------

    def _take(self, step: int, rank: int, peer: int, op: str, secs: float, nbytes: float,
              n: int) -> None:
        if peer == rank or nbytes <= 0 or n <= 0:
            return
        pair = (rank, peer) if rank < peer else (peer, rank)
        per = self.pending.get(step)
        if per is None:
            per = self.pending[step] = {}
        a = per.get(pair)
        if a is None:
            a = per[pair] = [math.inf, math.inf, 0.0, 0]
        # direction 0: the lower rank sends; each direction's shortest op on its own (a
        # link congested one way slows only the data moving that way)
        d = 0 if (op == "send") == (rank < peer) else 1
        cost = secs / (nbytes / n) if secs > 0 else math.inf
        if cost < a[d]:
            a[d] = cost
        if op == "send":
            a[2] += nbytes
        a[3] += n

    def _orphan(self, step: int, group: str, rank: int, op: str, secs: float, nbytes: float,
                n: int) -> None:
        """An op with no ``peer`` on a group of two: its peer is the group's other rank."""
        ranks = self.duo.get(group)
        if ranks is None:
            ranks = self.duo[group] = []
        if rank not in ranks and len(ranks) < 2:
            ranks.append(rank)
        if len(ranks) == 2 and rank in ranks:
            self._take(step, rank, ranks[0] + ranks[1] - rank, op, secs, nbytes, n)
        else:
            self.orphans.setdefault(step, []).append((group, rank, op, secs, nbytes, n))

    def add_collective(self, ev: dict[str, Any], step: int) -> None:
        """A ``send`` / ``recv`` collective event of a rank (``step``: the step it is in)."""
        peer = ev.get("peer")
        self.hosts[ev["rank"]] = ev["host"]
        if peer is not None:
            self._take(step, ev["rank"], int(peer), ev["op"], ev["duration_s"], ev["bytes"], 1)
        elif ev["group_size"] == 2:
            self._orphan(step, ev["group"], ev["rank"], ev["op"], ev["duration_s"], ev["bytes"],
                         1)

    def add_comm(self, ev: dict[str, Any], step: int) -> bool:
        """The ``send`` / ``recv`` entries of a ``comm`` window (with a ``peer``, or on a
        group of two). True when a pair was just confirmed from windows inside a long
        step (its finding is then in ``last``: judge it now)."""
        return bool(self.add_rows(CommRows.of_events([ev]), [step], 0, 1))

    def add_rows(self, c: CommRows, steps: list[int], lo: int, hi: int, stop: bool = False
                 ) -> list[int]:
        """Rows ``lo:hi`` of ``c`` (``steps[i]``: row i's step) in order, each as
        ``add_comm`` takes one; the rows where a pair was confirmed. ``stop``: return after
        the first such row (the caller judges it before the rest). A run of batches
        (``c.seg``) has its send/recv entries taken as columns, once for all its rows
        (``_entries``), and added to their steps' ``pend_rows`` in chunks; rows of events,
        or with an op that names no peer, one by one (``_add_rows_each``)."""
        got = self._entries(c) if c.seg is not None else None
        if got is None:
            return self._add_rows_each(c, steps, lo, hi, stop)
        seen, starts, cols = got
        ranks, tss, w0s, ends = c.rank, c.ts, c.w0, c.end
        mid: float | None = None      # the job's recent step time, for ``_window``
        ask = True
        done = []
        wstart = self.wstart
        alpha = self.cfg.p2p.window_alpha
        lw = self.cfg.substep.long_windows
        end = hi
        # the producers' window, learned row by row (``_window`` does not read it: kept
        # here, set once the rows are taken)
        wn = self.window_s
        hosts, host_of = self.hosts, c.host
        for i in range(lo, hi):
            rank = ranks[i]
            step = steps[i]
            # the producers' window (learned) and the rank's step start
            ts, w0 = float(tss[i]), float(w0s[i])
            st = wstart.get(rank)
            new_st = st is None or st[0] != step
            if new_st:
                wstart[rank] = (step, w0)
            if not ends[i] and ts > w0:
                wn = ts - w0 if not wn else (1.0 - alpha) * wn + alpha * (ts - w0)
            if seen[i]:
                hosts[rank] = host_of[i]
                if ask:       # the median of the last mid_steps (5), once per call
                    recent = sorted(d for _, d in self.hist[-self.cfg.p2p.mid_steps:])
                    mid = recent[len(recent) // 2] if recent else None
                    ask = False
                long_s = lw * (wn or 1.0)
                elapsed = ts - (w0 if st is None or new_st else st[1])
                # inside a long step (a short one: ``_window`` would stop at its first test)
                if not (elapsed < long_s and (mid is None or mid < long_s)) \
                        and self._window(c, i, step):
                    done.append(i)
                    if stop:
                        end = i + 1
                        break
        self.window_s = wn
        # the rows' entries to their steps (read by ``evaluate`` only, nothing above)
        for a, b in step_runs(steps, lo, end):
            e0, e1 = starts[a], starts[b]
            if e0 < e1:
                step = steps[a]
                got_step = self.pend_rows.get(step)
                if got_step is None:
                    got_step = self.pend_rows[step] = []
                got_step.append(tuple(col[e0:e1] for col in cols))
        return done

    def _entries(self, c: CommRows) -> tuple[list[bool], list[int], tuple[np.ndarray, ...]] | None:
        """The send/recv entries of ``c`` as ``add_rows`` adds them up (``_take``'s rule), made
        once per ``c`` (cached while it is the latest): per row, whether it has one with a
        peer, and where its kept ones start; the kept entries as columns (lower rank, higher
        rank, seconds per byte each way (infinity the other way), bytes sent, ops). None
        when one names no peer (a group of two's, ``_orphan``) or a column is not numbers."""
        cc = self._cc
        if cc is not None and cc[0] is c:
            return cc[1]
        got = self._entries_of(c)
        self._cc = (c, got)
        return got

    @staticmethod
    def _entries_of(c: CommRows) -> tuple[list[bool], list[int], tuple[np.ndarray, ...]] | None:
        ops = c.op
        rows = c.n
        isp = np.fromiter(map(P2P_OPS.__contains__, ops), dtype=bool, count=len(ops))
        js = np.flatnonzero(isp)
        if not js.size:
            empty = np.zeros(0)
            return [False] * rows, [0] * (rows + 1), (empty.astype(np.int64),
                                                      empty.astype(np.int64), empty, empty,
                                                      empty, empty)
        jl = js.tolist()
        peers = list(map(c.peer.__getitem__, jl))
        if None in peers:
            return None
        at = c.at
        width = at[1] - at[0]
        if width and at == list(range(0, at[-1] + 1, width)):
            erow = js // width          # every row the same entries (most batches)
        else:
            erow = np.searchsorted(np.array(at), js, side="right") - 1
        seen = np.zeros(rows, dtype=bool)
        seen[erow] = True
        k = js.size
        try:
            rank = np.array(c.rank, dtype=np.int64)[erow]
            peer = np.array(peers)
            nb, n, secs = (np.fromiter(map(col.__getitem__, jl), dtype=np.float64, count=k)
                           for col in (c.nbytes, c.cnt, c.min_s))
        except (TypeError, ValueError):
            return None
        if peer.dtype.kind not in "iuf":
            return None
        peer = peer.astype(np.int64)
        send = np.fromiter(map("send".__eq__, map(ops.__getitem__, jl)), dtype=bool, count=k)
        # ``_take``: an entry with its own rank as peer, no bytes or no ops is left out
        keep = (peer != rank) & ~(nb <= 0) & ~(n <= 0)
        if not keep.all():
            erow, rank, peer, nb, n, secs, send = (
                x[keep] for x in (erow, rank, peer, nb, n, secs, send))
        # seconds per byte (``secs / (nb / n)``: the same IEEE operations; infinity for an
        # op that took no measurable time), direction 0: the lower rank sends
        timed = secs > 0
        cost = np.divide(secs, nb / n, out=np.full(secs.size, math.inf), where=timed)
        d0 = send == (rank < peer)
        inf = np.full(cost.size, math.inf)
        cols = (np.minimum(rank, peer), np.maximum(rank, peer), np.where(d0, cost, inf),
                np.where(d0, inf, cost), np.where(send, nb, 0.0), n)
        starts = np.searchsorted(erow, np.arange(rows + 1)).tolist()
        return seen.tolist(), starts, cols

    def _add_rows_each(self, c: CommRows, steps: list[int], lo: int, hi: int,
                       stop: bool = False) -> list[int]:
        """``add_rows``, row by row (its send/recv entries into ``pending``)."""
        at, ranks, ops, peers, sizes = c.at, c.rank, c.op, c.peer, c.size
        min_s, nbytes, cnt, tss, w0s, ends = c.min_s, c.nbytes, c.cnt, c.ts, c.w0, c.end
        mid: float | None = None      # the job's recent step time, for ``_window``
        ask = True
        done = []
        pending, wstart = self.pending, self.wstart
        alpha = self.cfg.p2p.window_alpha
        lw = self.cfg.substep.long_windows
        per_step: int | None = None
        per: dict[tuple[int, int], list[float]] = {}
        inf = math.inf
        for i in range(lo, hi):
            rank = ranks[i]
            step = steps[i]
            seen = False
            for j in range(at[i], at[i + 1]):
                op = ops[j]
                if op in P2P_OPS:
                    peer = peers[j]
                    if peer is not None:
                        seen = True
                        # ``_take``, inline (a send/recv entry of nearly every row)
                        peer = int(peer)
                        nb, n = nbytes[j], cnt[j]
                        if peer == rank or nb <= 0 or n <= 0:
                            continue
                        pair = (rank, peer) if rank < peer else (peer, rank)
                        if per_step != step:
                            got = pending.get(step)
                            if got is None:
                                got = pending[step] = {}
                            per, per_step = got, step
                        a = per.get(pair)
                        if a is None:
                            a = per[pair] = [inf, inf, 0.0, 0]
                        d = 0 if (op == "send") == (rank < peer) else 1
                        secs = min_s[j]
                        cost = secs / (nb / n) if secs > 0 else inf
                        if cost < a[d]:
                            a[d] = cost
                        if op == "send":
                            a[2] += nb
                        a[3] += n
                    elif sizes[j] == 2:
                        seen = True
                        self._orphan(step, c.group[j], rank, op, min_s[j], nbytes[j], cnt[j])
                        per_step = None
            # the producers' window (learned) and the rank's step start
            ts, w0 = float(tss[i]), float(w0s[i])
            st = wstart.get(rank)
            new_st = st is None or st[0] != step
            wn = self.window_s
            if not ends[i] and ts > w0:
                wn = ts - w0 if not wn else (1.0 - alpha) * wn + alpha * (ts - w0)
            if seen:
                self.hosts[rank] = c.host[i]
                if ask:       # the median of the last mid_steps (5), once per call
                    recent = sorted(d for _, d in self.hist[-self.cfg.p2p.mid_steps:])
                    mid = recent[len(recent) // 2] if recent else None
                    ask = False
                w = wn or 1.0
                elapsed = ts - (w0 if st is None or new_st else st[1])
                if not (elapsed < lw * w and (mid is None or mid < lw * w)):
                    # inside a long step: its window and step start learned, ``_window``
                    if new_st:
                        wstart[rank] = (step, w0)
                    self.window_s = wn
                    if self._window(c, i, step):
                        done.append(i)
                        if stop:
                            return done
                    continue
            # a short step (``_window`` would stop at its first test), or no send/recv
            if new_st:
                wstart[rank] = (step, w0)
            self.window_s = wn
        return done

    # -- inside a long step: window by window -------------------------------------------

    def _window(self, c: CommRows, i: int, step: int) -> bool:
        """The send/recv entries of one window inside a long step (row ``i`` of ``c``; the
        caller learned its window and step start) as per-window observations (module
        doc). The common observation (its class known, a bound that tells it is within its
        peers) is taken here; any other by ``_observe``, the rest of an uncertain one by
        ``_judge_obs``."""
        r = c.rank[i]
        if c.world[i]:
            self.world = max(self.world, int(cast(int, c.world[i])))
        hosts = self.hosts
        h = hosts.get(r)
        if h is None:
            return False
        ts, w0 = float(c.ts[i]), float(c.w0[i])
        cfg = self.cfg
        bar = 1.0 + cfg.far_rel
        bucket = cfg.p2p.size_bucket
        ops, cnt, nbytes_, mins, peers = c.op, c.cnt, c.nbytes, c.min_s, c.peer
        wrep, wlast, by_cls, runs = self.wrep, self.wlast, self.wcls, self.wrun
        lows, exact = self._low, self._lowkey
        kr = r + RANK_OFF
        log2 = math.log2
        new = False
        for j in range(c.at[i], c.at[i + 1]):
            op, n, nbytes, min_s = ops[j], cnt[j], nbytes_[j], mins[j]
            if op not in P2P_OPS or n <= 0 or nbytes <= 0 or min_s <= 0:
                continue
            peer = peers[j]
            if peer is None:
                ranks = self.duo.get(c.group[j], ())
                if c.size[j] != 2 or len(ranks) != 2 or r not in ranks:
                    continue
                peer = ranks[0] + ranks[1] - r
            peer = int(peer)
            ph = hosts.get(peer)
            if peer == r or ph is None or ph == h:
                continue
            d = 0 if (op == "send") == (r < peer) else 1
            per_op = nbytes / n
            cost = min_s / per_op
            # one int per (rank, peer, direction), no nested tuples to hash and compare in
            # dicts of ~460,000 entries at 131,072 ranks (issue 31): ``wkey``'s, inline
            kp = peer + RANK_OFF
            mine = kr << 33 | kp << 1 | d
            theirs = kp << 33 | kr << 1 | d
            wrep[mine] = (w0, ts, cost)
            other = wrep.get(theirs)
            if other is None or other[1] <= w0 or other[0] >= ts:
                continue               # the other side's overlapping window is still to come
            obs = min(cost, other[2])
            cls = round(log2(max(per_op, 1.0)) / bucket)
            if r < peer:
                pair, key = (r, peer), mine
            else:
                pair, key = (peer, r), theirs
            prev = wlast.get(key)
            wlast[key] = (obs, cls)
            if lows is None or exact is None or prev is not None and prev[1] != cls \
                    or (low := lows.get(cls)) is None:
                if self._observe(key, pair, obs, cls, prev, d, w0, ts, other, n, per_op, step,
                                 h, ph):
                    new = True
                lows, exact = self._low, self._lowkey
                continue
            # ``_observe`` for a key staying in its class, whose bound is known
            row = by_cls[cls]
            row.set(key, obs)
            self._sets += 1
            if self._order:
                self._note(cls, obs, prev)
            if obs < low:
                exact[cls] = key            # below every other value: the smallest
                low = lows[cls] = obs
            elif obs > low and exact.get(cls) == key:
                del exact[cls]              # the smallest value rose: a bound again
            if low > 0 and obs < bar * low * (1.0 - 1e-9):
                # surely within its peers (``_judge_obs``'s first test): never slow
                if runs:
                    run = runs.get(pair)
                    if run is not None and d == run[8]:
                        del runs[pair]      # the slow direction back within its peers
                continue
            if self._judge_obs(cls, row, key, pair, obs, low, d, w0, ts, other, n, per_op,
                               step, h, ph):
                new = True
        return new

    def _observe(self, key: int, pair: tuple[int, int], obs: float, cls: float,
                 prev: tuple[float, float] | None, d: int, w0: float, ts: float,
                 other: tuple[float, float, float], n: float, per_op: float, step: int,
                 h: Any, ph: Any) -> bool:
        """An observation ``obs`` of direction ``key`` (of ``pair``) in size class ``cls``
        (``prev``: its last one, value and class) kept by its class, then judged
        (``_judge_obs``); True when its pair was just confirmed."""
        # issue 14 (speed): wlast's costs by size class, kept with it (scanning every
        # direction for each entry was half of a 1,024-rank job's detect time); the
        # order of ``same`` does not matter (lower_half_ref sorts)
        by_cls = self.wcls
        exact = self._lowkey
        if exact is None:
            exact = self._lowkey = {}
        if prev is not None and prev[1] != cls:
            by_cls[prev[1]].discard(key)
            if exact.get(prev[1]) == key:
                del exact[prev[1]]          # its class's smallest value left it
        row = by_cls.get(cls)
        if row is None:
            row = by_cls[cls] = KeyedValues()
        row.set(key, obs)
        self._sets += 1
        if self._order:
            self._note(cls, obs, prev)
        # ``surely_within`` only skips work (an observation it passes is never slow),
        # so a lower bound of the class's smallest value does as well as the value:
        # kept per class, lowered by each observation, made exact when it cannot tell
        # (and known exact while the key holding it is not raised: ``_lowkey``)
        lows = self._low
        if lows is None:
            lows = self._low = {}
        low = lows.get(cls)
        if low is None or obs < low:
            if low is not None:
                exact[cls] = key            # below every other value: the smallest
            low = lows[cls] = obs if low is not None else float(row.array().min())
        elif obs > low and exact.get(cls) == key:
            del exact[cls]                  # the smallest value rose: a bound again
        return self._judge_obs(cls, row, key, pair, obs, low, d, w0, ts, other, n, per_op,
                               step, h, ph)

    def _judge_obs(self, cls: float, row: KeyedValues, key: int, pair: tuple[int, int],
                   obs: float, low: float, d: int, w0: float, ts: float,
                   other: tuple[float, float, float], n: float, per_op: float, step: int,
                   h: Any, ph: Any) -> bool:
        """An observation kept by its class (``low``: a lower bound of the class's values)
        against the class's latest others, and the run of its pair; True when its pair was
        just confirmed."""
        cfg = self.cfg
        exact = cast(dict[float, Any], self._lowkey)
        lows = cast(dict[float, float], self._low)
        same = row.array()
        unsure = len(same) >= cfg.p2p.peers_min and not (
            low > 0 and obs < (1.0 + cfg.far_rel) * low * (1.0 - 1e-9))
        if unsure and cls not in exact:
            # the bound could not tell: exact again, and tested as ``surely_within``
            # tests the smallest value (an exact bound that could not tell: neither can it)
            at_min = int(same.argmin())
            low = lows[cls] = float(same[at_min])
            exact[cls] = row.keys[at_min]
            unsure = not (low > 0 and obs < (1.0 + cfg.far_rel) * low * (1.0 - 1e-9))
        slow = False
        rel = z = ref = 0.0
        if unsure and not self._quartile_low(cls, row, obs):
            ref, sig = self._reference(cls, row)
            if ref > 0:
                rel = obs / ref - 1.0
                z = rel / max(sig / ref, cfg.p2p.noise_floor)
                slow = rel >= cfg.far_rel and z >= cfg.z_min
        run = self.wrun.get(pair)
        if not slow:
            if run is not None and d == run[8]:
                del self.wrun[pair]     # the slow direction back within its peers
            return False
        extra = n * (obs - ref) * per_op
        if run is None:
            self.wrun[pair] = run = [min(w0, other[0]), float(step), 0.0, 0.0, 0.0, 0.0,
                                     ts, 0.0, float(d)]
        if run[8] != d and rel < run[3]:
            return False
        run[8] = float(d)
        run[2] += 1
        run[3] = max(run[3], rel)
        run[4] += extra
        run[5] = max(run[5], z)
        run[6] = ts
        if not run[7] and run[2] >= 2 and ts - run[0] >= cfg.sustain_s - 1e-9:
            if any(set(q) & set(pair) or {self.hosts.get(q[0]), self.hosts.get(q[1])}
                   & {h, ph} for q in self.wrun if q != pair):
                return False           # several slow pairs on one end: the step grouping
            run[7] = 1.0
            f = self._window_finding(pair)
            self.last = [g for g in self.last if g.key != f.key] + [f]
            self.members[f.key] = [pair]
            return True
        return False

    def _quartile_low(self, cls: float, row: KeyedValues, obs: float) -> bool:
        """True when ``obs`` is certainly under ``1 + far_rel`` times the reference
        ``lower_half_ref`` takes of ``row``'s values (never slow then: ``_window`` skips
        computing it). That reference is at least the lower half's lower middle value, the
        ``j``-th smallest of all (0-based); ``I`` values set since a sorted copy of the class
        was taken move it down ``I`` places at most (a value replaced or dropped only
        raises it), so the copy's ``(j - I)``-th smallest bounds it from below: a bound near
        the lower quartile, not the smallest value (issue 31: with thousands of pipeline
        directions in a class, an observation half again above the fastest one is common,
        and each took a partial sort of them all). The copy is taken again once ``I`` passes
        ``j / SNAP_STALE`` (the bound stays within an eighth of ``j`` places), not when the bound
        cannot tell: those are nearly all slow observations (503 of 522 at 16,384 ranks),
        whose reference ``lower_half_ref`` then takes anyway, and a sort of the class for
        each cost more than that reference (at 131,072 ranks: 229,376 directions, 11 ms a
        sort, 3 ms a partition)."""
        d = len(row)
        j = (max(1, (d + 1) // 2) - 1) // 2
        snaps = self._snap
        if snaps is None:
            snaps = self._snap = {}
        snap = snaps.get(cls)
        if snap is None or snap[0] is not row or self._sets - snap[2] > j // SNAP_STALE:
            snap = snaps[cls] = (row, self._sorted(cls, row), self._sets)
        k = j - (self._sets - snap[2])
        if 0 <= k < snap[1].size:
            low = float(snap[1][k])
            return low > 0 and obs < (1.0 + self.cfg.far_rel) * low * (1.0 - 1e-9)
        return False

    def _note(self, cls: float | None, obs: float, prev: tuple[float, float] | None) -> None:
        """``obs`` set in size class ``cls`` (None: nothing set), replacing ``prev`` (its
        value and class; None: a new key): noted for the class's sorted copy (``_sorted``).
        Every change of ``wcls`` is noted so once a copy was made (``_window`` calls it)."""
        order = self._order
        if order is None:
            return
        if cls is not None:
            o = order.get(cls)
            if o is not None:
                o[2].append(obs)
        if prev is not None:
            o = order.get(prev[1])
            if o is not None:
                o[3].append(prev[0])
                if len(o[3]) > len(o[1]):
                    del order[prev[1]]      # not asked for in a long while: not kept up

    def _sorted(self, cls: float, row: KeyedValues) -> np.ndarray:
        """``np.sort(row.array())`` (``row``: size class ``cls``'s values), from the sorted
        copy last made of it and the values set and replaced since (``_window`` notes them):
        O(n) and no sort of them all (issue 31: 11 ms a sort of 229,376 directions at
        131,072 ranks). A new array each time: a copy handed out stays as it was."""
        order = self._order
        if order is None:
            order = self._order = {}
        o = order.get(cls)
        if o is not None and o[0] is row:
            try:
                s = sorted_update(o[1], o[2], o[3])
            except IndexError:          # (never: a value taken out it did not hold)
                s = np.empty(0)
            if s.size != len(row):      # (never: a change it missed) made again
                s = np.sort(row.array())
        else:
            s = np.sort(row.array())
        if s.size and math.isfinite(s[-1]):
            order[cls] = [row, s, [], []]
        else:                           # NaN or infinity: sorted afresh each time
            order.pop(cls, None)
        return s

    def _reference(self, cls: float, row: KeyedValues) -> tuple[float, float]:
        """``lower_half_ref(row.array())``, by position in the class's sorted values."""
        s = self._sorted(cls, row)
        if s.size and math.isfinite(s[-1]):
            return sorted_lower_half_ref(s)
        return lower_half_ref(np.array(row.array()))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_snap", None)        # a cache (``_quartile_low``): made again
        state.pop("_order", None)       # a cache (``_sorted``): made again
        state.pop("_sets", None)
        state.pop("_lowkey", None)      # a cache (``_window``): exact again when needed
        state.pop("_cc", None)          # a cache (``_entries``): made again
        state.pop("_hosts_seen", None)  # a cache (``_per_host``): made again
        return state

    def _window_finding(self, pair: tuple[int, int]) -> Finding:
        """The ``slow_link`` finding of a pair confirmed from windows."""
        a, b = pair
        run = self.wrun[pair]
        span = max(run[6] - run[0], 1e-9)
        rate = min(run[4] / span, self.cfg.p2p.rate_max)   # extra transfer s per second
        pct = 100.0 * rate / (1.0 - rate)
        host = self.hosts
        evidence = {"slow_pairs": [f"r{a}-r{b}"], "transfer_rel_slowdown": round(run[3], 3),
                    "extra_transfer_s": round(run[4], 4), "evidence_z": round(run[5], 1),
                    "p2p_windows": True, "windows": int(run[2]),
                    "sustained_s": round(span, 1), "located_by": "p2p timing (windows)"}
        return Finding(key=f"slow_link:r{a}-r{b}", fault="slow_link", confirmed=True,
                       onset_ts=run[0], onset_step=int(run[1]), slowdown_pct=pct,
                       own_pct=100.0 * run[3], lost_s=run[4], world=self.world,
                       evidence=evidence, rank=a, peer_rank=b, host=host[a], rule="p2p-windows",
                       peer_host=host[b], hosts=[host[a], host[b]])

    # -- once per judged step -----------------------------------------------------------

    def evaluate(self, s: int, rank_host: dict[int, str], ts: float, job_s: float,
                 world: int) -> list[Finding]:
        """Judge step ``s`` (``job_s``: its step time, ``ts``: its newest event); the
        slow_link findings of slow pairs (confirmed or still present)."""
        for k in [k for k in self.pending if k < s - self.max_age]:
            del self.pending[k]
        for k in [k for k in self.pend_rows if k < s - self.max_age]:
            del self.pend_rows[k]
        for k in [k for k in self.orphans if k < s - self.max_age]:
            del self.orphans[k]
        for group, rank, op, secs, nbytes, n in self.orphans.pop(s, ()):
            ranks = self.duo.get(group, ())
            if len(ranks) == 2 and rank in ranks:
                self._take(s, rank, ranks[0] + ranks[1] - rank, op, secs, nbytes, n)
        data = self._step_pairs(s)
        self.hist.append((s, job_s))
        if len(self.hist) > self.cfg.cost.history_steps:
            del self.hist[0]
        if world:
            self.world = world
        runs = self.wrun
        for p in [p for p, run in runs.items()
                  if run[6] < ts - job_s - 2.0 * (self.window_s or 1.0)]:
            del runs[p]                # no observation of it for a step: its run is over
        if data is None:
            return self._with_windows(self._close(s, job_s, ts, set(), world, rank_host))
        cfg = self.cfg
        host = {**self.hosts, **rank_host}
        pa, pb, c0, c1, sent, ops = data
        # A pair's cost: the slower direction's shortest op (a direction whose ops took no
        # measurable time, an eager send, tells nothing): Python's min and max, in where's.
        f0, f1 = np.isfinite(c0), np.isfinite(c1)
        both = np.where(c1 > c0, c1, c0)
        # the pairs of two hosts (in order: ``_step_pairs`` sorts them)
        hget = host.get
        keep = np.isfinite(np.where(c1 < c0, c1, c0)) & np.fromiter(
            (h0 is not None and h1 is not None and h0 != h1
             for h0, h1 in zip(map(hget, pa.tolist()), map(hget, pb.tolist()), strict=True)),
            dtype=bool, count=pa.size)
        if not keep.any():
            return self._with_windows(self._close(s, job_s, ts, set(), world, rank_host))
        names = list(zip(pa[keep].tolist(), pb[keep].tolist(), strict=True))
        n = len(names)
        cost = np.where(f0 & f1, both, np.where(f0, c0, c1))[keep]
        sent = sent[keep]
        size = sent / np.maximum(ops[keep] / 2, 1.0)
        t = self.table
        rows = t.rows_for(names)
        # its usual cost (the rolling median) once warm
        pp = cfg.p2p
        med = t.cost.med[rows]
        warm = (t.cost.n[rows] >= cfg.warm_steps) & (med > 0)
        safe = np.where(warm, med, 1.0)
        ratio = np.where(warm, cost / safe, 0.0)
        own = np.where(warm, t.cost.sig[rows] / safe, 0.0)
        # Against its own past, normalized by the other pairs' same ratio.
        rel_o = np.zeros(n)
        z_o = np.zeros(n)
        if warm.sum() >= pp.warm_min:
            ref, sig = lower_half_ref(ratio[warm])
            if ref > 0:
                rel_o = np.where(warm, ratio / ref - 1.0, 0.0)
                z_o = rel_o / np.maximum(max(sig / ref, pp.noise_floor), own)
        elif warm.any():
            rel_o = np.where(warm, ratio - 1.0, 0.0)
            z_o = rel_o / np.maximum(own, pp.noise_floor)
        # Against the other pairs moving ops of about the same size (no past needed).
        rel_p = np.zeros(n)
        z_p = np.zeros(n)
        cls = np.round(np.log2(np.maximum(size, 1.0)) / pp.size_bucket)
        for c in np.unique(cls):
            idx = np.flatnonzero(cls == c)
            if idx.size < pp.peers_min:
                continue
            ref, sig = lower_half_ref(cost[idx])
            if ref <= 0:
                continue
            rel_p[idx] = cost[idx] / ref - 1.0
            z_p[idx] = rel_p[idx] / np.maximum(max(sig / ref, pp.noise_floor), own[idx])
        inc = np.maximum(capped_increment(rel_o, z_o, cfg.min_rel, cfg),
                         capped_increment(rel_p, z_p, cfg.far_rel, cfg))
        rel = np.maximum(rel_o, np.where(rel_p >= cfg.far_rel, rel_p, 0.0))
        half_z = cfg.z_min / 2
        weak = (((rel_o >= cfg.min_rel / 2) & (z_o >= half_z))
                | ((rel_p >= cfg.far_rel) & (z_p >= half_z)))
        # each pair's noise sigmas this step, by the reference it stands out against
        step_z = np.maximum(z_o, np.where(rel_p >= cfg.far_rel, z_p, 0.0))
        # the evidence of every pair at once: ``cusum_update`` (Python's min and max, in
        # where's: the same values, ties and signs included), the onset of a new run, the
        # streak, the smoothed op size, the baseline learned from clean steps
        a = pp.pair_alpha
        was = t.cusum[rows]
        active = t.active[rows]
        onset = rows[(inc > 0) & (was == 0.0) & ~active]
        t.onset_ts[onset] = ts - job_s
        t.onset_step[onset] = s
        up = was + inc
        up = np.where(up > 0.0, up, 0.0)
        cap = cfg.confirm_z + cfg.z_min
        cu = np.where(cap < up, cap, up)
        t.cusum[rows] = cu
        t.streak[rows] = np.where(cu >= cfg.confirm_z, t.streak[rows] + 1, 0)
        old = t.size[rows]
        t.size[rows] = np.where(old == 0.0, size, (1.0 - a) * old + a * size)
        learn = ~weak & (cu == 0.0)
        t.cost.update(rows[learn], cost[learn])
        # slow this step: its excess and extra transfer seconds, smoothed
        hit = weak & ((cu > 0) | active)
        if not hit.any():
            return self._with_windows(self._close(s, job_s, ts, set(), world, host))
        at = np.flatnonzero(hit)
        r = rel[at]
        extra = cost[at] * sent[at] * r / (1.0 + r)
        rs = rows[at]
        prev_rel, prev_extra = t.rel[rs], t.extra_s[rs]
        fresh = prev_rel == 0.0
        t.rel[rs] = np.where(fresh, r, (1.0 - a) * prev_rel + a * r)
        t.extra_s[rs] = np.where(fresh, extra, (1.0 - a) * prev_extra + a * extra)
        slow_set = {names[i] for i in at.tolist()}
        zs = {names[i]: (z, x) for i, z, x in
              zip(at.tolist(), step_z[at].tolist(), rel[at].tolist(), strict=True)}
        return self._with_windows(self._close(s, job_s, ts, slow_set, world, host, zs))

    def _step_pairs(self, s: int) -> tuple[np.ndarray, ...] | None:
        """Step ``s``'s send/recv evidence, taken out of ``pend_rows`` (windows' entries, a
        chunk of columns per run of rows) and ``pending`` (per pair, from collectives and
        ops without a peer): per pair (in order), its ranks, the shortest op per byte each
        way, the bytes sent and the ops; None when there is none."""
        chunks = self.pend_rows.pop(s, None) or []
        data = self.pending.pop(s, None)
        if data:
            keys = list(data)
            vals = np.array(list(data.values()), dtype=np.float64)
            chunks.append((np.array([k[0] for k in keys], dtype=np.int64),
                           np.array([k[1] for k in keys], dtype=np.int64),
                           vals[:, 0], vals[:, 1], vals[:, 2], vals[:, 3]))
        if not chunks:
            return None
        cols = chunks[0] if len(chunks) == 1 else tuple(
            np.concatenate(x) for x in zip(*chunks, strict=True))
        pa, pb = cols[0], cols[1]
        order = np.lexsort((pb, pa))
        pa, pb = pa[order], pb[order]
        new = np.empty(pa.size, dtype=bool)
        new[:1] = True
        new[1:] = (pa[1:] != pa[:-1]) | (pb[1:] != pb[:-1])
        first = np.flatnonzero(new)
        # each way's shortest op, and sums of whole numbers (exact in any order)
        return (pa[first], pb[first], np.minimum.reduceat(cols[2][order], first),
                np.minimum.reduceat(cols[3][order], first),
                np.add.reduceat(cols[4][order], first), np.add.reduceat(cols[5][order], first))

    def _with_windows(self, out: list[Finding]) -> list[Finding]:
        """The step's findings, and those of pairs confirmed from windows whose run goes on
        and that the step's own evidence does not hold yet (their incidents stay present)."""
        keys = {f.key for f in out}
        held = {p for f in out for p in self.members.get(f.key, ())}
        for p in sorted(self.wrun):
            run = self.wrun[p]
            if not run[7] or p in held:
                continue
            f = self._window_finding(p)
            if f.key not in keys:
                out.append(f)
                self.members[f.key] = [p]
        return out

    def _close(self, s: int, job_s: float, ts: float, slow: set[tuple[int, int]], world: int,
               host: dict[int, str], zs: dict[tuple[int, int], tuple[float, float]] | None = None
               ) -> list[Finding]:
        """Account the step's cost to the running findings, end the ones gone, and
        locate the slow pairs: a host or each pair (``zs``: each slow pair's noise sigmas
        and excess this step)."""
        t = self.table
        k = len(t)
        active, cusum = t.active[:k], t.cusum[:k]
        hit = np.zeros(k, dtype=bool)
        if slow:
            hit[[t.row[p] for p in slow]] = True
            for i in np.flatnonzero(hit & ~active & (t.streak[:k] > 0)).tolist():
                self._activate(i)
            on = np.flatnonzero(hit & active)
            if on.size:
                t.since_s[on] += job_s
                t.since_n[on] += 1
                # Python's min and max, in where's; no clean past (slow since the first
                # steps): its own extra seconds
                base, extra = t.base_s[on], t.extra_s[on]
                over = job_s - base
                over = np.where(0.0 > over, 0.0, over)
                t.lost_s[on] += np.where(base > 0, np.where(extra < over, extra, over),
                                         np.where(job_s < extra, job_s, extra))
        gone = ~hit & (active | (t.rel[:k] != 0)) & (cusum == 0.0)
        if gone.any():
            active[gone] = False
            t.rel[:k][gone] = 0.0
            t.extra_s[:k][gone] = 0.0
        if not (active | (cusum > 0)).any():
            self.clean.update(job_s)
        self.members = {}
        if not slow:
            return []
        # Slow pairs touching one host that explain most of that host's pairs: its NICs.
        # Only pairs with a full step of evidence or more are grouped: a pair weakly
        # above its noise for a step does not turn a slow pair into a slow host.
        strong = {p for p in slow if t.cusum[t.row[p]] >= self.cfg.z_min}
        per_host: dict[str, list[tuple[int, int]]] = {}
        for p in sorted(strong):
            for h in {host[p[0]], host[p[1]]}:
                per_host.setdefault(h, []).append(p)
        out: list[Finding] = []
        left = set(strong)
        every = self._per_host(host)
        total = {h: every.get(h, 0) for h in per_host}
        # The host most of whose pairs are slow first: the far end of a slow host's pairs
        # has healthy pairs too.
        for h in sorted(per_host, key=lambda h: (-len(per_host[h]) / total[h],
                                                 -len(per_host[h]), h)):
            mine = [p for p in per_host[h] if p in left]
            if len(mine) >= 2 and 2 * len(mine) >= total[h]:
                out.append(self._finding(f"slow_link:{h}", mine, world, zs, host=h, hosts=[h]))
                left -= set(mine)
        # Slow pairs sharing one rank: that rank's NIC (rail-optimized: one per GPU).
        per_rank: dict[int, list[tuple[int, int]]] = {}
        for p in sorted(left):
            for r in p:
                per_rank.setdefault(r, []).append(p)
        for r in sorted(per_rank, key=lambda r: (-len(per_rank[r]), r)):
            mine = [p for p in per_rank[r] if p in left]
            if len(mine) >= 2:
                out.append(self._finding(f"slow_link:{host[r]}", mine, world, zs, host=host[r],
                                         hosts=[host[r]], nic_rank=r))
                left -= set(mine)
        for a, b in sorted(left | (slow - strong)):
            out.append(self._finding(f"slow_link:r{a}-r{b}", [(a, b)], world, zs, rank=a,
                                     peer_rank=b, host=host[a], peer_host=host[b],
                                     hosts=[host[a], host[b]]))
        return out

    def _per_host(self, host: dict[int, str]) -> dict[str, int]:
        """Per host, how many of the table's pairs touch it (``host``: the ranks' hosts);
        kept while neither the pairs nor the hosts change (``_hosts_seen``)."""
        t = self.table
        seen = self._hosts_seen
        if seen is not None and seen[0] == len(t) and seen[1] == host:
            return seen[2]
        every: dict[str, int] = {}
        for p in t.keys:
            for e in {host.get(p[0], ""), host.get(p[1], "")}:
                every[e] = every.get(e, 0) + 1
        self._hosts_seen = (len(t), host, every)
        return every

    def _activate(self, i: int) -> None:
        """A pair's first confirmed step (row ``i`` of the table): the job's step time
        before its onset, and what the job lost since (measured step times over that,
        bounded by its extra)."""
        t = self.table
        t.active[i] = True
        onset, extra = int(t.onset_step[i]), float(t.extra_s[i])
        cc = self.cfg.cost
        before = [d for k, d in self.hist if k < onset][-cc.base_steps:]
        mean = sum(before) / len(before) if len(before) >= cc.base_min_steps else 0.0
        usual = self.clean.median if self.clean.n else 0.0
        # Fewer than four steps before the onset: slow since the job's first steps, no
        # clean step time to compare with (base 0: priced by its own extra seconds).
        base = (min(mean, usual) if usual > 0 else mean) if mean > 0 else 0.0
        since = [d for k, d in self.hist if k >= onset]
        t.base_s[i] = base
        t.since_s[i], t.since_n[i] = sum(since), len(since)
        t.lost_s[i] = sum(min(max(d - base, 0.0), extra) if base > 0
                          else min(extra, d) for d in since)

    def price(self, f: Finding, world: int) -> None:
        """A pair finding of the collective groups (``models.links``): remember its
        slowdown estimate (``link_pct``), and give it the job time this pair's running
        finding measured lost (``gpu_hours_lost``)."""
        if f.rank is None or f.peer_rank is None:
            return
        self.link_pct[f.key] = (f.slowdown_pct, f.own_pct)
        pair = (min(f.rank, f.peer_rank), max(f.rank, f.peer_rank))
        i = self.table.row.get(pair)
        if i is None or not self.table.active[i] or f.lost_s is not None:
            return
        f.lost_s, f.world = self._finding(f.key, [pair], world).lost_s, world

    def _finding(self, key: str, pairs: list[tuple[int, int]], world: int,
                 zs: dict[tuple[int, int], tuple[float, float]] | None = None,
                 nic_rank: int | None = None, **where: Any) -> Finding:
        t = self.table
        ix = [t.row[p] for p in pairs]
        self.members[key] = pairs
        confirmed = bool((t.streak[ix] > 0).any())
        rel = max(t.rel[ix].tolist())
        extra = max(t.extra_s[ix].tolist())
        lost = max(t.lost_s[ix].tolist())
        base = max(t.base_s[ix].tolist())
        now = max((a / b for a, b in zip(t.since_s[ix].tolist(), t.since_n[ix].tolist(),
                                         strict=True) if b), default=0.0)
        if base > 0 and now > 0:
            pct = 100.0 * min(max(now / base - 1.0, 0.0), extra / base)
        elif extra > 0:
            # over the job's step without it (its recent step time: the mean since a
            # first-step onset would hold the warm-up steps)
            now = median([d for _, d in self.hist[-self.cfg.p2p.recent_steps:]]) \
                if self.hist else 0.0
            pct = 100.0 * extra / (now - extra) if now > extra else 0.0
        else:
            pct = 0.0
        evidence = {"slow_pairs": [f"r{a}-r{b}" for a, b in pairs][:16],
                    "transfer_rel_slowdown": round(rel, 3),
                    "extra_transfer_s": round(extra, 4),
                    "evidence_z": round(max(t.cusum[ix].tolist()), 1),
                    "located_by": "p2p timing"}
        if nic_rank is not None:
            evidence["nic_of_rank"] = nic_rank
        if base > 0:
            evidence["baseline_step_s"] = round(base, 4)
        return Finding(key=key, fault="slow_link", confirmed=confirmed,
                       onset_ts=min(t.onset_ts[ix].tolist()),
                       onset_step=min(t.onset_step[ix].tolist()), slowdown_pct=pct,
                       own_pct=100.0 * rel, lost_s=lost, world=world, evidence=evidence,
                       step_z=None if zs is None else max(zs.get(p, (0.0, 0.0))[0] for p in pairs),
                       step_rel=None if zs is None else max(zs.get(p, (0.0, 0.0))[1]
                                                            for p in pairs),
                       rule="p2p-steps", **where)
