"""The training hook: ``step`` and ``collective`` events from inside a PyTorch job.

Needs the optional extra ``failslow[torch]``. ``install()`` wraps the
``torch.distributed`` collectives and point-to-point calls (all_reduce,
all_gather[_into_tensor], reduce_scatter[_tensor], broadcast, reduce,
all_to_all[_single], barrier, send, recv, isend, irecv) in both
``torch.distributed`` and ``torch.distributed.distributed_c10d``.
``instrument_ddp(model)`` routes DDP's gradient all-reduces (issued from C++,
out of Python's sight) through the wrapped ``all_reduce`` with a comm hook that
does what DDP's default hook does.

Timing never synchronizes the job:

* CPU tensors (gloo): wall clock around a blocking call; for ``async_op=True``,
  until the work's future completes (or, where gloo offers no future, as p2p
  works, until the background thread sees ``is_completed()``, within ~1 ms).
* CUDA tensors: a pair of CUDA events on the current stream; the background
  thread reads ``elapsed_time`` once ``query()`` says the end event has passed.

``seq`` is counted per group on the calling thread, so the same collective has
the same ``seq`` on every member (members issue collectives in the same order,
as torch.distributed requires). Point-to-point ops count per rank pair, in a
group named ``p2p<lo>-<hi>``; a group is named ``world`` (the default group),
by ``name_group``, or ``pg<torch group name>``.

Per step, ``comm_s`` is the time spent in collectives ended within the step
(with DDP's overlap it can cover compute; it is capped at the step minus
``data_s``), ``data_s`` the time in ``data()`` / ``wrap_loader``, and
``compute_s`` the rest. Events go to a queue; a background thread publishes them
every ``flush_interval_s``, so the training thread pays only for building a dict.

>>> hook = TrainingHook(publisher, job_id="job0").install()     # doctest: +SKIP
>>> hook.instrument_ddp(ddp_model)                               # doctest: +SKIP
>>> for batch in hook.wrap_loader(loader):                      # doctest: +SKIP
...     with hook.step():
...         loss = ddp_model(batch).sum(); loss.backward(); opt.step()
>>> hook.close()                                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

# torch function -> (CONTRACT op, parameter holding the data sent, peer parameter)
_OPS: dict[str, tuple[str, str | None, str | None]] = {
    "all_reduce": ("allreduce", "tensor", None),
    "all_gather": ("allgather", "tensor", None),
    "all_gather_into_tensor": ("allgather", "input_tensor", None),
    "reduce_scatter": ("reducescatter", "input_list", None),
    "reduce_scatter_tensor": ("reducescatter", "input", None),
    "broadcast": ("broadcast", "tensor", None),
    "reduce": ("reduce", "tensor", None),
    "all_to_all": ("alltoall", "input_tensor_list", None),
    "all_to_all_single": ("alltoall", "input", None),
    "barrier": ("barrier", None, None),
    "send": ("send", "tensor", "dst"),
    "recv": ("recv", "tensor", "src"),
    "isend": ("send", "tensor", "dst"),
    "irecv": ("recv", "tensor", "src"),
}
_ALWAYS_ASYNC = {"isend", "irecv"}
_STEP_TIMEOUT_S = 30.0  # a step whose collectives never report is published without them


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_nbytes(t) for t in x)
    return 0


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, list | tuple) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


class _Step:
    __slots__ = ("event", "t0", "comm", "data", "open_ops", "closed", "closed_at")

    def __init__(self, event: dict) -> None:
        self.event = event
        self.t0 = time.perf_counter()
        self.comm = 0.0
        self.data = 0.0
        self.open_ops = 0
        self.closed = False
        self.closed_at = 0.0


class _StepScope(contextlib.ContextDecorator):
    """``with hook.step():`` or ``@hook.step()``; a decorator numbers steps itself."""

    def __init__(self, hook: TrainingHook, step: int | None, tokens: int | None) -> None:
        self.hook, self.step, self.tokens = hook, step, tokens

    def _recreate_cm(self) -> _StepScope:
        return _StepScope(self.hook, self.step, self.tokens)

    def __enter__(self) -> _StepScope:
        self.hook._begin_step(self.step, self.tokens)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.hook._end_step()


class TrainingHook:
    """Instruments one rank of a torch.distributed job and publishes its events.

    publisher: anything with ``publish(list[dict])`` (a ``collectors.publisher.Publisher``).
    job_id: the job's id. rank / world_size / host / gpu: default to torch.distributed's
    view and this host. flush_interval_s: how often the background thread publishes, seconds.
    """

    def __init__(self, publisher: Any, job_id: str, rank: int | None = None,
                 world_size: int | None = None, host: str | None = None,
                 gpu: int | None = None, flush_interval_s: float = 0.1) -> None:
        self.publisher = publisher
        self.job_id = job_id
        self._rank, self._world_size = rank, world_size
        self.host = host or socket.gethostname()
        self.gpu = gpu
        self.flush_interval_s = flush_interval_s
        self._names: dict[int, str] = {}
        self._seq: dict[str, int] = {}
        self._out: deque[dict] = deque()
        self._cuda_pending: deque[tuple[dict, Any, Any, _Step | None]] = deque()
        self._works_pending: list[tuple[dict, Any, float, _Step | None]] = []
        self._steps_open: list[_Step] = []
        self._step: _Step | None = None
        self._next_step = 0
        self._carry_data = 0.0  # input wait measured by wrap_loader before the next step
        self._lock = threading.Lock()
        self._local = threading.local()
        self._originals: dict[tuple[Any, str], Callable] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- identity ----------------------------------------------------------------------------

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

    def name_group(self, group: Any, name: str) -> None:
        """Name a process group (e.g. ``dp3``, ``tp0``) in the events; same on every member."""
        self._names[id(group)] = name

    def _group(self, group: Any) -> tuple[str, int]:
        if group is None or group is dist.group.WORLD:
            return self._names.get(id(dist.group.WORLD), "world"), self.world_size
        name = self._names.get(id(group))
        if name is None:
            name = self._names[id(group)] = f"pg{group.group_name}"
        return name, dist.get_world_size(group)

    # -- installing ------------------------------------------------------------------------------

    def install(self) -> TrainingHook:
        """Wrap the torch.distributed calls and start the publishing thread."""
        if self._originals:
            return self  # already installed
        for name in _OPS:
            original: Callable = getattr(c10d, name)
            wrapped = self._wrap(name, original)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    self._originals[(module, name)] = original
                    setattr(module, name, wrapped)
        self._thread = threading.Thread(target=self._serve, name="failslow-hook", daemon=True)
        self._thread.start()
        return self

    def uninstall(self) -> None:
        for (module, name), original in self._originals.items():
            setattr(module, name, original)
        self._originals.clear()

    def instrument_ddp(self, model: Any, process_group: Any = None) -> None:
        """Send a DistributedDataParallel model's gradient all-reduces through the hook."""
        world = dist.get_world_size(process_group)

        # No annotations: DDP rejects any that are not exactly GradBucket / Future, and
        # postponed (string) annotations never are.
        def allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
            tensor = bucket.buffer().div_(world)
            work = dist.all_reduce(tensor, group=process_group, async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])

        model.register_comm_hook(None, allreduce_hook)

    def close(self, timeout: float = 10.0) -> None:
        """Unwrap, publish what is left (waiting up to ``timeout`` s for open ops)."""
        self.uninstall()
        deadline = time.monotonic() + timeout
        while (self._cuda_pending or self._works_pending) and time.monotonic() < deadline:
            time.sleep(0.005)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._publish_ready(force=True)

    # -- the wrapper -------------------------------------------------------------------------

    def _wrap(self, name: str, fn: Callable) -> Callable:
        op, data_param, peer_param = _OPS[name]
        params = list(inspect.signature(fn).parameters)
        di = params.index(data_param) if data_param else None
        gi = params.index("group")
        ai = params.index("async_op") if "async_op" in params else None
        pi = params.index(peer_param) if peer_param else None
        always_async = name in _ALWAYS_ASYNC
        local = self._local

        def arg(args: tuple, kwargs: dict, i: int | None, key: str | None) -> Any:
            if i is None:
                return None
            return kwargs[key] if key in kwargs else (args[i] if len(args) > i else None)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(local, "inside", False):  # a wrapped call made by another one
                return fn(*args, **kwargs)
            data = arg(args, kwargs, di, data_param)
            peer = arg(args, kwargs, pi, peer_param)
            is_async = always_async or bool(arg(args, kwargs, ai, "async_op"))
            ev = self._begin_op(op, arg(args, kwargs, gi, "group"), _nbytes(data), peer)
            tensor = _first_tensor(data)
            cuda = tensor is not None and tensor.is_cuda
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            local.inside = True
            try:
                result = fn(*args, **kwargs)
            finally:
                local.inside = False
            step = self._step
            if step is not None:
                with self._lock:
                    step.open_ops += 1
            if cuda:
                self._track_cuda(ev, start, result if is_async else None, step)
            elif is_async:
                self._track_async(ev, result, t0, step)
            else:
                self._end_op(ev, time.perf_counter() - t0, step)
            return result

        return wrapper

    def _begin_op(self, op: str, group: Any, nbytes: int, peer: Any) -> dict:
        if op in ("send", "recv") and peer is not None:
            lo, hi = sorted((self.rank, int(peer)))
            name, size = f"p2p{lo}-{hi}", 2
        else:
            name, size = self._group(group)
        seq = self._seq.get(name, 0)
        self._seq[name] = seq + 1
        ev = {"v": 1, "kind": "collective", "ts": 0.0, "job_id": self.job_id,
              "rank": self.rank, "host": self.host, "group": name, "group_size": size,
              "op": op, "seq": seq, "start_ts": time.time(), "duration_s": 0.0,
              "bytes": nbytes, "step": self._step.event["step"] if self._step else None,
              "peer": int(peer) if peer is not None else None, "gpu": self.gpu}
        return ev

    def _end_op(self, ev: dict, duration: float, step: _Step | None) -> None:
        ev["duration_s"] = duration
        ev["ts"] = ev["start_ts"] + duration
        self._out.append(ev)
        if step is not None:
            with self._lock:
                step.comm += duration
                step.open_ops -= 1

    def _track_async(self, ev: dict, work: Any, t0: float, step: _Step | None) -> None:
        try:
            fut = work.get_future()
        except RuntimeError:  # gloo p2p works have no future: poll them
            with self._lock:
                self._works_pending.append((ev, work, t0, step))
            return
        fut.add_done_callback(lambda _f: self._end_op(ev, time.perf_counter() - t0, step))

    def _track_cuda(self, ev: dict, start: Any, work: Any, step: _Step | None) -> None:
        end = torch.cuda.Event(enable_timing=True)
        if work is None:
            end.record()
            self._cuda_pending.append((ev, start, end, step))
            return

        def done(_fut: Any) -> None:
            end.record()  # inside the callback the current stream follows the work
            self._cuda_pending.append((ev, start, end, step))

        work.get_future().add_done_callback(done)

    # -- steps ---------------------------------------------------------------------------------

    def step(self, step: int | None = None, tokens: int | None = None) -> _StepScope:
        """Context manager / decorator around one training step (numbered 0, 1, ... if None)."""
        return _StepScope(self, step, tokens)

    def _begin_step(self, step: int | None, tokens: int | None) -> None:
        n = self._next_step if step is None else step
        self._next_step = n + 1
        ev = {"v": 1, "kind": "step", "ts": 0.0, "job_id": self.job_id, "rank": self.rank,
              "world_size": self.world_size, "host": self.host, "step": n,
              "duration_s": 0.0, "gpu": self.gpu, "tokens": tokens}
        s = _Step(ev)
        # The wait for this step's batch happened just before it: it belongs to the step.
        s.t0 -= self._carry_data
        s.data, self._carry_data = self._carry_data, 0.0
        self._step = s

    def _end_step(self) -> None:
        s = self._step
        if s is None:
            return
        self._step = None
        duration = time.perf_counter() - s.t0
        s.event["ts"] = time.time()
        s.event["duration_s"] = duration
        with self._lock:
            s.closed, s.closed_at = True, time.monotonic()
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

    def _poll_pending(self) -> None:
        now = time.perf_counter()
        with self._lock:
            works, self._works_pending = self._works_pending, []
        for ev, work, t0, step in works:
            if work.is_completed():
                self._end_op(ev, now - t0, step)
            else:
                with self._lock:
                    self._works_pending.append((ev, work, t0, step))
        for _ in range(len(self._cuda_pending)):
            ev, start, end, step = self._cuda_pending.popleft()
            if end.query():
                self._end_op(ev, start.elapsed_time(end) / 1000.0, step)
            else:
                self._cuda_pending.append((ev, start, end, step))

    def _publish_ready(self, force: bool = False) -> None:
        batch = []
        while self._out:
            batch.append(self._out.popleft())
        now = time.monotonic()
        with self._lock:
            keep = []
            for s in self._steps_open:
                if s.open_ops and not force and now - s.closed_at < _STEP_TIMEOUT_S:
                    keep.append(s)
                    continue
                batch.append(self._finish_step(s))
            self._steps_open = keep
        if batch:
            self.publisher.publish(batch)

    def _finish_step(self, s: _Step) -> dict:
        ev = s.event
        data = min(s.data, ev["duration_s"])
        comm = min(s.comm, ev["duration_s"] - data)
        ev["data_s"], ev["comm_s"] = data, comm
        ev["compute_s"] = max(0.0, ev["duration_s"] - data - comm)
        return ev
