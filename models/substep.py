"""Sub-step evidence: who a group waits for, window after window, inside a long step.

A ``comm`` window closes every ``window_s`` (1 s) inside a step (CONTRACT.md). In a
group whose members do the same work (a tensor-parallel group, an FSDP shard group:
any collective group, not a point-to-point pair) every member ends each op together, so
the member that arrives last blocks least. Once every member of a group has sent a
window since the group's last *tick*, the tick compares them, per op of the group:

    late_m = median over members of (blocked_s / n)  -  blocked_s(m) / n(m)
    work   = median over members of (window time - time blocked in any group) / n
    value  = log(1 + late_m / work)

where a member that waited longer than its peers' median in send/recv has that extra
wait per op taken off ``late_m``, down to zero (it arrived later at the group's ops
because a pipeline neighbour or link was late, not because it worked longer). In each
member's first window of a step its longest op is left out (the first op of a step
waits for the members' different starts, not for their work); groups whose ops come in
a burst (windows with its ops that closed on time, not cut by the step's end: fewer than
``min_spread`` a step, e.g. gradient buckets at the step's end, which fill the step's last
window and at most one before it) or with almost no work between them (``min_work``)
give no value. Counting windows closed on time, not all windows, lets a 2 s step (two
full windows and the short one its end cuts) judge its tensor-parallel group.

``late_m / work`` is how much longer the member took between two ops of the group than
its peers, relative to that work: 0.3 for a GPU 30 % slower, whatever the step time or
the model (durations are each rank's own: no clock alignment needed).

Each group keeps these values per member in ``models.evidence.Windows``, the same test
the per-step evidence uses, over trailing windows of ticks that span ``sustain_s``
seconds or more (``k``, ``2k`` and ``4k`` ticks, ``k = max(2, ceil(sustain_s /
window_s))``):

- far outside its peers: the mean at least ``far_rel``, any step it began;
- a change against its own past: once a member's usual value is learned (its clean
  ticks, ``noise_delay`` late, as for steps), the mean of value minus usual at least
  twice ``min_rel`` (inside one step a rank's speed varies a few per cent for the
  whole step: a clock, its data; smaller changes are left to the per-step evidence).
  A member a few per cent off its peers from the first op has that offset
  as its usual: steady imbalance never confirms here.

A tick waits for ``min_ops`` ops of the group on every member (windows add up until
then): a member's work between two ops is only known once the next op ended, so one op
per tick would swing its value by the work still in progress at the window's close.

A stall shorter than the tested windows (one op that waits seconds) is one large
value among small ones: the window's own deviation swamps it, it never confirms.
The job's first step (compilation, autotuning) teaches no usual value: only peers judge
it, so a member far outside its peers from the first op is found inside that step.

A confirmation is sustained (consistent over ticks spanning ``sustain_s``) by
construction: ``models.job`` reports the seconds its ticks span (``sustained_s``) and the
paging policy (``models.policy``) pages it from ``page_sustained_s`` seconds in long
steps, without waiting for steps to end.

Cost: a tick is plain Python over the group's few members (numpy's fixed cost per call
dominated on eight values) and runs ``Windows.test`` only when some trailing window's
mean exceeds the test's ``delta / 2`` (``_may_pass``; otherwise the test confirms
nothing and returns no positive z, so its answers are the same). A tick's learning of its
members' noise (``Windows.learn``) waits until some group that learned ticks again (a group's
windows are its own: nothing else reads them), then every waiting group learns in one call
(``Windows.learn_many``: one numpy pass over ~150 groups' rows at tp8 pp8, not two calls of
eight rows per tick), the same values; a snapshot learns first (``SubStep.__getstate__``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from failslow.models.comm import CommRows
from failslow.models.config import JobConfig, SubstepConfig
from failslow.models.evidence import Windows
from failslow.models.peers import LOWER_HALF_MAD, PARTITION_MIN, lower_half_ref

P2P = frozenset(("send", "recv"))
# Thresholds: ``SubstepConfig`` (``[rules.substep]``): ``width`` ticks kept per member,
# ``min_ops`` ops of the group per member in a tick (windows add up until then),
# ``min_spread`` windows of a step with ops of the group closed by time (not by the step's
# end, this step or the last), ``min_work`` least share of a member's time spent working
# between the ops, ``sigma_floor`` per-tick noise floor (per-op means over ~1 s jitter).


class GroupTicks:
    """One group's pending windows per member and its tick series."""

    __slots__ = ("size", "pend", "seen", "raw", "own", "calm", "ts", "steps", "spread", "long",
                 "ready", "obs")

    def __init__(self, size: int, cfg: JobConfig | None = None) -> None:
        cfg = cfg or JobConfig()
        self.size = size
        # member -> [blocked in this group, ops of this group, window seconds, blocked in any]
        self.pend: dict[int, list[float]] = {}
        # member -> (step, its windows with ops of the group in it, in its step before)
        self.seen: dict[int, tuple[int, int, int]] = {}
        self.raw = Windows(cfg.substep.width, cfg.evidence)   # value per tick
        self.own = Windows(cfg.substep.width, cfg.evidence)   # value minus the member's usual
        self.calm = np.zeros(0, dtype=np.int64)
        self.ts: list[float] = []        # end ts of each tick kept (the newest last)
        self.steps: list[int] = []       # the step of each tick kept
        self.spread = 0.0                # smoothed robust spread of the values (fraction)
        self.long = False                # the newest tick came from inside a long step
        self.ready = 0                   # members in pend with min_ops ops or more
        # short steps (ops closed on time in fewer than min_spread windows a step): the
        # first tick of each of the last two steps that a window closed on time made,
        # (step, ts, member -> (relative lateness, wait share)), judged by ``models.job``
        # with the member's last step (``JobState._short_substep``)
        self.obs: list[tuple[int, float, dict[int, tuple[float, float]]]] = []

    def __setstate__(self, state: Any) -> None:
        slots = state[1] if isinstance(state, tuple) else state
        for k, v in slots.items():
            setattr(self, k, v)
        if "ready" not in slots:          # pickled before the count existed
            least = SubstepConfig().min_ops          # what it ran with
            self.ready = sum(1 for q in self.pend.values() if q[1] >= least)
        if "obs" not in slots:
            self.obs = []


