"""The training hook: ``step`` events and ``comm`` windows from inside a PyTorch job.

What it publishes is its *grain* (``grain=`` / ``FAILSLOW_HOOK_GRAIN``): ``comm`` (the
default) sums the ops that ended in a window, one record per rank per window, closed at
every step end and every ``window_s`` (default 1 s) inside a step (the publishing
thread's timer), one entry per (group, op, peer) whose ``blocked_s`` shares each blocked
instant equally among the ops open then (``collectors.comm_windows``), so concurrent ops
never double count; ``collective`` publishes one event per op (debugging, small jobs);
``both`` publishes both.

Needs the optional extra ``failslow[torch]``. ``install()`` patches the seams every
collective passes through (``collectors.torch_seams``): the ``ProcessGroup`` methods
that every public ``torch.distributed`` collective and point-to-point call ends in
(``*_single``, ``*_coalesced``, ``*_object``, ``batch_isend_irecv`` and FSDP2's calls
included), the functional collectives (``torch.ops._c10d_functional``: DTensor, tensor
parallel, compiled graphs) and ``Work.wait``. ``instrument_ddp(model)`` routes DDP's
gradient all-reduces (issued from C++, out of Python's sight) through the first seam
with a comm hook that does what DDP's default hook does.

Timing never synchronizes the job:

* CPU tensors (gloo): an op runs from its issue until its work's future completes (or,
  where gloo offers no future, as p2p works, until the background thread sees
  ``is_completed()``, within ~1 ms). A functional collective ends when ``wait_tensor``
  on its result returns (an upper bound: it was done by then).
* CUDA tensors: a pair of CUDA events on the current stream; the background thread
  reads ``elapsed_time`` once ``query()`` says the end event has passed.

``seq`` is counted per group when an op is issued, so the same collective has the same
``seq`` on every member (members issue collectives in the same order, as
torch.distributed requires). Point-to-point ops count per rank pair (global ranks), in
a group named ``p2p<lo>-<hi>``; a group is named ``world`` (the default group), by
``name_group``, or ``pg<torch group name>``.

What a step event's times mean (seconds, on this rank, from the step's start to its end):

* ``duration_s``: wall time of the step, including the wait for its batch.
* ``data_s``: time waiting for input (``wrap_loader`` / ``data()``).
* ``comm_s``: time the rank was BLOCKED on communication, never the sum of op
  durations: the union (each instant counted once) of (a) the time spent inside
  ``Work.wait()`` / ``wait_tensor`` and inside the issuing calls; (b) under DDP
  (``instrument_ddp``), the end-of-backward wait of its reducer: from the last bucket's
  issue until the reducer's wait for the buckets returned (seen by an autograd callback
  queued behind the reducer's); (c) for other async ops no one was seen waiting on,
  the part after the last op issued before the op ended (while the job still issues
  work it is computing). Under DDP, bucket all-reduces overlapped by backward cost
  nothing; a healthy rank's ``comm_s`` is mostly its wait for the slowest peer, and the
  straggler's is short. Under FSDP2, it is the time its waits on all-gathers
  (prefetched ones that arrived in time cost nothing) and reduce-scatters really
  blocked; under tensor parallel, its ``wait_tensor`` time. On GPUs op intervals are
  GPU time placed at issue (the CPU runs ahead of the GPU), so there ``comm_s`` is an
  estimate.
* ``compute_s``: the rank's own work, ``duration_s - data_s - comm_s``: forward,
  backward and optimizer, including the compute that overlapped communication.

Events go to a queue; a background thread publishes them every ``flush_interval_s``,
so the training thread pays only for building a dict. The patches are in
``collectors.torch_seams``, the op lifecycle and step accounting in
``collectors.torch_ops``.

>>> hook = TrainingHook(publisher, job_id="job0", dp_rank=0).install()  # doctest: +SKIP
>>> hook.instrument_ddp(ddp_model)                               # doctest: +SKIP
>>> for batch in hook.wrap_loader(loader):                      # doctest: +SKIP
...     with hook.step():
...         loss = ddp_model(batch).sum(); loss.backward(); opt.step()
>>> hook.close()                                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from failslow.collectors.actions import ActionsMixin
from failslow.collectors.comm_windows import resolve_grain
from failslow.collectors.torch_ops import STEP_TIMEOUT_S, Op, OpTracking, Step, storage_key
from failslow.collectors.torch_seams import Seams

_FUNCOL_PENDING_MAX = 4096  # functional results never waited on are forgotten past this


class StepScope(contextlib.ContextDecorator):
    """``with hook.step():`` or ``@hook.step()``; a decorator numbers steps itself."""

    def __init__(self, hook: TrainingHook, step: int | None, tokens: int | None) -> None:
        self.hook, self.step, self.tokens = hook, step, tokens

    def _recreate_cm(self) -> StepScope:
        return StepScope(self.hook, self.step, self.tokens)

    def __enter__(self) -> StepScope:
        self.hook._begin_step(self.step, self.tokens)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.hook._end_step()


class TrainingHook(OpTracking, ActionsMixin):
    """Instruments one rank of a torch.distributed job and publishes its events.

    publisher: anything with ``publish(list[dict])`` (a ``collectors.publisher.Publisher``,
    or a ``collectors.file_publisher.FilePublisher`` for a JSON Lines trace).
    job_id: the job's id. rank / world_size / host / gpu: default to torch.distributed's
    view and this host. dp_rank / pp_rank / tp_rank: this rank's place in the parallel
    layout (also ``set_layout`` / ``set_layout_from_mesh``), carried by step events.
    flush_interval_s: how often the background thread publishes, seconds (and checks
    whether a window is due). grain: ``comm`` | ``collective`` | ``both``; window_s: the
    ``comm`` window inside a step, seconds (defaults: ``FAILSLOW_HOOK_GRAIN``,
    ``FAILSLOW_HOOK_WINDOW_S``, else ``comm`` and 1.0; ValueError on a bad value).
    """

    def __init__(self, publisher: Any, job_id: str, rank: int | None = None,
                 world_size: int | None = None, host: str | None = None,
                 gpu: int | None = None, flush_interval_s: float = 0.1,
                 dp_rank: int | None = None, pp_rank: int | None = None,
                 tp_rank: int | None = None, grain: str | None = None,
                 window_s: float | None = None) -> None:
        self.grain, self.window_s = resolve_grain(grain, window_s)
        self._raw = self.grain in ("collective", "both")
        self._comm = self.grain in ("comm", "both")
        self.publisher = publisher
        self.job_id = job_id
        self._rank, self._world_size = rank, world_size
        self.host = host or socket.gethostname()
        self.gpu = gpu
        self.flush_interval_s = flush_interval_s
        self.dp_rank, self.pp_rank, self.tp_rank = dp_rank, pp_rank, tp_rank
        self._names: dict[int, str] = {}
        self._groups: dict[int, tuple[str, int, Any]] = {}
        self._funcol_groups: dict[str, Any] = {}
        self._seq: dict[str, int] = {}
        self._out: deque[dict] = deque()
        self._loose: deque[Op] = deque()
        self._wait_t0 = 0.0  # start of the wait the job is in (perf_counter), 0.0: none
        self._loose_t0 = time.perf_counter()
        self._wall_off = time.time() - time.perf_counter()
        self._cuda_pending: deque[tuple[Op, Any]] = deque()
        self._works_pending: dict[int, Op] = {}  # id(op) -> op whose end is polled (1 ms)
        self._works_blocking: dict[int, Op] = {}  # ended by their wait; polled at 0.1 s
        self._works: dict[int, Op] = {}  # id(work) -> op, to tell which ops were waited on
        # result tensor's storage -> op: DTensor waits on a view of the result (an
        # AsyncCollectiveTensor re-wrapped by a view op), the same storage, another tensor
        self._funcol_pending: dict[int, Op] = {}
        self._steps_open: list[Step] = []
        self._step: Step | None = None
        self._next_step = 0
        self._carry_data = 0.0  # input wait measured by wrap_loader before the next step
        self._ddp_queued = False
        self._ddp_last_issue = 0.0
        self._lock = threading.Lock()
        self._seams = Seams(self)
        self._installed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- identity and layout -------------------------------------------------------------------

    @property
    def rank(self) -> int:
        if self._rank is None:
            self._rank = dist.get_rank()
        return self._rank

    @property
    def world_size(self) -> int:
        if self._world_size is None:
            self._world_size = dist.get_world_size()
        return self._world_size

    def set_layout(self, dp_rank: int | None = None, pp_rank: int | None = None,
                   tp_rank: int | None = None) -> None:
        """This rank's data-, pipeline- and tensor-parallel index (None: not in the layout)."""
        self.dp_rank, self.pp_rank, self.tp_rank = dp_rank, pp_rank, tp_rank

    def set_layout_from_mesh(self, mesh: Any, dp: str | None = "dp", pp: str | None = "pp",
                             tp: str | None = "tp") -> None:
        """Read the layout from a torch ``DeviceMesh``: this rank's coordinate along the
        dimensions named ``dp``/``pp``/``tp`` (``mesh_dim_names``); a dimension the mesh
        lacks gives None. Each such dimension's group is named ``<dp|pp|tp><lowest global
        rank in it>`` (``tp0``, ``tp2``), the same on all its members. Raises ValueError
        when the mesh has none of them."""
        names = tuple(mesh.mesh_dim_names or ())
        found: dict[str, int | None] = {}
        for field, dim in (("dp", dp), ("pp", pp), ("tp", tp)):
            found[field] = mesh.get_local_rank(dim) if dim in names else None
            if dim in names:
                group = mesh.get_group(dim)
                self.name_group(group, f"{field}{min(dist.get_process_group_ranks(group))}")
        if all(v is None for v in found.values()):
            raise ValueError(f"mesh dims {names} include none of {dp!r}, {pp!r}, {tp!r}")
        self.set_layout(found["dp"], found["pp"], found["tp"])

    def name_group(self, group: Any, name: str) -> None:
        """Name a process group (e.g. ``dp3``, ``tp0``) in the events; same on every member."""
        self._names[id(group)] = name
        self._groups.pop(id(group), None)

    def _group(self, pg: Any) -> tuple[str, int]:
        hit = self._groups.get(id(pg))
        if hit is not None and hit[2] is pg:
            return hit[0], hit[1]
        if pg is None or pg is c10d._world.default_pg:
            name = self._names.get(id(dist.group.WORLD), "world")
        else:
            name = self._names.get(id(pg)) or f"pg{pg.group_name}"
        size = pg.size() if pg is not None else self.world_size
        self._groups[id(pg)] = (name, size, pg)  # keeps pg alive: ids are never reused
        return name, size

    # -- installing ------------------------------------------------------------------------------

    def install(self) -> TrainingHook:
        """Patch the seams and start the publishing thread."""
        if self._installed:
            return self
        self._seams.install()
        self._installed = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="failslow-hook",
                                            daemon=True)
            self._thread.start()
        return self

    def uninstall(self) -> None:
        self._seams.uninstall()
        self._installed = False

    def instrument_ddp(self, model: Any, process_group: Any = None) -> None:
        """Send a DistributedDataParallel model's gradient all-reduces through the hook."""
        world = dist.get_world_size(process_group)

        # No annotations: DDP rejects any that are not exactly GradBucket / Future, and
        # postponed (string) annotations never are.
        def allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
            tensor = bucket.buffer().div_(world)
            work = dist.all_reduce(tensor, group=process_group, async_op=True)
            self._ddp_bucket(work)
            return work.get_future().then(lambda fut: fut.value()[0])

        model.register_comm_hook(None, allreduce_hook)

    def close(self, timeout: float = 10.0) -> None:
        """Unpatch, publish what is left (waiting up to ``timeout`` s for open ops)."""
        self.uninstall()
        deadline = time.monotonic() + timeout
        while ((self._cuda_pending or self._works_pending or self._works_blocking)
               and time.monotonic() < deadline):
            time.sleep(0.005)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._publish_ready(force=True)

    # -- callbacks from the seams ------------------------------------------------------------------

    def _on_issue(self, op: str, pg: Any, nbytes: int, peer: Any, tensor: Any,
                  now: float | None = None) -> Op:
        if now is None:
            now = time.perf_counter()
        if op in ("send", "recv") and peer is not None:
            if pg is not None and pg is not c10d._world.default_pg:
                peer = dist.get_global_rank(pg, int(peer))
            lo, hi = sorted((self.rank, int(peer)))
            name, size = f"p2p{lo}-{hi}", 2
        else:
            name, size = self._group(pg)
        seq = self._seq.get(name, 0)
        self._seq[name] = seq + 1
        step = self._step
        rank = self._rank if self._rank is not None else self.rank
        ev = {"v": 1, "kind": "collective", "ts": 0.0, "job_id": self.job_id,
              "rank": rank, "host": self.host, "group": name, "group_size": size,
              "op": op, "seq": seq, "start_ts": time.time(), "duration_s": 0.0,
              "bytes": nbytes, "step": step.event["step"] if step else None,
              "peer": int(peer) if peer is not None else None, "gpu": self.gpu}
        h = Op(ev, now, step)
        if step is not None:
            step.blocked.issue(now)
        if tensor is not None and tensor.is_cuda:
            h.cuda_start = torch.cuda.Event(enable_timing=True)
            h.cuda_start.record()
        return h

    def _on_funcol(self, op: str, group: Any, nbytes: int, peer: Any, tensor: Any,
                   outputs: list, t0: float, t1: float) -> None:
        pg = self._funcol_groups.get(group) if isinstance(group, str) else None
        if pg is None:
            if isinstance(group, str):
                pg = self._funcol_groups[group] = c10d._resolve_process_group(c10d.GroupName(group))
            elif isinstance(group, dist.ProcessGroup):
                pg = group
            else:  # a ScriptObject from the dispatcher
                pg = dist.ProcessGroup.unbox(group)
        h = self._on_issue(op, pg, nbytes, peer, None, t0)
        h.waited = True  # only its wait_tensor blocks the rank
        if h.step is not None:
            with self._lock:
                h.step.blocked.wait(t0, t1)
                h.step.in_flight[id(h)] = h
        pending = self._funcol_pending
        for out in outputs:
            if isinstance(out, torch.Tensor):
                pending[storage_key(out)] = h
        while len(pending) > _FUNCOL_PENDING_MAX:
            del pending[next(iter(pending))]

    # -- steps ---------------------------------------------------------------------------------

    def step(self, step: int | None = None, tokens: int | None = None) -> StepScope:
        """Context manager / decorator around one training step (numbered 0, 1, ... if None)."""
        return StepScope(self, step, tokens)

    def _begin_step(self, step: int | None, tokens: int | None) -> None:
        n = self._next_step if step is None else step
        self._next_step = n + 1
        # a backward that raised never ran DDP's end-of-backward callbacks: no wait is
        # pending across steps (else windows would wait for it and buckets never queue)
        self._ddp_queued = False
        ev = {"v": 1, "kind": "step", "ts": 0.0, "job_id": self.job_id, "rank": self.rank,
              "world_size": self.world_size, "host": self.host, "step": n,
              "duration_s": 0.0, "gpu": self.gpu, "tokens": tokens,
              "dp_rank": self.dp_rank, "pp_rank": self.pp_rank, "tp_rank": self.tp_rank}
        self._stamp_share(ev)
        s = Step(ev)
        # The wait for this step's batch happened just before it: it belongs to the step.
        s.t0 -= self._carry_data
        s.win_t0 = s.t0
        s.data, self._carry_data = self._carry_data, 0.0
        self._step = s

    def _end_step(self) -> None:
        s = self._step
        if s is None:
            return
        self._step = None
        s.t_end = time.perf_counter()
        s.event["ts"] = time.time()
        s.event["duration_s"] = s.t_end - s.t0
        with self._lock:
            s.closed_at = time.monotonic()
            self._steps_open.append(s)

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        """Time spent waiting for input inside the current step."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self._step is not None:
                self._step.data += time.perf_counter() - t0

    def wrap_loader(self, loader: Iterable) -> Iterator:
        """Iterate ``loader``; time waiting for each batch counts as data time of the step
        that starts right after it."""
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self._carry_data += time.perf_counter() - t0
            yield item

    # -- background publishing ----------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._poll_pending()
            self._publish_ready()
            busy = self._works_pending or self._cuda_pending
            self._stop.wait(0.001 if busy else self.flush_interval_s)

    def _publish_ready(self, force: bool = False) -> None:
        batch = []
        while self._out:
            batch.append(self._out.popleft())
        now, perf = time.monotonic(), time.perf_counter()
        with self._lock:
            keep = []
            for s in self._steps_open:
                if s.open_ops and not force and now - s.closed_at < STEP_TIMEOUT_S:
                    keep.append(s)
                    continue
                if self._comm:
                    batch += self._comm_window(s, s.t_end, final=True)
                batch.append(self._finish_step(s))
            self._steps_open = keep
            if self._comm:
                current = self._step
                # (while DDP's reducer may be waiting, in C++, the window waits for it)
                if (current is not None and not current.t_end and not self._ddp_queued
                        and perf - current.win_t0 >= self.window_s):
                    batch += self._comm_window(current, perf, final=False)
                batch += self._loose_windows(perf, force)
        if batch:
            self.publisher.publish(batch)
