"""How the training hook follows each op from issue to end, and what blocked the rank.

``OpTracking`` is the half of ``TrainingHook`` that the seams call back once an op is
issued: it ends each op (future callback, ``Work.wait``, ``wait_tensor``, polling, CUDA
events), sees DDP's end-of-backward wait, and turns a step's waits and ops into its
``comm_s`` with ``collectors.intervals.BlockedTime`` (see ``collectors.torch_hook``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from itertools import chain
from typing import Any

import numpy as np
import torch

from failslow.collectors.comm_windows import (
    INF,
    clip_to_issues,
    comm_records,
    split_blocked,
    summarize,
)
from failslow.collectors.intervals import BlockedTime

STEP_TIMEOUT_S = 30.0  # a step whose collectives never report is published without them


def storage_key(t: torch.Tensor) -> int:
    """What a functional collective's result and its wait have in common: the storage. A
    ``wait_tensor`` may get a view of the result (DTensor re-wraps an AsyncCollectiveTensor
    after a view op, and waits on that), another tensor object over the same memory."""
    try:
        return int(t.untyped_storage().data_ptr()) or t._cdata
    except (RuntimeError, NotImplementedError):   # no storage (a subclass, a fake tensor)
        return t._cdata


class Step:
    """One open step: its event, clock (perf_counter), ended ops and what blocked it."""

    __slots__ = ("event", "t0", "t_end", "data", "open_ops", "closed_at", "ops", "blocked",
                 "finished", "cursor", "win_t0", "in_flight", "kept", "wait_cursor",
                 "issue_cursor")

    def __init__(self, event: dict) -> None:
        self.event = event
        self.t0 = time.perf_counter()
        self.t_end = 0.0
        self.data = 0.0
        self.open_ops = 0
        self.closed_at = 0.0
        self.ops: list[Op] = []  # ended ops issued in this step
        self.blocked = BlockedTime()
        self.finished = False
        self.cursor = 0  # ops[:cursor] are in comm windows already closed
        self.win_t0 = self.t0  # start of the open comm window
        # for the next comm windows: ops issued and not ended (id -> op), ended ops that
        # may still overlap a later window's ops, waits / issues before these cursors
        # cannot matter any more
        self.in_flight: dict[int, Op] = {}
        self.kept: list[Op] = []
        self.wait_cursor = 0
        self.issue_cursor = 0


class Op:
    """One op in flight: its ``collective`` event, issue time and how it ends."""

    __slots__ = ("ev", "start", "end", "step", "work", "waited", "cuda_start")

    def __init__(self, ev: dict, start: float, step: Step | None) -> None:
        self.ev, self.start, self.end, self.step = ev, start, 0.0, step
        self.work: Any = None
        self.waited = False
        self.cuda_start: Any = None


class OpTracking:
    """Mixin: op lifecycle and step accounting; ``TrainingHook`` owns the state."""

    _lock: threading.Lock
    _step: Step | None
    _out: deque[dict]
    _works: dict[int, Op]
    _works_pending: dict[int, Op]
    _works_blocking: dict[int, Op]
    _cuda_pending: deque[tuple[Op, Any]]
    _funcol_pending: dict[int, Op]
    _ddp_queued: bool
    _ddp_last_issue: float
    _raw: bool  # publish a ``collective`` event per op
    _comm: bool  # publish ``comm`` windows
    _loose: deque[Op]  # ended ops outside any open step, for the step-less comm window
    _loose_t0: float
    _wall_off: float  # time.time() - time.perf_counter()
    _wait_t0: float
    _world_size: int | None
    _rank: int | None
    window_s: float
    job_id: str
    host: str
    gpu: int | None

    def _ddp_bucket(self, work: Any) -> None:
        """DDP's reducer waits for its buckets from C++, in a callback autograd runs at the
        end of backward, queued once the last bucket is issued. Ours, queued again from a
        first callback (autograd runs callbacks in order, new ones included), runs after
        it and sees when that wait ended: the rank was blocked from its last bucket's
        issue until then."""
        h = self._works.get(id(work))
        if h is None or h.step is None or h.cuda_start is not None:
            return  # (on a GPU the reducer's wait only orders streams: GPU time counts)
        h.waited = True
        self._ddp_last_issue = h.start
        if not self._ddp_queued:
            self._ddp_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._ddp_requeue)

    def _ddp_requeue(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._ddp_done)

    def _ddp_done(self) -> None:
        self._ddp_queued = False
        step = self._step
        if step is not None:
            with self._lock:
                step.blocked.wait(self._ddp_last_issue, time.perf_counter())

    def _on_return(self, h: Op, work: Any, t0: float, t1: float, is_async: bool) -> None:
        step = h.step
        if step is not None:
            with self._lock:
                step.open_ops += 1
                step.in_flight[id(h)] = h
            if t1 - t0 > 1e-4:  # a backend that blocks inside the call
                step.blocked.wait(t0, t1)
        if work is None:
            self._end_op(h, t1)
            return
        h.work = work
        self._works[id(work)] = h
        if h.cuda_start is not None:
            self._track_cuda(h, work)
            return
        if is_async:
            try:
                fut = work.get_future()
            except RuntimeError:  # gloo p2p works have no future
                fut = None
            if fut is not None:
                fut.add_done_callback(lambda _f: self._end_op(h, time.perf_counter()))
                return
            self._works_pending[id(h)] = h
            return
        # A blocking call's work is waited on right away: its wait ends it, with no
        # callback crossing threads; polled (slowly) in case no one ever waits.
        self._works_blocking[id(h)] = h

    def _on_wait(self, work: Any, t0: float, t1: float) -> None:
        h = self._works.get(id(work))
        polled = False
        if h is not None and h.work is work and h.cuda_start is None:
            h.waited = True  # (a CUDA wait only orders streams: its GPU time counts)
        step = self._step or (h.step if h is not None else None)
        if step is not None:
            step.blocked.wait(t0, t1)
        if h is not None:  # (gloo's reduce-scatter works never say is_completed())
            polled = (self._works_blocking.pop(id(h), None) is not None
                      or self._works_pending.pop(id(h), None) is not None)
        if polled and h is not None:
            self._end_op(h, t1)

    def _on_funcol_wait(self, tensor: Any, t0: float, t1: float) -> None:
        h = self._funcol_pending.pop(storage_key(tensor), None)
        if self._step is not None:
            with self._lock:
                self._step.blocked.wait(t0, t1)
        if h is not None and not h.end:
            if h.step is not None:
                with self._lock:
                    h.step.open_ops += 1
            self._end_op(h, t1)

    def _end_op(self, h: Op, end: float) -> None:
        h.end = end
        ev = h.ev
        ev["duration_s"] = end - h.start
        ev["ts"] = ev["start_ts"] + ev["duration_s"]
        if self._raw:
            self._out.append(ev)
        step = h.step
        if step is None or step.finished:  # (a step published without this late op)
            if h.work is not None and self._works.get(id(h.work)) is h:
                del self._works[id(h.work)]
            h.work = None
            if self._comm:
                self._loose.append(h)
        else:
            with self._lock:
                step.ops.append(h)
                step.open_ops -= 1
                step.in_flight.pop(id(h), None)

    def _drop_op(self, h: Op) -> None:
        if self._works.get(id(h.work)) is h:
            del self._works[id(h.work)]
        h.work = None
        if h.step is not None:
            with self._lock:
                h.step.open_ops -= 1
                h.step.in_flight.pop(id(h), None)

    def _track_cuda(self, h: Op, work: Any) -> None:
        end = torch.cuda.Event(enable_timing=True)

        def done(_fut: Any) -> None:
            end.record()  # inside the callback the current stream follows the work
            self._cuda_pending.append((h, end))

        work.get_future().add_done_callback(done)

    def _poll_pending(self) -> None:
        now = time.perf_counter()
        for pending in (self._works_pending, self._works_blocking):
            for h in list(pending.values()):
                if h.work is not None and h.work.is_completed():
                    if pending.pop(id(h), None) is not None:
                        self._end_op(h, now)
                elif now - h.start > STEP_TIMEOUT_S:  # never completes, never waited on
                    if pending.pop(id(h), None) is not None:
                        self._drop_op(h)
        for _ in range(len(self._cuda_pending)):
            h, end = self._cuda_pending.popleft()
            if end.query():
                # GPU time, placed at the op's issue (see the module docstring)
                self._end_op(h, h.start + h.cuda_start.elapsed_time(end) / 1000.0)
            else:
                self._cuda_pending.append((h, end))

    def _finish_step(self, s: Step) -> dict:
        ev = s.event
        s.finished = True
        for h in s.ops:
            if not h.waited:
                s.blocked.op(h.start, h.end)
            if h.work is not None and self._works.get(id(h.work)) is h:
                del self._works[id(h.work)]
            h.work = None
        duration = ev["duration_s"]
        data = min(s.data, duration)
        comm = min(s.blocked.blocked_s(s.t0, s.t_end), duration - data)
        ev["data_s"], ev["comm_s"] = data, comm
        ev["compute_s"] = max(0.0, duration - data - comm)
        return ev

    # -- comm windows (called by the publishing thread, with the lock held) ----------------

    def _comm_window(self, s: Step, t_close: float, final: bool) -> list[dict]:
        """Close ``s``'s open comm window at ``t_close`` (perf_counter): its ``comm``
        record (several past ``OPS_MAX`` entries), none when no op ended in it. Each op's
        ``blocked_s`` is its share of the step's blocked time (``split_blocked``) as known
        now; the ops open with it are the step's ended ops and those still in flight."""
        ops = s.ops[s.cursor:]
        s.cursor = len(s.ops)
        t0, s.win_t0 = s.win_t0, t_close
        if not ops:
            return []
        lo = min(h.start for h in ops)  # what ended before this cannot overlap the window
        flying = list(s.in_flight.values())
        earlier = [h for h in s.kept if h.end > lo]
        issues = sorted(s.blocked.issues[s.issue_cursor:])
        blocked = [w for w in s.blocked.waits[s.wait_cursor:] if w[1] > lo] + clip_to_issues(
            [(h.start, h.end) for h in chain(earlier, ops) if not h.waited], issues)
        if not final and self._wait_t0:  # the job is inside a wait right now
            blocked.append((self._wait_t0, t_close))
        others = [(h.start, h.end) for h in earlier] + [(h.start, INF) for h in flying]
        self._prune(s, min([t_close] + [h.start for h in flying]), ops)
        mine = np.column_stack([np.array([h.start for h in ops]), np.array([h.end for h in ops])])
        shares = split_blocked(mine, others, blocked)
        evs = [h.ev for h in ops]
        ts = max(self._wall_off + t_close, max(ev["ts"] for ev in evs))
        ev = s.event
        return comm_records(self.job_id, ev["rank"], self.host, self._wall_off + t0, ts,
                            summarize(evs, shares), step=ev["step"], step_end=final,
                            world_size=ev["world_size"], gpu=self.gpu)

    @staticmethod
    def _prune(s: Step, horizon: float, ops: list[Op]) -> None:
        """Later windows hold ops that were in flight at this close or are issued after
        it, so they begin at or after ``horizon``: what ended before it is dropped from
        their view (a step's later closes cost its new ops, not all its ops)."""
        s.kept = [h for h in chain(s.kept, ops) if h.end > horizon]
        # Both lists grow in time order (one pass over each per step, in all); the cursors
        # stop at the first entry that may still matter, whatever comes after it.
        waits, n, i = s.blocked.waits, len(s.blocked.waits), s.wait_cursor
        while i < n and waits[i][1] <= horizon:
            i += 1
        s.wait_cursor = i
        issues, n, i = s.blocked.issues, len(s.blocked.issues), s.issue_cursor
        while i + 1 < n and issues[i + 1] <= horizon:
            i += 1  # (the last issue before the horizon still clips)
        s.issue_cursor = i

    def _loose_windows(self, now: float, force: bool) -> list[dict]:
        """Ops that ended outside any open step (before the first step, between steps,
        late for a step already published), every ``window_s``: one record per step value
        (None outside steps). No waits are recorded outside steps, so an op's blocked time
        is its share of the union of these ops' own intervals."""
        if not force and now - self._loose_t0 < self.window_s:
            return []
        t0, self._loose_t0 = self._loose_t0, now
        by_step: dict[int | None, list[Op]] = {}
        while self._loose:
            h = self._loose.popleft()
            by_step.setdefault(h.ev["step"], []).append(h)
        out = []
        for step, hs in by_step.items():
            spans = [(h.start, h.end) for h in hs]
            evs = [h.ev for h in hs]
            ts = max(self._wall_off + now, max(ev["ts"] for ev in evs))
            out.extend(comm_records(self.job_id, evs[0]["rank"], self.host, self._wall_off + t0,
                                    ts, summarize(evs, split_blocked(spans, [], spans)),
                                    step=step, world_size=self._world_size, gpu=self.gpu))
        return out