class SubStep:
    """Sub-step evidence of one job (see the module doc)."""

    # A tick's learning of its members' noise (``Windows.learn`` of ``raw`` and ``own``),
    # group -> (group, rows, mask), done later, for all the groups waiting, in one call
    # (``Windows.learn_many``): before the group's next tick reads its moments (a group's
    # windows are its own: no other group reads them) and before it is pickled. Never
    # pickled; None until a tick learns.
    _due: dict[str, tuple[GroupTicks, np.ndarray, np.ndarray]] | None = None

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.groups: dict[str, GroupTicks] = {}
        self.last_ts: dict[int, float] = {}        # rank -> end of its last window
        self.start: dict[int, tuple[int, float]] = {}   # rank -> (step, its start)
        self.first_step: int | None = None
        self.window_s = 0.0                         # the producers' window, learned

    def __getstate__(self) -> dict[str, Any]:
        self.learn_due()
        d = dict(self.__dict__)
        d.pop("_due", None)
        return d

    def learn_due(self) -> None:
        """The learning the last ticks left to do (``_due``), all groups in one call."""
        due = self._due
        if due:
            items = []
            for g, rows, mask in due.values():
                items.append((g.raw, rows, mask))
                items.append((g.own, rows, mask))
            due.clear()              # the same dict: a tick holding it adds to it next
            Windows.learn_many(items)

    def scales(self) -> tuple[int, ...]:
        """Trailing tick windows tested: the shortest spans ``sustain_s`` seconds."""
        w = self.window_s or 1.0
        k = max(self.cfg.substep.min_ticks, math.ceil(self.cfg.sustain_s / w - 1e-9))
        return tuple(sorted({k, 2 * k, min(self.cfg.substep.span_ratio * k,
                                            self.cfg.substep.width)}))

    def add(self, ev: dict[str, Any], step: int
            ) -> list[tuple[str, list[int], dict[int, dict[str, Any]]]]:
        """Take one ``comm`` record of a rank in ``step``; returns, per group that ticked,
        (group, its members confirmed at this tick, details per confirmed member)."""
        done = self.add_rows(CommRows.of_events([ev]), [step], 0, 1)
        return done[0][1] if done else []

    def add_rows(self, c: CommRows, steps: list[int], lo: int, hi: int, stop: bool = False
                 ) -> list[tuple[int, list[tuple[str, list[int], dict[int, dict[str, Any]]]]]]:
        """Take rows ``lo:hi`` of ``c`` (``steps[i]``: row i's step) in order, as ``add``
        takes each; returns (row, what ``add`` returns) for the rows where a group ticked.
        ``stop``: return after the first such row (the caller judges it before the rest)."""
        at, ranks, tss, w0s, ends = c.at, c.rank, c.ts, c.w0, c.end
        groups_c, sizes, cnts, blocked, longest = c.group, c.size, c.cnt, c.blocked, c.max_s
        # per row: seconds blocked in any group, and in send/recv
        ball_r, p2p_r, isp = c.sums()
        starts, last_ts, groups = self.start, self.last_ts, self.groups
        min_ops, long_w = self.cfg.substep.min_ops, self.cfg.substep.long_windows
        wa = self.cfg.substep.window_alpha
        done = []
        first = self.first_step
        for i in range(lo, hi):
            r = ranks[i]
            ts = tss[i]
            w0 = w0s[i]
            step = steps[i]
            if first is None or step < first:
                self.first_step = first = step
            st = starts.get(r)
            if st is None or st[0] != step:
                starts[r] = st = (step, w0)
            end = ends[i]               # read as ``not end``: None counts as False
            if not end and ts > w0:
                # The producers' window, learned from windows a step end did not cut short.
                self.window_s = ts - w0 if not self.window_s \
                    else (1.0 - wa) * self.window_s + wa * (ts - w0)
            # The rank's time since its previous window (windows in which no op ended are
            # not sent: an op that blocked across them counts here, whole).
            prev = last_ts.get(r)
            span = ts - (prev if prev is not None and prev <= w0 + 1e-9 else w0)
            last_ts[r] = ts
            a, b = at[i], at[i + 1]
            if a == b or span < 0:
                continue
            out = None
            for j in range(a, b):
                if isp[j]:
                    continue
                size = sizes[j]
                n = cnts[j]
                if size < 2 or n <= 0:
                    continue
                group = groups_c[j]
                bj = blocked[j]
                g = groups.get(group)
                if g is None:
                    g = groups[group] = GroupTicks(size, self.cfg)
                ball = ball_r[i]
                pend = g.pend
                gseen = g.seen
                seen = gseen.get(r)
                if seen is None or seen[0] != step:
                    # The first op of a step waits for the members' different starts
                    # (the last step's other groups), not for their work: in every
                    # member's first window of the group in a step, its longest op is
                    # left out.
                    seen = gseen[r] = (step, int(not end), seen[1] if seen is not None else 0)
                    q = pend.pop(r, None)      # and what was left of its last step
                    if q is not None and q[1] >= min_ops:
                        g.ready -= 1
                    bj -= longest[j]
                    ball -= longest[j]
                    n -= 1
                    if n <= 0:
                        continue
                else:
                    seen = gseen[r] = (step, seen[1] + (not end), seen[2])
                p = pend.get(r)
                if p is None:
                    pend[r] = [bj, float(n), span, ball,
                               float(seen[2] if seen[2] > seen[1] else seen[1]), p2p_r[i]]
                    if n >= min_ops:
                        g.ready += 1
                else:
                    was = p[1]
                    p[0] += bj
                    p[1] += n
                    p[2] += span
                    p[3] += ball
                    p[5] += p2p_r[i]
                    p[4] = seen[2] if seen[2] > seen[1] else seen[1]      # max()
                    if was < min_ops <= p[1]:
                        g.ready += 1
                # every member has sent a window since the last tick, each with min_ops ops
                if g.ready >= g.size and g.ready == len(pend):
                    g.long = ts - st[1] >= long_w * (self.window_s or 1.0)
                    if out is None:
                        out = []
                    out.append(self._tick(group, g, ts, step, not end))
            if out:
                done.append((i, out))
                if stop:
                    return done
        return done

    def _tick(self, name: str, g: GroupTicks, ts: float, step: int, closed: bool = False
              ) -> tuple[str, list[int], dict[int, dict[str, Any]]]:
        # Plain floats for the few members of a group (numpy's fixed cost per call
        # dominates on eight values); the same IEEE operations, so the same values.
        cfg = self.cfg
        sp = cfg.substep
        got = g.pend
        g.pend = {}
        g.ready = 0
        obs = g.obs
        observe = closed and (not obs or obs[-1][0] < step)
        if not observe and min([p[4] for p in got.values()]) < sp.min_spread:
            # (below: a burst or a short step gives no value; nor, here, an observation:
            # what follows would only be computed to be dropped, as would the work between
            # the ops, whatever it is: the same empty answer, most ticks at short steps)
            return name, [], {}
        members = sorted(got)
        pend = [got[m] for m in members]
        per_op = [p[0] / p[1] for p in pend]
        # max(d, 0.0) written out (d unless 0.0 is strictly above it: the same value)
        work = [(0.0 if (d := p[2] - p[3]) < 0.0 else d) / p[1] for p in pend]
        ref_work = _median(work)
        fast = cfg.evidence.fast_max
        if ref_work <= sp.min_work * _median([p[2] / p[1] for p in pend]):
            # A group whose ops follow each other with no work between says nothing about
            # the members' work.
            return name, [], {}
        # A member that waited longer than its peers for a pipeline neighbour (send/recv)
        # arrives that much later at this group's ops: it waited, it is not slow.
        mid5 = _median([p[5] for p in pend])
        waited = [(0.0 if (d := p[5] - mid5) < 0.0 else d) / p[1] for p in pend]
        mid = _median(per_op)
        if len(pend) == 2:
            # Two members compare with each other (a median of two is their mean: half
            # the gap): the one that waited longer is the reference, its work the unit.
            i = 0 if per_op[0] >= per_op[1] else 1
            if work[i] > sp.min_work * pend[i][2] / pend[i][1]:
                mid, ref_work = per_op[i], work[i]
        late = [mid - x for x in per_op]
        # The first tick of a step made by a window closed on time (inside the step: never
        # the buckets the step's end cuts) is kept as one observation (``obs``), the last
        # two steps', that ``models.job`` weighs with the member's last step at short steps.
        if observe:
            # max() and min() written out, the same values (each returns its first argument
            # unless the second is strictly beyond it): a tick of every group, every step
            now: dict[int, tuple[float, float]] = {}
            for m, x, wt, p in zip(members, late, waited, pend, strict=True):
                y = 0.0 if x < 0.0 else x                        # max(x, 0.0)
                v = (x - (y if y < wt else wt)) / ref_work       # min(wt, y)
                now[m] = (-fast if v < -fast else v,             # max(v, -fast)
                          float(x * p[1] / (1e-9 if p[2] < 1e-9 else p[2])))
            obs.append((step, ts, now))
            g.obs = obs[-2:]
        if min([p[4] for p in pend]) < sp.min_spread:
            # A group whose ops come in a burst (gradient buckets at the step's end: in one
            # or two windows a step), or a short step (one window closed on time): no
            # value for the windowed test.
            return name, [], {}
        # the spread before that correction, which only ever lowers a lateness, to zero
        sig = _lower_half_sigma(
            np.log1p(np.array([max(x / ref_work, -fast) for x in late])).tolist())
        rel = [max((x - min(w, max(x, 0.0))) / ref_work, -fast)
               for x, w in zip(late, waited, strict=True)]
        val = np.log1p(np.array(rel))
        g.spread = sig if not g.spread else (1.0 - sp.spread_alpha) * g.spread \
            + sp.spread_alpha * sig
        due = self._due
        if due is None:
            due = self._due = {}
        elif name in due:
            self.learn_due()         # this group's last tick learned first (and the others')
        rows = g.raw.rows_for(members)
        g.own.rows_for(members)
        if g.calm.size < len(g.raw.rows):
            g.calm = np.concatenate([g.calm, np.zeros(len(g.raw.rows) - g.calm.size,
                                                      dtype=np.int64)])
        mom = g.raw.mom[rows]
        known = mom[:, 3] >= cfg.evidence.noise_min
        g.raw.push(rows, val)
        # The job's first step (compilation, autotuning) teaches no usual; peers judge it.
        g.own.push(rows, np.where(known & (step > (self.first_step or 0)), val - mom[:, 0],
                                  np.nan))
        g.ts.append(ts)
        g.steps.append(step)
        del g.ts[:-sp.width], g.steps[:-sp.width]
        lo, far = math.log1p(cfg.min_rel), math.log1p(cfg.far_rel)
        scales = self.scales()
        z = cfg.z_min
        # Windows.test confirms a window whose mean is at least MEAN_FLOOR delta > delta / 2,
        # and its z is positive only there: with no such window no member confirms nor
        # reaches suspect_z, so the test is skipped (the same answers, most ticks).
        test_f = _may_pass(g.raw, rows, far / 2, scales)
        test_s = _may_pass(g.own, rows, lo, scales)
        if not test_f and not test_s and not 0.0 >= cfg.evidence.suspect_z:
            # Neither test runs (most ticks): no member confirms nor drifts (its z, zero, is
            # below suspect_z), every one is calm one tick more, as below.
            calm = g.calm[rows] + 1
            g.calm[rows] = calm
            due[name] = (g, rows, calm > cfg.evidence.noise_delay)
            return name, [], {}
        sigma = np.full(rows.size, max(sp.sigma_floor, g.spread))
        if test_f:
            ok_f, m_f, _, n_f = g.raw.test(rows, sigma, far, z, scales)
        else:
            ok_f = m_f = n_f = np.zeros(rows.size, dtype=bool)
        if test_s:
            ok_s, m_s, z_s, n_s = g.own.test(rows, sigma, 2 * lo, z, scales)
        else:
            ok_s = m_s = n_s = z_s = np.zeros(rows.size, dtype=bool)
        # A member drifting away (its own-past window z >= suspect_z) teaches nothing.
        calm = np.where(~(z_s >= cfg.evidence.suspect_z) & ~ok_f, g.calm[rows] + 1, 0)
        g.calm[rows] = calm
        learn = calm > cfg.evidence.noise_delay
        due[name] = (g, rows, learn)          # g.raw.learn and g.own.learn, later
        hit = ok_s | ok_f
        det: dict[int, dict[str, Any]] = {}
        conf = []
        for i in np.flatnonzero(hit).tolist():
            m = members[i]
            use_s = bool(ok_s[i])
            mean = float(m_s[i] if use_s else m_f[i])
            w = g.own if use_s else g.raw
            back = min(w.onset_back(int(rows[i]), max(mean, lo)), len(g.ts))
            conf.append(m)
            det[m] = {"rel": math.expm1(mean), "ticks": int(n_s[i] if use_s else n_f[i]),
                      "kind": "change" if use_s else "far",
                      "onset_ts": g.ts[-back - 1] if back < len(g.ts) else g.ts[0] - (
                          self.window_s or 1.0),
                      "onset_step": g.steps[-back],
                      "wait_share": float(late[i] * pend[i][1] / max(pend[i][2], 1e-9)),
                      "long": g.long}
        return name, conf, det


