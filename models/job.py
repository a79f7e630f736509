"""One job's step-by-step evaluation: buffer the step events of every rank,
and once a step is complete (all ranks in, or a later step has moved on)
score every rank against its peers and its own past, confirm sustained
outliers, localize them (rank / host) and watch the job's step time for a
job-wide change point. The per-event work is a dict insert; the math runs
once per step with numpy over the ranks.

A rank's *own work* is the part of its step it did not spend blocked in
collectives: ``compute_s + data_s`` when the step carries them, else
``duration_s - comm_s``, else step time minus the time inside its collective
events, else the step time itself (only informative when ranks do not
synchronize). In synchronous training every step time equalizes, so own work
(and arrival lag) carries the signal, and a rank whose own work is normal
while it waits for a late neighbour is never blamed.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, cast

import numpy as np

from failslow.models.alignment import Collective, CollectiveAligner, listed, waited_for
from failslow.models.attribution import Attribution
from failslow.models.changepoint import BOCPD
from failslow.models.comm import CommRows, CommWindows
from failslow.models.config import JobConfig
from failslow.models.evidence import RankEvidence
from failslow.models.findings import Finding
from failslow.models.layout import Layout
from failslow.models.links import LinkMonitor
from failslow.models.localize import imbalances, localize
from failslow.models.peers import has_peers, lower_half_ref, peer_scores
from failslow.models.ranks import RankState, RankTable
from failslow.models.shares import FixedCost
from failslow.models.stats import EWMeanVar, RollingMedian, median
from failslow.models.substep import SubStep


class JobState(Attribution):
    """Everything failslow knows about one job, fed one event at a time."""

    # ranks' steps judged and not yet counted by the Detector (``take_rank_steps``); a
    # class default, so snapshots taken before it existed restore
    rank_steps = 0
    # a job that sends no step events: its derived steps (``_nostep_comm``); class
    # defaults, so snapshots taken before they existed restore
    nostep_period = 0.0          # seconds of a derived step (0: not learned yet)
    nostep_t0 = 0.0              # the derived steps' origin (job's clock)
    nostep_world = 0             # largest world_size the windows named
    # steps carrying ``samples`` (issue 32's rebalance): the step's fixed cost, estimated
    # from the job's changes of shares; a class default (None until such a step)
    fixed_cost: FixedCost | None = None
    # the ranks by host while ``rank_host`` does not change (``layout``); never pickled
    _layout: Layout | None = None

    def __init__(self, job_id: str, cfg: JobConfig) -> None:
        self.job_id = job_id
        self.cfg = cfg
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.last_step: dict[int, int] = {}
        self.progress = -1           # newest step that most ranks have reached
        self.moved: dict[int, int] = {}   # rank -> progress when its last step advanced
        self.evaluated = -1
        self.judged = 0              # steps evaluated so far
        self.host_seen: dict[str, int] = {}   # host -> last step all its ranks stood out
        self.host_firm: dict[str, int] = {}   # host -> last step its host finding was confirmed
        self.alone: set[int] = set()          # the last judged step's ranks with no peers
        self.world = 0
        # every rank's state, in arrays (rank -> RankState)
        self.ranks = RankTable(cfg.ranks.baseline_window, cfg.ranks.baseline_alpha)
        self.rank_host: dict[int, str] = {}
        self.rank_gpu: dict[int, int] = {}
        self.aligner = CollectiveAligner(cfg.links.pending_steps)
        self.comm = CommWindows(cfg.links.pending_steps)
        self.links = LinkMonitor(cfg)
        self.cpd = BOCPD(cfg.changepoint)
        self.noise = EWMeanVar(cfg.ranks.noise_alpha)  # peers' relative spread, smoothed
        self.job_step_s = 0.0        # typical healthy step time, seconds
        self.job_onset: tuple[float, int] | None = None
        self.real_steps = False      # step events seen (else steps come from collectives)
        self.synth: dict[int, list[Any]] = {}   # rank -> [step, end ts, seconds in colls]
        self.widest = 0              # largest collective group seen
        self.evidence = RankEvidence(cfg)
        self.job_hist: deque[tuple[int, float]] = deque(maxlen=cfg.cost.history_steps)
        self.job_recent = 0.0        # the job's step time, smoothed over recent steps
        self.job_clean = RollingMedian(cfg.cost.clean_window)   # while no rank stands out
        self.step_start: dict[int, float] = {}   # step -> its start (epoch s)
        self.sig_stable = np.zeros(0)          # per rank of the step: its noise (fraction)
        self._init_substep()
        self.nostep_buf: list[dict[str, Any]] = []   # windows held until the period is known
        self.nostep_acc: dict[int, list[Any]] = {}   # rank -> [step, start, blocked s, end]
        self.comm_full: list[int] = []   # steps the last add_comm judged in full (derived)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("_layout", None)       # derived from rank_host (``layout``)
        return d

    def layout(self) -> Layout:
        """The job's ranks by host (``models.layout.Layout``), made again only once
        ``rank_host`` has changed."""
        got = self._layout
        if got is None or not got.holds(self.rank_host):
            got = self._layout = Layout(self.rank_host)
        return got

    def _init_substep(self) -> None:
        self.substep = SubStep(self.cfg)
        self.sub_seen: dict[int, tuple[int, dict[str, Any]]] = {}   # rank -> (step, hit)
        self.sub_emits: dict[int, int] = {}    # rank -> sub-step judgements of its episode
        self.last_findings: list[Finding] = []  # the newest judged step's findings

    # -- ingestion (hot path) --------------------------------------------------

    def add_step(self, ev: dict[str, Any], real: bool = True
                 ) -> list[tuple[int, list[Finding], float]]:
        if real and not self.real_steps:
            self.add_step_real()
        return self._add_step(ev["step"], ev["rank"], ev["world_size"], ev)

    def add_step_row(self, b: dict[str, Any], i: int
                     ) -> list[tuple[int, list[Finding], float]]:
        """Row ``i`` of a valid ``step_batch`` (schema.batches), as ``add_step`` takes the
        ``step`` event it expands to: the step keeps ``(b, i)``, never a row made of it
        (``_gather`` reads the batch's columns)."""
        if not self.real_steps:
            self.add_step_real()
        s, r, w = b["step"], b["rank"][i], b["world_size"]
        return self._add_step(s[i] if type(s) is list else s, r,
                              w[i] if type(w) is list else w, (b, i))

    def add_step_rows(self, b: dict[str, Any], lo: int, hi: int
                      ) -> tuple[list[tuple[int, list[Finding], float]], int]:
        """Rows ``lo:hi`` of a valid ``step_batch``, as ``add_step_row`` takes them one by
        one, up to the first row that judges steps: (what it judged, the row after the
        last one taken). The rows of one step that can judge nothing (the step's ranks
        stay under half the world after them, or under the world once most ranks reached
        it) are taken in one loop: each its ``_add_step``'s dict writes, no call, no
        check of the step's progress per row."""
        if not self.real_steps:
            self.add_step_real()
        s, w = b["step"], b["world_size"]
        if type(s) is not int or type(w) is not int:   # rows of several steps: one by one
            return self.add_step_row(b, lo), lo + 1
        row: Any = self.pending.get(s)        # rank -> its event, or (batch, row)
        if row is None:
            if s <= self.evaluated:
                return [], hi              # too late: that step was already judged
            row = self.pending[s] = {}
        # rows that judge nothing even if each brings a new rank: ``_add_step`` moves
        # progress once more than half the world is in (2 * len > world), judges once all is
        room = w - 1 - len(row)
        if s > self.progress:
            room = min(room, w // 2 - len(row))
        k = min(hi - lo, room)
        ranks = b["rank"]
        if k <= 0:
            return self._add_step(s, ranks[lo], w, (b, lo)), lo + 1
        last, moved, p = self.last_step, self.moved, self.progress
        for i in range(lo, lo + k):
            r = ranks[i]
            row[r] = (b, i)
            if s > last.get(r, -1):
                moved[r] = p
            last[r] = s
        self.world = w
        return [], lo + k

    def add_step_real(self) -> None:
        """The first real step event: steps made otherwise give way. Those already judged
        (a job's setup collectives, before its first step ends: each broadcast of the
        widest group closes a derived step of milliseconds) are forgotten with all they
        taught, or every later step would be judged and priced against them."""
        if self.evaluated >= 0:
            hosts, gpus = self.rank_host, self.rank_gpu
            self.__init__(self.job_id, self.cfg)  # type: ignore[misc]
            self.rank_host, self.rank_gpu = hosts, gpus
        self.real_steps = True
        self.pending.clear()       # steps made from collectives give way to real ones
        if self.nostep_period > 0.0 or self.nostep_buf:
            # and so do steps derived from windows (models.comm keeps them by step)
            self.comm.steps.clear()
            self.nostep_acc.clear()
            self.nostep_buf = []

    def _add_step(self, s: int, r: int, world: int, ev: Any
                  ) -> list[tuple[int, list[Finding], float]]:
        row = self.pending.get(s)
        if row is None:
            if s <= self.evaluated:
                return []              # too late: that step was already judged
            row = self.pending[s] = {}
        row[r] = ev
        if s > self.last_step.get(r, -1):
            self.moved[r] = self.progress
        self.last_step[r] = s
        self.world = world
        out = []
        if s > self.progress and 2 * len(row) > self.world:
            # Most ranks reached step s. Progress is what most ranks did, not the newest
            # step of any rank: a host whose clock is behind sends its steps early in ts
            # order, and must not make the others' steps look overdue.
            self.progress = s
            out.extend(self._overdue())
        if len(row) >= self.world and s in self.pending:
            for old in sorted(k for k in self.pending if k <= s):
                out.append(self.evaluate(old))
        return out

    def _overdue(self) -> list[tuple[int, list[Finding], float]]:
        """Judge the incomplete steps most ranks left ``lag_steps`` behind, in order, with the
        ranks they have: once every rank missing from one has stalled (a rank that keeps
        reporting newer steps is late, not gone: its events come later in ts order when
        its host's clock is ahead), or once it is ``max_behind`` steps behind."""
        out = []
        p, cfg = self.progress, self.cfg
        for k in sorted(k for k in self.pending if k <= p - cfg.lag_steps):
            row = self.pending[k]
            if p - k < cfg.max_behind and any(
                    p - self.moved[r] < cfg.lag_steps for r in self.moved if r not in row):
                break
            out.append(self.evaluate(k))
        return out

    def add_collective(self, ev: dict[str, Any]) -> list[tuple[int, list[Finding], float]]:
        """A collective event that names no step: it belongs to the rank's next
        step; in a job that sends no step events at all (an NCCL-Inspector-like
        source), its collectives make the steps (``_synth_step``)."""
        if not self.real_steps:
            return self._synth_step(ev)
        self.aligner.add(ev, self.last_step.get(ev["rank"], -1) + 1)
        return []

    def add_comm(self, ev: dict[str, Any]) -> list[tuple[int, list[Finding], float]]:
        """A ``comm`` window of a rank (``models.comm``); one that names no step belongs
        to the rank's next step. Windows of a step already judged come too late.

        Returns the sub-step judgements it completes (``models.substep``), as
        ``add_step`` returns judged steps: (step, findings, ts); empty unless a member
        of a group was confirmed from windows inside a long step."""
        self.comm_full = []
        s = ev.get("step")
        if s is None:
            if not self.real_steps:
                return self._nostep_comm(ev)
            s = self.last_step.get(ev["rank"], -1) + 1
        return self._add_comm(ev, s)

    def comm_step(self, ev: dict[str, Any]) -> int:
        """The step a ``comm`` window goes to (``add_comm``): its own, a derived one in a job
        without step events (``_nostep_comm``), else the rank's next step."""
        s = ev.get("step")
        if s is not None:
            return int(s)
        r = ev["rank"]
        if not self.real_steps and self.nostep_period > 0.0:
            k = max(int((float(ev["ts"]) - self.nostep_t0) // self.nostep_period), 0)
            acc = self.nostep_acc.get(r)
            return max(k, acc[0]) if acc is not None else k
        return self.last_step.get(r, -1) + 1

    def _add_comm(self, ev: dict[str, Any], s: int) -> list[tuple[int, list[Finding], float]]:
        if s <= self.evaluated:
            return []
        c = CommRows.of_events([ev])
        self.add_comm_rows(c, [s], 0, 1)
        return [j for _, got in self.substep_rows(c, [s], 0, 1) for j in got]

    def add_comm_rows(self, c: CommRows, steps: list[int], lo: int, hi: int) -> None:
        """Windows ``lo:hi`` of ``c`` (a host's ``comm_batch`` or per-rank windows as
        columns; ``steps[i]``: row i's step, each after ``evaluated``) into the step's
        evidence (``models.comm``), and their ranks' hosts; ``substep_rows`` then."""
        self.comm.add_rows(c, steps, lo, hi)
        rank_host = self.rank_host
        for i in range(lo, hi):
            r = c.rank[i]
            if r not in rank_host:
                rank_host[r] = c.host[i]
                if c.gpu[i] is not None:
                    self.rank_gpu[r] = cast(int, c.gpu[i])

    def substep_rows(self, c: CommRows, steps: list[int], lo: int, hi: int,
                     stop: bool = False) -> list[tuple[int, list[tuple[int, list[Finding],
                                                                       float]]]]:
        """Windows ``lo:hi`` of ``c`` into the sub-step evidence (``models.substep``);
        (row, what ``add_comm`` returns for it) for the rows that judged something.
        ``stop``: return after the first such row (the caller judges it first)."""
        out = []
        i = lo
        while i < hi:
            # each row's ticks judged before the next row moves the groups on
            ticked = self.substep.add_rows(c, steps, i, hi, stop=True)
            if not ticked:
                break
            row, ticks = ticked[0]
            got = self._substep_judge(ticks, steps[row], float(c.ts[row]))
            if got:
                out.append((row, got))
                if stop:
                    break
            i = row + 1
        return out

    # -- jobs that send no step events: steps from a clock shared by all ranks --------

    def _nostep_comm(self, ev: dict[str, Any]) -> list[tuple[int, list[Finding], float]]:
        """A ``comm`` window of a job that sent no step events (``step`` null: an NCCL
        Inspector tailer). Its steps are *derived*: periods of ``nostep_windows`` producer
        windows on the job's clock, ``k = floor((ts - t0) / period)``, the same for every
        rank (ts is shared; durations stay each rank's own). A rank's derived step ends
        when its first window of a later one comes; it is then a step event of the rank
        (``add_step``, not real): its time is from the end of its previous window to the end
        of its last one, the time inside collectives the sum of its windows' ``blocked_s``,
        so own work (the part not blocked) and the group evidence of its windows
        (``models.comm``) judge it as they judge real steps, and windows of judged derived
        steps are dropped as steps are. The period is learned from the job's first windows
        (held until one rank sent ``nostep_learn`` windows): scale-free."""
        if self.nostep_period <= 0.0:
            buf = self.nostep_buf
            buf.append(ev)
            r = ev["rank"]
            if sum(e["rank"] == r for e in buf) < self.cfg.substep.nostep_learn:
                # meanwhile they are the rank's next step's, as without this clock
                self.comm.add(ev, 0)
                return []
            self.comm.steps.pop(0, None)
            spans = sorted(e["ts"] - e["window_start_ts"] for e in buf
                           if e["ts"] > e["window_start_ts"])
            w = spans[len(spans) // 2] if spans else 1.0
            self.nostep_period = self.cfg.substep.nostep_windows * w
            self.nostep_t0 = min(e["window_start_ts"] for e in buf)
            self.nostep_buf = []
            out: list[tuple[int, list[Finding], float]] = []
            for e in buf:
                out.extend(self._nostep_take(e))
            return out
        return self._nostep_take(ev)

    def _nostep_take(self, ev: dict[str, Any]) -> list[tuple[int, list[Finding], float]]:
        r = ev["rank"]
        ts = float(ev["ts"])
        k = max(int((ts - self.nostep_t0) // self.nostep_period), 0)
        acc = self.nostep_acc.get(r)
        out: list[tuple[int, list[Finding], float]] = []
        if acc is None:
            acc = self.nostep_acc[r] = [k, float(ev["window_start_ts"]), 0.0, ts]
        elif k > acc[0]:
            out.extend(self._nostep_step(r, ev, acc))
            acc[0], acc[1], acc[2] = k, acc[3], 0.0
        else:
            k = acc[0]       # a rank's windows never go back a derived step
        acc[2] += sum(e["blocked_s"] for e in ev["ops"])
        acc[3] = max(acc[3], ts)
        if ev.get("world_size"):
            self.nostep_world = max(self.nostep_world, int(ev["world_size"]))
        out.extend(self._add_comm(ev, k))
        return out

    def _nostep_step(self, r: int, ev: dict[str, Any], acc: list[Any]
                     ) -> list[tuple[int, list[Finding], float]]:
        """Rank ``r``'s derived step ``acc[0]`` as a step event (not real)."""
        world = max(self.nostep_world, len(self.rank_host))
        step = {"ts": acc[3], "job_id": self.job_id, "rank": r, "world_size": world,
                "host": ev["host"], "step": acc[0], "duration_s": max(acc[3] - acc[1], 0.0),
                "comm_s": acc[2], "gpu": ev.get("gpu")}
        out = self.add_step(step, real=False)
        self.comm_full.extend(k for k, _, _ in out)
        return out

    def _substep_judge(self, ticks: list[tuple[str, list[int], dict[int, dict[str, Any]]]], s: int,
                       ts: float) -> list[tuple[int, list[Finding], float]]:
        """Findings for members confirmed from windows inside a long step that no
        step-level finding holds yet, the first ``episode_emits`` ticks of each episode
        (then the step's own judgement carries it); the newest step's other findings go
        along unchanged, so the incidents they hold are not counted absent."""
        found: list[Finding] = []
        for group, conf, det in ticks:
            g = self.substep.groups[group]
            for m in g.pend.keys() | set(g.raw.rows):
                if m not in det:
                    self.sub_emits.pop(m, None)
            for m in conf:
                hit = det[m]
                self.sub_seen[m] = (s, hit)
                st = self.ranks.get(m)
                # Inside a long step: this one has run 1.5 windows (``models.substep``), or
                # the job's steps last that long (the step's first window is inside too).
                long = hit["long"] or self.job_step_s >= self.cfg.substep.long_windows * (
                    self.substep.window_s or 1.0)
                if not long or (st is not None and st.kind is not None):
                    continue
                k = self.sub_emits.get(m, 0) + 1
                self.sub_emits[m] = k
                if k <= self.cfg.substep.episode_emits:
                    # seconds the confirming ticks span: from the end of the tick before them
                    n = int(hit["ticks"])
                    span = g.ts[-1] - g.ts[-n - 1] if len(g.ts) > n else \
                        n * (self.substep.window_s or 1.0)
                    found.append(self._substep_finding(m, group, dict(hit, span=span), ts))
        found.extend(self._short_substep(ticks, s, ts))
        if not found:
            return []
        keys = {f.key for f in found}
        found.extend(f for f in self.last_findings if f.key not in keys)
        return [(s, found, ts)]

    def _short_substep(self, ticks: list[tuple[str, list[int], dict[int, dict[str, Any]]]],
                       s: int, ts: float) -> list[Finding]:
        """Short steps (issue 15): a member far outside its peers over its whole last step
        (``far_rel`` or more, ``far_step_z`` sigmas, a full step of evidence) that its group
        waited for in the first tick of that step (``models.substep``: the windows that
        closed on time inside it) and still waits for, not less (``far_fade_ratio``), in the
        first tick of this one, is confirmed there: a rate spread over two steps, not a
        lump (a stall's remainder fades, a one-step spike is absent from the next step).
        The two ticks sit at the same place in their steps, so they are diluted alike (the
        step's first op left out, the work still running when the window closed): they
        are compared with each other, each at least ``2 * min_rel`` (a rank's speed varies
        a few per cent inside a step). ``sustained_s`` is the time since the onset, which the
        paging policy weighs (``models.policy``)."""
        cfg = self.cfg
        if s != self.evaluated + 1 or self.job_step_s <= 0.0 \
                or self.job_step_s >= cfg.substep.long_windows * (self.substep.window_s or 1.0):
            return []
        floor = 2.0 * cfg.min_rel
        out: list[Finding] = []
        for group, _, _ in ticks:
            obs = self.substep.groups[group].obs
            if not obs or len(obs) < 2 or obs[-1][:2] != (s, ts) or obs[-2][0] != s - 1:
                continue
            before = obs[-2][2]
            for m, (rel, share) in obs[-1][2].items():
                was = before.get(m, (0.0, 0.0))[0]
                if was < floor or rel < max(floor, cfg.far_fade_ratio * was):
                    continue        # the two ticks first: most members stop here, cheaply
                st = self.ranks.get(m)
                seen = self.sub_seen.get(m)
                if (st is None or st.kind is not None or (seen is not None and seen[0] >= s)
                        or st.cusum < cfg.z_min or st.rel < cfg.far_rel or st.z < cfg.far_step_z):
                    continue
                host = self.rank_host.get(m)
                if any(h == host and r != m and (o := self.ranks.get(r)) is not None
                       and o.cusum >= cfg.z_min for r, h in self.rank_host.items()):
                    # another rank of its host stands out too: a host fault, or one still
                    # spreading over its ranks (``models.localize`` groups them)
                    continue
                onset = st.c_onset_ts if st.c_onset_ts else ts - self.job_step_s
                hit = {"rel": st.rel, "ticks": 2, "kind": "far", "onset_ts": onset,
                       "onset_step": st.c_onset_step, "wait_share": share, "long": False}
                self.sub_seen[m] = (s, hit)
                out.append(self._substep_finding(m, group, dict(hit, span=ts - onset), ts))
        return out

    def _substep_finding(self, r: int, group: str, hit: dict[str, Any], ts: float) -> Finding:
        share = min(max(hit["wait_share"], 0.0), self.cfg.evidence.wait_share_max)
        h = self.rank_host.get(r)
        g = self.rank_gpu.get(r)
        return Finding(
            key=f"slow_rank:r{r}", fault="slow_rank", confirmed=True,
            onset_ts=float(hit["onset_ts"]), onset_step=int(hit["onset_step"]),
            slowdown_pct=100.0 * share / (1.0 - share), own_pct=100.0 * hit["rel"], rank=r,
            host=h, gpu=g, hosts=[h] if h else [],
            gpus=[(h, g)] if h is not None and g is not None else [],
            lost_s=share * max(ts - float(hit["onset_ts"]), 0.0), world=self.world,
            evidence={"substep": True, "group": group, "rel_to_group": round(hit["rel"], 3),
                      "wait_share": round(share, 3), "windows": hit["ticks"],
                      "sustained_s": round(float(hit["span"]), 1), "evidence": hit["kind"]},
            rule="substep-windows")

    def _synth_step(self, ev: dict[str, Any]) -> list[tuple[int, list[Finding], float]]:
        """Steps from collectives alone: the job's widest group (by size) syncs
        every rank, so each of its collectives closes a step of the rank. The
        step lasts from the end of the rank's previous one to the end of this
        one, and the rank spent ``comm_s`` of it inside collectives (all groups)
        — both on the rank's own clock, so clock skew between hosts cancels."""
        r = ev["rank"]
        size = ev["group_size"]
        if size > self.widest:
            self.widest = size
        st = self.synth.get(r)
        if st is None:
            st = self.synth[r] = [-1, None, 0.0]
        st[2] += ev["duration_s"]
        k = st[0] + 1
        self.aligner.add(ev, k)
        if size < self.widest:
            return []
        end = ev["start_ts"] + ev["duration_s"]
        prev, comm = st[1], st[2]
        st[0], st[1], st[2] = k, end, 0.0
        if prev is None:
            return []
        step = {"ts": ev["ts"], "job_id": self.job_id, "rank": r, "world_size": self.widest,
                "host": ev["host"], "step": k, "duration_s": end - prev, "comm_s": comm,
                "gpu": ev.get("gpu")}
        return self.add_step(step, real=False)

    def take_rank_steps(self) -> int:
        """The ranks' steps judged since the last call (a count, decisions unchanged)."""
        n, self.rank_steps = self.rank_steps, 0
        return n

    def drain(self) -> list[tuple[int, list[Finding], float]]:
        return [self.evaluate(s) for s in sorted(self.pending)]

    # -- once per step -----------------------------------------------------------

    def evaluate(self, s: int) -> tuple[int, list[Finding], float]:
        """Judge step ``s``; returns (step, findings, ts of the newest event in it)."""
        row = self.pending.pop(s)
        self.evaluated = max(self.evaluated, s)
        ranks = sorted(row)
        sl = self.ranks.slots_for(ranks)
        work, data, dur, groups, ts, ts_max = self._gather(s, row, ranks)
        # the step's complete collectives (after ``_gather``: the comm windows' sums)
        colls = self.aligner.take_step(s)
        windows = self.comm.take_colls(s)
        if colls:
            colls.extend(listed(windows))
        else:
            colls = windows     # arrays, lists when read (``StepColls``: links reads arrays)
        rel, z, perf, peers, pos, rel2, z2, warm = self._scores(row, ranks, sl, work, groups)
        # ranks with no peer doing the same work (alone in their pipeline stage): their
        # z to peers is no measurement (``models.localize`` leaves it out)
        self.alone = {r for r, p in zip(ranks, peers.tolist(), strict=True) if not p}
        job_s = median(dur)
        self.judged += 1
        self.rank_steps += len(ranks)
        recent = self._states(sl, work)
        ev_ = self._verdict(ranks, sl, recent, rel, z, rel2, z2, warm, peers, job_s)
        self._waited(ev_, ranks, sl, listed(colls) if groups.min() == groups.max() else [],
                     job_s)
        # weakly present ones too: no incident, but located
        present = self._judge_ranks(s, ranks, sl, ev_, work, data, dur, ts - dur, pos, rel,
                                    z, rel2, job_s, median(data), self._job_base())
        self._learn_job(s, job_s, ts_max, bool(self.ranks.kind[sl].any()))
        findings = self._locate(s, present, ranks, perf, job_s, ts_max, colls)
        self.last_findings = findings
        for r in [r for r, (k, _) in self.sub_seen.items() if k < s]:
            del self.sub_seen[r]
        return s, findings, ts_max

    def _gather(self, s: int, row: dict[int, dict[str, Any]], ranks: list[int]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """Per rank of step ``s``: own work, input wait, step time, pipeline stage and
        event ts, and the newest event's ts; records each rank's host and GPU."""
        n = len(ranks)
        col = _step_columns([row[r] for r in ranks])
        dur = np.array(col["duration_s"], dtype=float)
        ts = np.array(col["ts"], dtype=float)
        data = np.array(col["data_s"], dtype=float)
        data[np.isnan(data)] = 0.0                     # a null data_s is none
        compute = np.array(col["compute_s"], dtype=float)
        comm = np.array(col["comm_s"], dtype=float)
        work = np.where(np.isnan(compute), dur - comm, compute + data)
        blind = np.flatnonzero(np.isnan(compute) & np.isnan(comm))
        if blind.size:
            # Steps without compute_s and comm_s: step time minus the time counted inside
            # collectives (collective events, comm windows), else the step time itself.
            take_time = self.aligner.take_time
            comm_time = self.comm.take_time if self.comm.steps else None
            for i in blind.tolist():
                r = ranks[i]
                coll = take_time(r, s)
                if comm_time is not None:
                    cc = comm_time(r, s)
                    if cc is not None:
                        coll = cc if coll is None else coll + cc
                work[i] = dur[i] - coll if coll is not None else dur[i]
        groups = np.array([x or 0 for x in col["pp_rank"]], dtype=np.int64)
        self.rank_host.update(zip(ranks, col["host"], strict=True))
        gpus = col["gpu"]
        if any(g is not None for g in gpus):
            self.rank_gpu.update((r, g) for r, g in zip(ranks, gpus, strict=True)
                                 if g is not None)
        # Time inside collectives is only counted while steps lack compute_s and comm_s.
        self.aligner.need_time = bool(blind.size)
        # Ranks given uneven shares of the batch (issue 32's rebalance: steps carry
        # ``samples``) are judged on their own work per unit of share, at the median
        # share: a rebalanced straggler stays slow until it is fast again per sample.
        share = np.array([x or 0 for x in col["samples"]], dtype=float)
        if share.min() > 0:
            work = self._per_share(share, work)
        return work, data, dur, groups, ts, max(float(ts.max()), 0.0) if n else 0.0

    def _per_share(self, share: np.ndarray, work: np.ndarray) -> np.ndarray:
        """Each rank's own work at the step's median share (steps carrying ``samples``):
        the step's fixed cost, estimated from the job's changes of shares
        (``models.shares.FixedCost``, ``[rules.ranks] share_*``), as it is, the rest scaled
        by median share / its share. A rebalanced straggler stays slow until it is fast
        again per sample, and a recovered one on a small share is not slow for its fixed
        cost. Equal shares: unchanged (and observed)."""
        if self.fixed_cost is None:
            rc = self.cfg.ranks
            self.fixed_cost = FixedCost(rc.share_steps, rc.share_spread, rc.share_fixed_max,
                                        rc.share_keep, rc.share_sets)
        self.fixed_cost.observe(share, work)
        if share.min() == share.max():
            return work
        return self.fixed_cost.normalize(share, work)

    def _scores(self, row: dict[int, dict[str, Any]], ranks: list[int], sl: np.ndarray,
                work: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each rank against its peers (rel, z, perf, whether it has peers) and against its
        own past (its position, rel2, z2, whether that past is learned)."""
        cfg = self.cfg
        n = len(ranks)
        rel, z, perf, sig = peer_scores(work, groups,
                                        floor=max(cfg.ranks.noise_floor, self.noise.mean))
        if sig > 0:
            self.noise.update(sig)
        peers = has_peers(groups)
        # Own past is kept as the rank's position against the job-wide level (the
        # faster half's median of all ranks), so a change of the whole job (a new
        # phase, longer sequences) never looks like a change of one rank.
        level = lower_half_ref(work)[0]
        pos = work / level if level > 0 else np.ones(n)
        rel2, z2, sig2, warm = self._self_scores(sl, pos)
        risen = np.flatnonzero((rel2 >= cfg.min_rel) & (z2 >= cfg.z_min / 2))
        if risen.size > max(cfg.ranks.jobwide_min, int(n * cfg.ranks.jobwide_share)) \
                and len({_host(row[ranks[i]]) for i in risen}) > 1:
            # Many ranks (an eighth or more) on several hosts rose against their own past: a
            # job-wide change (a new phase reaching the stages a step apart), not a
            # culprit. Only peers judge this step.
            rel2 = np.zeros(n)
            z2 = np.zeros(n)
            warm[:] = False
        return rel, z, perf, peers, pos, rel2, z2, warm

    def _states(self, sl: np.ndarray, work: np.ndarray) -> np.ndarray:
        """Each rank's own work, smoothed (its rows ``sl``)."""
        old = self.ranks.recent[sl]
        a = self.cfg.ranks.work_alpha
        recent = np.where(old == 0.0, work, (1.0 - a) * old + a * work)
        self.ranks.recent[sl] = recent
        return recent

    def _verdict(self, ranks: list[int], sl: np.ndarray, recent: np.ndarray,
                 rel: np.ndarray, z: np.ndarray, rel2: np.ndarray, z2: np.ndarray,
                 warm: np.ndarray, peers: np.ndarray, job_s: float) -> Any:
        """This step's windowed evidence of every rank (``RankEvidence.judge``)."""
        cfg = self.cfg
        n = len(ranks)
        # Warm-up steps (compilation, allocator, autotuning) differ from rank to rank
        # for no lasting reason: no evidence from them.
        early = self.judged <= cfg.warm_steps
        # Peers need no past: only the job's very first steps (compilation, allocator,
        # autotuning) are left to settle before they judge.
        early_peers = self.judged <= cfg.peer_warm_steps
        # Noise is learned from every step outside a finding, high ones included (a
        # noise estimate that skipped the rank's own bursts would be too small).
        clean = self.ranks.kind[sl] == 0
        if not warm.any():
            self.sig_stable = np.full(n, max(cfg.ranks.noise_floor, self.noise.mean))
        # "still there" is read only for a rank with an open finding or imbalance
        # (``_judge_ranks``: a rank confirmed this step is there; ``_imbalance``)
        return self.evidence.judge(ranks, rel, z, rel2, z2, self.sig_stable, peers,
                                   warm & ~early, early_peers,
                                   recent, job_s, max(cfg.ranks.noise_floor, self.noise.mean),
                                   clean, ~clean | self.ranks.imb[sl])

    def _waited(self, ev_: Any, ranks: list[int], sl: np.ndarray,
                colls: list[Collective], job_s: float) -> None:
        """Who the step's groups waited for (``models.alignment.waited_for``), into the
        windowed "waited for" evidence of every rank (``RankEvidence.judge_waited``). The
        job's first steps (``peer_warm_steps``: one-off work) count as none, and so do all
        steps of a pipeline layout (``evaluate`` passes no collectives where the ranks name
        several ``pp_rank``): a slow stage delays every stage of its replica, which then
        reach their data-parallel collectives late together."""
        n = len(ranks)
        top = np.full(n, np.nan)
        lag = np.zeros(n)
        if colls and self.judged > self.cfg.peer_warm_steps:
            late, members = waited_for(colls, self.cfg.evidence)
            if members:
                idx = np.fromiter((r in members for r in ranks), dtype=bool, count=n)
                top[idx] = 0.0
                pos = {r: i for i, r in enumerate(ranks)} if late else {}
                for r, t in late.items():
                    i = pos.get(r)
                    if i is not None:
                        top[i] = 1.0
                        lag[i] = t
        kinds = self.ranks.kind[sl] != 0
        other = (int(kinds.sum()) - kinds) > 0
        self.evidence.judge_waited(ev_, ranks, top, lag, other, job_s)

    def _judge_ranks(self, s: int, ranks: list[int], sl: np.ndarray, ev_: Any,
                     work: np.ndarray, data: np.ndarray, dur: np.ndarray, start: np.ndarray,
                     pos: np.ndarray, rel: np.ndarray, z: np.ndarray, rel2: np.ndarray,
                     job_s: float, dref: float, base: float) -> list[int]:
        """Every rank's step at once (rows ``sl`` of the table): confirm, open, keep or end
        its finding, update its state and baselines; returns the ranks (at least weakly)
        present. Per-rank Python runs only for ranks whose finding opens or is open, that
        hold an imbalance, or were confirmed inside the step."""
        cfg = self.cfg
        T = self.ranks
        inc = np.asarray(ev_.inc, dtype=float)
        cus = T.cusum[sl]
        new = (inc > 0) & (cus == 0.0)
        if new.any():
            T.c_onset_ts[sl[new]] = start[new]
            T.c_onset_step[sl[new]] = s
        # Capped so the evidence drains within a few steps once the fault ends.
        cus = np.minimum(np.maximum(0.0, cus + inc), cfg.confirm_z + cfg.z_min)
        T.cusum[sl] = cus
        waited_present = np.asarray(ev_.waited_present, dtype=bool)
        confirmed = (cus >= cfg.confirm_z) | np.asarray(ev_.confirmed, dtype=bool) \
            | np.asarray(ev_.waited, dtype=bool)
        if self.sub_seen:
            at = {r: i for i, r in enumerate(ranks)}
            for r, (k, hit) in self.sub_seen.items():
                j = at.get(r)
                if j is None or k < s or confirmed[j]:
                    continue
                # Confirmed inside the step from its group's windows (models.substep).
                confirmed[j] = True
                if T.kind[sl[j]] == 0 and cus[j] == 0.0:
                    T.c_onset_ts[sl[j]], T.c_onset_step[sl[j]] = hit["onset_ts"], hit["onset_step"]
        top = np.maximum(np.maximum(rel, rel2), 0.0)
        excess = work - work / (1.0 + top)
        own = np.maximum(rel, rel2)
        if waited_present.any():
            # Its group waits for it: the lag charged to it is job time, whatever its own
            # work says (noisy under overlap); its lateness against the step is its own
            # excess.
            wl = np.minimum(np.asarray(ev_.waited_lag, dtype=float),
                            cfg.evidence.wait_share_max)
            excess = np.where(waited_present, np.maximum(excess, wl * job_s), excess)
            own = np.where(waited_present, np.maximum(own, wl / (1.0 - wl)), own)
        for i in np.flatnonzero(confirmed & (T.kind[sl] == 0)):
            self._activate(RankState(T, int(sl[i])), s, ev_, int(i), base)
        streak = np.where(confirmed, T.streak[sl] + 1, 0)
        T.streak[sl] = streak
        still = confirmed | np.asarray(ev_.present, dtype=bool) | waited_present
        held = np.flatnonzero(T.kind[sl] != 0)
        if held.size:
            T.since_s[sl[held]] += job_s
            T.since_n[sl[held]] += 1
            for i in held:
                st = RankState(T, int(sl[i]))
                if still[i]:
                    st.quiet = 0
                    st.lost_s += self._extra(st, job_s, max(float(excess[i]), 0.0))
                else:
                    st.quiet += 1
                    if st.quiet >= cfg.clean_steps:
                        st.kind = None
        kind = T.kind[sl]
        # Smoothed over the life of a finding (a confirmation that comes and goes
        # with the noise does not restart them).
        fresh = (kind == 0) | ((streak == 1) & (T.quiet[sl] == 0) & (T.lost_s[sl] == 0.0))
        a, b = cfg.ranks.excess_alpha, cfg.ranks.rel_alpha
        T.excess_s[sl] = np.where(fresh, excess, (1.0 - a) * T.excess_s[sl] + a * excess)
        T.own_rel[sl] = np.where(fresh, own, (1.0 - b) * T.own_rel[sl] + b * own)
        imbalance = np.asarray(ev_.imbalance, dtype=bool)
        for i in np.flatnonzero(T.imb[sl] | (imbalance & (kind == 0))):
            self._imbalance(RankState(T, int(sl[i])), s, ev_, int(i), float(work[i]), job_s,
                            float(start[i]))
        # Input wait above both the peers' and the rank's own usual: a loader
        # that is always a little slower there is no stall.
        usual_data = np.where(T.data_n[sl] >= cfg.warm_steps, T.ew_mean("data", sl), 0.0)
        T.data_excess_s[sl] = np.maximum(data - np.maximum(dref, usual_data), 0.0)
        T.rel[sl], T.z[sl], T.self_rel[sl] = rel, z, rel2
        T.mean_excess[sl] = ev_.mean
        T.mean_z[sl] = np.maximum(ev_.z, 0.0)
        T.mean_n[sl] = ev_.n
        T.waited_share[sl], T.waited_lag[sl] = ev_.waited_share, ev_.waited_lag
        # The own-past baseline never learns a step of an open finding, nor one
        # where the rank stands out against its own past, even weakly, nor one while
        # its windowed excess is moderately high (an open but unconfirmed fault: z of 2
        # and half the smallest slowdown worth flagging) so it is not absorbed.
        rising = (ev_.z >= cfg.evidence.suspect_learn_z) & (ev_.mean >= cfg.min_rel / 2)
        weak = np.asarray(ev_.weak, dtype=bool) | np.asarray(ev_.suspect, dtype=bool)
        cus_on = T.cusum[sl] > 0
        open_ = kind != 0
        T.observe(sl, pos, work, data, dur, weak | rising | open_ | cus_on, cfg.learn_delay)
        present = open_ & (still | (streak > 0)) | ~open_ & (weak | cus_on)
        return [ranks[i] for i in np.flatnonzero(present)]

    def _locate(self, s: int, present: list[int], ranks: list[int], perf: np.ndarray,
                job_s: float, ts_max: float, colls: list[Collective]) -> list[Finding]:
        """The step's findings: located culprits, imbalances, links, the job's own change."""
        findings: list[Finding] = []
        findings.extend(localize(self, present, s, job_s, perf, ranks, colls))
        findings.extend(imbalances(self, ranks, self.job_recent or job_s))
        # issue 19 hook (owner of models/incidents.py): a link's price needs the world size,
        # carried in its evidence (refine_with_nics rebuilds the finding, keeps evidence)
        for f in self.links.evaluate(s, colls, self.rank_host, ts_max, job_s, self.layout()):
            f.world = self.world
            f.evidence["world_size"] = self.world
            findings.append(f)
        self.aligner.expire(s)
        self.comm.expire(s)
        findings.extend(self._job_level(s, job_s, ts_max, bool(findings)))
        return findings

    def _self_scores(self, sl: np.ndarray, pos: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each rank's position (own work / job level) over its own usual position,
        compared across ranks: a rank or host that got slower stands out, even
        when its peers are all on that one slow host. The noise is the larger of
        the ranks' spread and the rank's own step-to-step spread. Returns (rel, z,
        noise sigma, whether the rank's own past is learned)."""
        n = len(sl)
        work = self.ranks.work
        med = work.med[sl]
        ok = (work.n[sl] >= self.cfg.warm_steps) & (med > 0)
        safe = np.where(ok, med, 1.0)
        ratio = np.where(ok, pos / safe, 1.0)
        own = np.where(ok, work.sig[sl] / safe, 0.0)
        none = np.zeros(n)
        # Four ranks with a learned past make a reference (three in a 4-rank job: one
        # rank slow from its first steps must not leave the others unjudged).
        least = self.cfg.ranks.own_ref_min
        if n < least or ok.sum() < min(least, n - 1):
            return none, none, none, np.zeros(n, dtype=bool)
        ref, sigma = lower_half_ref(ratio[ok])
        if ref <= 0:           # most ranks did no own work this step (odd clocks): no score
            return none, none, none, np.zeros(n, dtype=bool)
        rel = np.where(ok, ratio / ref - 1.0, 0.0)
        floor = self.cfg.ranks.noise_floor
        sig = np.maximum(max(sigma / ref, floor, self.noise.mean), own)
        # The windowed tests take a stable noise: this step's spread over four ranks
        # is itself noise.
        self.sig_stable = np.maximum(max(floor, self.noise.mean), own)
        return rel, rel / sig, sig, ok

    def _job_level(self, s: int, job_s: float, ts: float, located: bool) -> list[Finding]:
        """Change point on the job's step time; a confirmed slowdown nobody in
        particular explains is a job_slowdown (info)."""
        if job_s <= 0:
            return []
        cpd = self.cpd
        cpd.update(math.log(job_s))
        if cpd.baseline.n:
            self.job_step_s = math.exp(cpd.baseline.mean)
        if cpd.drift_detected and cpd.shift > 0 and self.job_onset is None:
            start = s - cpd.run_length + 1
            self.job_onset = (ts - cpd.run_length * job_s, start)
        elif self.job_onset is not None and (not cpd.baseline.n or
                                              math.log(job_s) - cpd.baseline.mean
                                              < cpd.min_shift / 2):
            self.job_onset = None
        if self.job_onset is None or located:
            return []
        pct = 100.0 * (job_s / self.job_step_s - 1.0) if self.job_step_s else 0.0
        return [Finding(key="job_slowdown:job", fault="job_slowdown",
                        confirmed=cpd.drift_detected, onset_ts=self.job_onset[0],
                        onset_step=self.job_onset[1], slowdown_pct=max(pct, 0.0),
                        own_pct=max(pct, 0.0), rule="job-changepoint",
                        evidence={"step_s": round(job_s, 4),
                                  "baseline_step_s": round(self.job_step_s, 4),
                                  "change_prob": round(cpd.change_prob, 3)})]


# The fields of a step that ``JobState._gather`` reads, and each one's value when absent
# (a null reads the same: NaN, 0 or None, as ``_gather`` takes it).
_GATHER = (("duration_s", None), ("ts", None), ("data_s", 0.0), ("compute_s", math.nan),
           ("comm_s", math.nan), ("pp_rank", None), ("host", None), ("gpu", None),
           ("samples", None))


def _step_columns(evs: list[Any]) -> dict[str, list[Any]]:
    """Per field of ``_GATHER``, its value in each of ``evs``: ``step`` events, or rows
    ``(batch, i)`` of ``step_batch``es (``JobState.add_step_row``), a run of one batch's
    rows read from its columns at once."""
    if tuple not in set(map(type, evs)):
        return {name: [ev.get(name, d) for ev in evs] for name, d in _GATHER}
    out: dict[str, list[Any]] = {name: [] for name, _ in _GATHER}
    n = len(evs)
    i = 0
    while i < n:
        e = evs[i]
        if type(e) is not tuple:
            for name, d in _GATHER:
                out[name].append(e.get(name, d))
            i += 1
            continue
        b = e[0]
        j = i + 1
        while j < n and type(evs[j]) is tuple and evs[j][0] is b:
            j += 1
        idx = [x[1] for x in evs[i:j]]
        for name, d in _GATHER:
            c = b.get(name, d)
            if type(c) is list:
                out[name] += map(c.__getitem__, idx)
            else:
                out[name] += [c] * (j - i)
        i = j
    return out


def _host(ev: Any) -> str:
    """The host of a step: an event, or a row ``(batch, i)`` (a batch's host is shared)."""
    return ev["host"] if type(ev) is not tuple else ev[0]["host"]
