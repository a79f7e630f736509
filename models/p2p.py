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

from failslow.models.comm import CommRows
from failslow.models.config import JobConfig
from failslow.models.cusum import capped_increment, cusum_update
from failslow.models.findings import Finding
from failslow.models.peers import KeyedValues, lower_half_ref, sorted_lower_half_ref, sorted_update
from failslow.models.stats import RollingMedian, median

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
    """Baseline and evidence of one rank pair."""

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

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.max_age = cfg.p2p.pending_steps
        # step -> pair -> [seconds per byte of the shortest op each way (lower rank sending,
        # higher rank sending), bytes sent, ops]
        self.pending: dict[int, dict[tuple[int, int], list[float]]] = {}
        self.pairs: dict[tuple[int, int], PairState] = {}
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
        the first such row (the caller judges it before the rest)."""
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
            # ``_window_time`` (the producers' window, the rank's step start), inline
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
                    # inside a long step: ``_window`` (which learns the window itself)
                    if self._window(c, i, step, mid):
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

    def _window_time(self, r: int, ts: float, w0: float, end: Any, step: int) -> float:
        """Learn the producers' window and the rank's step start; the seconds the rank's
        step has run at this window's end."""
        ts, w0 = float(ts), float(w0)
        st = self.wstart.get(r)
        if st is None or st[0] != step:
            st = self.wstart[r] = (step, w0)
        if not end and ts > w0:
            self.window_s = ts - w0 if not self.window_s \
                else (1.0 - self.cfg.p2p.window_alpha) * self.window_s \
                + self.cfg.p2p.window_alpha * (ts - w0)
        return ts - st[1]

    def _window(self, c: CommRows, i: int, step: int, mid: float | None) -> bool:
        """The send/recv entries of one window (row ``i`` of ``c``) as per-window
        observations (module doc); ``mid``: the job's recent step time (None: none yet)."""
        r = c.rank[i]
        elapsed = self._window_time(r, c.ts[i], c.w0[i], c.end[i], step)
        w = self.window_s or 1.0
        lw = self.cfg.substep.long_windows
        if elapsed < lw * w and (mid is None or mid < lw * w):
            return False               # a short step: the step rule
        if c.world[i]:
            self.world = max(self.world, int(cast(int, c.world[i])))
        h = self.hosts.get(r)
        ts, w0 = float(c.ts[i]), float(c.w0[i])
        cfg = self.cfg
        new = False
        for j in range(c.at[i], c.at[i + 1]):
            op, n, nbytes, min_s = c.op[j], c.cnt[j], c.nbytes[j], c.min_s[j]
            if op not in P2P_OPS or n <= 0 or nbytes <= 0 or min_s <= 0:
                continue
            peer = c.peer[j]
            if peer is None:
                ranks = self.duo.get(c.group[j], ())
                if c.size[j] != 2 or len(ranks) != 2 or r not in ranks:
                    continue
                peer = ranks[0] + ranks[1] - r
            peer = int(peer)
            ph = self.hosts.get(peer)
            if peer == r or h is None or ph is None or ph == h:
                continue
            d = 0 if (op == "send") == (r < peer) else 1
            per_op = nbytes / n
            cost = min_s / per_op
            # one int per (rank, peer, direction), no nested tuples to hash and compare in
            # dicts of ~460,000 entries at 131,072 ranks (issue 31)
            self.wrep[wkey(r, peer, d)] = (w0, ts, cost)
            other = self.wrep.get(wkey(peer, r, d))
            if other is None or other[1] <= w0 or other[0] >= ts:
                continue               # the other side's overlapping window is still to come
            obs = min(cost, other[2])
            cls = round(math.log2(max(per_op, 1.0)) / cfg.p2p.size_bucket)
            pair = (r, peer) if r < peer else (peer, r)
            key = wkey(pair[0], pair[1], d)
            prev = self.wlast.get(key)
            self.wlast[key] = (obs, cls)
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
            same = row.array()
            run = self.wrun.get(pair)
            slow = False
            rel = z = 0.0
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
                low = lows[cls] = obs if low is not None else float(same.min())
            elif obs > low and exact.get(cls) == key:
                del exact[cls]                  # the smallest value rose: a bound again
            unsure = len(same) >= cfg.p2p.peers_min and not (
                low > 0 and obs < (1.0 + cfg.far_rel) * low * (1.0 - 1e-9))
            if unsure and cls not in exact:
                # the bound could not tell: exact again, and tested as ``surely_within``
                # tests the smallest value (an exact bound that could not tell: neither can it)
                at_min = int(same.argmin())
                low = lows[cls] = float(same[at_min])
                exact[cls] = row.keys[at_min]
                unsure = not (low > 0 and obs < (1.0 + cfg.far_rel) * low * (1.0 - 1e-9))
            if unsure and not self._quartile_low(cls, row, obs):
                ref, sig = self._reference(cls, row)
                if ref > 0:
                    rel = obs / ref - 1.0
                    z = rel / max(sig / ref, cfg.p2p.noise_floor)
                    slow = rel >= cfg.far_rel and z >= cfg.z_min
            if not slow:
                if run is not None and d == run[8]:
                    del self.wrun[pair]     # the slow direction back within its peers
                continue
            extra = n * (obs - ref) * per_op
            if run is None:
                self.wrun[pair] = run = [min(w0, other[0]), float(step), 0.0, 0.0, 0.0, 0.0,
                                         ts, 0.0, float(d)]
            if run[8] != d and rel < run[3]:
                continue
            run[8] = float(d)
            run[2] += 1
            run[3] = max(run[3], rel)
            run[4] += extra
            run[5] = max(run[5], z)
            run[6] = ts
            if not run[7] and run[2] >= 2 and ts - run[0] >= cfg.sustain_s - 1e-9:
                if any(set(q) & set(pair) or {self.hosts.get(q[0]), self.hosts.get(q[1])}
                       & {h, ph} for q in self.wrun if q != pair):
                    continue           # several slow pairs on one end: the step grouping
                run[7] = 1.0
                f = self._window_finding(pair)
                self.last = [g for g in self.last if g.key != f.key] + [f]
                self.members[f.key] = [pair]
                new = True
        return new

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
        for k in [k for k in self.orphans if k < s - self.max_age]:
            del self.orphans[k]
        for group, rank, op, secs, nbytes, n in self.orphans.pop(s, ()):
            ranks = self.duo.get(group, ())
            if len(ranks) == 2 and rank in ranks:
                self._take(s, rank, ranks[0] + ranks[1] - rank, op, secs, nbytes, n)
        data = self.pending.pop(s, None)
        self.hist.append((s, job_s))
        if len(self.hist) > self.cfg.cost.history_steps:
            del self.hist[0]
        if world:
            self.world = world
        runs = self.wrun
        for p in [p for p, run in runs.items()
                  if run[6] < ts - job_s - 2.0 * (self.window_s or 1.0)]:
            del runs[p]                # no observation of it for a step: its run is over
        if not data:
            return self._with_windows(self._close(s, job_s, ts, set(), world, rank_host))
        cfg = self.cfg
        host = {**self.hosts, **rank_host}
        # A pair's cost: the slower direction's shortest op (a direction whose ops took no
        # measurable time, an eager send, tells nothing).
        costs: dict[tuple[int, int], float] = {}
        # the pairs of two hosts, in order
        names: list[tuple[int, int]] = []
        isfinite = math.isfinite
        hget = host.get
        for p, v in data.items():
            c0, c1 = v[0], v[1]
            if isfinite(min(c0, c1)):
                # max(c for c in (c0, c1) if isfinite(c)), without a generator per pair
                f0, f1 = isfinite(c0), isfinite(c1)
                costs[p] = (c1 if c1 > c0 else c0) if f0 and f1 else c0 if f0 else c1
                h0, h1 = hget(p[0]), hget(p[1])
                if h0 is not None and h1 is not None and h0 != h1:
                    names.append(p)
        names.sort()
        if not names:
            return self._with_windows(self._close(s, job_s, ts, set(), world, rank_host))
        n = len(names)
        cost = np.array([costs[p] for p in names])
        cost_l = cost.tolist()
        size = np.array([data[p][2] / max(data[p][3] / 2, 1.0) for p in names])
        sts = []
        # per pair in Python floats (the same IEEE values as numpy's), then arrays
        ratio_l = [0.0] * n
        own_l = [0.0] * n
        warm_l = [False] * n
        pairs, warm_steps = self.pairs, cfg.warm_steps
        for i, p in enumerate(names):
            st = pairs.get(p)
            if st is None:
                st = pairs[p] = PairState(cfg.p2p.cost_window)
            sts.append(st)
            b = st.cost
            # its median read once (a rolling quantile's ``get`` a read)
            m = b.median if b.n >= warm_steps else 0.0
            if m > 0:
                ratio_l[i] = cost_l[i] / m
                own_l[i] = b.sigma / m
                warm_l[i] = True
        ratio = np.array(ratio_l)
        own = np.array(own_l)
        warm = np.array(warm_l, dtype=bool)
        # Against its own past, normalized by the other pairs' same ratio.
        rel_o = np.zeros(n)
        z_o = np.zeros(n)
        pp = cfg.p2p
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
        slow: list[tuple[int, int]] = []
        # each pair's noise sigmas this step, by the reference it stands out against
        step_z = np.maximum(z_o, np.where(rel_p >= cfg.far_rel, z_p, 0.0))
        start = ts - job_s
        inc_l, size_l, weak_l, rel_l = inc.tolist(), size.tolist(), weak.tolist(), rel.tolist()
        a = cfg.p2p.pair_alpha
        confirm_z = cfg.confirm_z
        for i, p in enumerate(names):
            st = sts[i]
            x = inc_l[i]
            if x > 0 and st.cusum == 0.0 and not st.active:
                st.onset_ts, st.onset_step = start, s
            st.cusum = cusum_update(st.cusum, x, cfg)
            st.streak = st.streak + 1 if st.cusum >= confirm_z else 0
            sz = size_l[i]
            st.size = sz if st.size == 0.0 else (1.0 - a) * st.size + a * sz
            w = weak_l[i]
            if not w and st.cusum == 0.0:
                st.cost.update(cost_l[i])
            if w and (st.cusum > 0 or st.active):
                r = rel_l[i]
                extra = cost_l[i] * data[p][2] * r / (1.0 + r)
                fresh = st.rel == 0.0
                st.rel = r if fresh else (1.0 - a) * st.rel + a * r
                st.extra_s = extra if fresh else (1.0 - a) * st.extra_s + a * extra
                slow.append(p)
        slow_set = set(slow)
        zs = {p: (float(step_z[i]), float(rel[i])) for i, p in enumerate(names) if p in slow_set}
        return self._with_windows(self._close(s, job_s, ts, slow_set, world, host, zs))

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
        for p, st in self.pairs.items():
            if p in slow:
                if not st.active and st.streak > 0:
                    self._activate(st)
                if st.active:
                    st.since_s += job_s
                    st.since_n += 1
                    # no clean past (slow since the first steps): its own extra seconds
                    st.lost_s += min(max(job_s - st.base_s, 0.0), st.extra_s) \
                        if st.base_s > 0 else min(st.extra_s, job_s)
            elif st.active or st.rel:
                if st.cusum == 0.0 and st.active:
                    st.active = False
                if st.cusum == 0.0:
                    st.rel = 0.0
                    st.extra_s = 0.0
        if not any(st.active or st.cusum > 0 for st in self.pairs.values()):
            self.clean.update(job_s)
        self.members = {}
        if not slow:
            return []
        # Slow pairs touching one host that explain most of that host's pairs: its NICs.
        # Only pairs with a full step of evidence or more are grouped: a pair weakly
        # above its noise for a step does not turn a slow pair into a slow host.
        strong = {p for p in slow if self.pairs[p].cusum >= self.cfg.z_min}
        per_host: dict[str, list[tuple[int, int]]] = {}
        for p in sorted(strong):
            for h in {host[p[0]], host[p[1]]}:
                per_host.setdefault(h, []).append(p)
        out: list[Finding] = []
        left = set(strong)
        total = {h: 0 for h in per_host}
        for p in self.pairs:
            for e in {host.get(p[0], ""), host.get(p[1], "")}:
                if e in total:
                    total[e] += 1
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

    def _activate(self, st: PairState) -> None:
        """A pair's first confirmed step: the job's step time before its onset, and what
        the job lost since (measured step times over that, bounded by its extra)."""
        st.active = True
        cc = self.cfg.cost
        before = [d for k, d in self.hist if k < st.onset_step][-cc.base_steps:]
        mean = sum(before) / len(before) if len(before) >= cc.base_min_steps else 0.0
        usual = self.clean.median if self.clean.n else 0.0
        # Fewer than four steps before the onset: slow since the job's first steps, no
        # clean step time to compare with (base 0: priced by its own extra seconds).
        st.base_s = (min(mean, usual) if usual > 0 else mean) if mean > 0 else 0.0
        since = [d for k, d in self.hist if k >= st.onset_step]
        st.since_s, st.since_n = sum(since), len(since)
        st.lost_s = sum(min(max(d - st.base_s, 0.0), st.extra_s) if st.base_s > 0
                        else min(st.extra_s, d) for d in since)

    def price(self, f: Finding, world: int) -> None:
        """A pair finding of the collective groups (``models.links``): remember its
        slowdown estimate (``link_pct``), and give it the job time this pair's running
        finding measured lost (``gpu_hours_lost``)."""
        if f.rank is None or f.peer_rank is None:
            return
        self.link_pct[f.key] = (f.slowdown_pct, f.own_pct)
        pair = (min(f.rank, f.peer_rank), max(f.rank, f.peer_rank))
        st = self.pairs.get(pair)
        if st is None or not st.active or f.lost_s is not None:
            return
        f.lost_s, f.world = self._finding(f.key, [pair], world).lost_s, world

    def _finding(self, key: str, pairs: list[tuple[int, int]], world: int,
                 zs: dict[tuple[int, int], tuple[float, float]] | None = None,
                 nic_rank: int | None = None, **where: Any) -> Finding:
        sts = [self.pairs[p] for p in pairs]
        self.members[key] = pairs
        confirmed = any(st.streak > 0 for st in sts)
        rel = max(st.rel for st in sts)
        extra = max(st.extra_s for st in sts)
        lost = max(st.lost_s for st in sts)
        base = max(st.base_s for st in sts)
        now = max((st.since_s / st.since_n for st in sts if st.since_n), default=0.0)
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
                    "evidence_z": round(max(st.cusum for st in sts), 1),
                    "located_by": "p2p timing"}
        if nic_rank is not None:
            evidence["nic_of_rank"] = nic_rank
        if base > 0:
            evidence["baseline_step_s"] = round(base, 4)
        return Finding(key=key, fault="slow_link", confirmed=confirmed,
                       onset_ts=min(st.onset_ts for st in sts),
                       onset_step=min(st.onset_step for st in sts), slowdown_pct=pct,
                       own_pct=100.0 * rel, lost_s=lost, world=world, evidence=evidence,
                       step_z=None if zs is None else max(zs.get(p, (0.0, 0.0))[0] for p in pairs),
                       step_rel=None if zs is None else max(zs.get(p, (0.0, 0.0))[1]
                                                            for p in pairs),
                       rule="p2p-steps", **where)