def _median(xs: list[float]) -> float:
    """numpy's median of a few floats (the mean of the two middle ones for an even count)."""
    a = sorted(xs)
    k = len(a) // 2
    return a[k] if len(a) % 2 else (a[k - 1] + a[k]) / 2


def _lower_half_sigma(xs: list[float]) -> float:
    """``lower_half_ref(np.array(xs))[1]`` for a group's few values, in plain floats
    (numpy's fixed cost per call is most of it on eight values): the same sort, the lower
    half's middle, the middle of the absolute deviations from it, the same float
    operations, so the same value. NaN (which a sort places apart): ``lower_half_ref``."""
    if len(xs) >= PARTITION_MIN or any(x != x for x in xs):
        return lower_half_ref(np.array(xs))[1]
    low = sorted(xs)[:max(1, (len(xs) + 1) // 2)]
    k = len(low)
    m = k // 2
    q25 = low[m] if k % 2 else 0.5 * (low[m - 1] + low[m])
    dev = sorted([abs(x - q25) for x in low])
    mid = dev[m] if k % 2 else 0.5 * (dev[m - 1] + dev[m])
    return mid / LOWER_HALF_MAD


def _may_pass(w: Windows, rows: np.ndarray, half: float, scales: tuple[int, ...]) -> bool:
    """Whether some trailing window of ``scales`` of some row has a mean above ``half``
    (delta / 2 of ``Windows.test``; a margin far above rounding): else that test
    confirms nothing and every z it returns is at most zero.

    Most ticks no value comes near: when the largest value (NaN left out) is under
    ``half`` by more than any sum of ``k`` such values can round off, no mean can pass
    and the windows are not summed (the same answer, from two reductions)."""
    k = min(max(scales), w.width)
    a = w.vals[rows, -k:]
    floor = half - 1e-9
    top = float(np.fmax.reduce(a, axis=None)) if a.size else math.nan
    if top != top:                   # every value NaN: no window holds one
        return False
    # the most a sum of k values at most ``big`` each, compared with ``floor * k``, rounds
    # off (k ulps of each term), with room to spare
    big = max(abs(top), abs(float(np.fmin.reduce(a, axis=None))))
    if top < floor - (k + 2) ** 2 * sys.float_info.epsilon * (big + abs(floor)):
        return False
    for v in a.tolist():
        tot = 0.0
        cnt = 0
        j = 0
        for x in reversed(v):
            j += 1
            if x == x:           # not NaN
                tot += x
                cnt += 1
            if j in scales and cnt and tot > floor * cnt:
                return True
    return False
