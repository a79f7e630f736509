"""Where the training hook meets torch: the seams every collective passes through.

Two seams below the public API, so a new public function cannot hide an op:

* ``ProcessGroup`` methods (``allreduce``, ``all_gather_single``, ``reduce_scatter_single``,
  ``alltoall_base``, ``send``, ``recv_anysource``, the ``*_coalesced`` ones, ...): every
  public ``torch.distributed`` function (collectives, point-to-point, ``*_object``
  helpers, ``batch_isend_irecv``, FSDP2's calls, DDP comm hooks) ends in one of them,
  called from Python on the group object. They are patched on the class, so groups
  created later are covered too. Methods the table does not know but whose names say
  they communicate are wrapped by their name (``_guess_op``).
* the functional collectives (``torch.ops._c10d_functional.*``, used by DTensor, tensor
  parallel and compiled graphs) run in C++ and call the group from C++, out of the
  first seam's sight; they get a Python kernel at the ``BackendSelect`` dispatch key,
  reached by every caller (Python, C++ autograd, Inductor), that times the call and
  redispatches. ``wait_tensor`` is the functional collectives' wait.

``Work.wait`` is patched to see the time the job actually waits on an op.

DDP's built-in gradient all-reduces go from its C++ reducer straight to the dispatcher;
``TrainingHook.instrument_ddp`` routes them through a comm hook into the first seam,
once. A BackendSelect kernel on the ``c10d::*`` ops would see them too, but costs
~25 us per op (boxing every argument into Python), against ~4 us for the Python patch.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# ProcessGroup method -> (CONTRACT op, index of the data this rank sends, index of the peer)
# (indexes count the arguments after ``self``). gather / scatter have no CONTRACT op of
# their own: rooted many-to-one is reported as ``reduce``, one-to-many as ``broadcast``.
PG_METHODS: dict[str, tuple[str, int | None, int | None]] = {
    "allreduce": ("allreduce", 0, None),
    "allreduce_coalesced": ("allreduce", 0, None),
    "allgather": ("allgather", 1, None),
    "allgather_coalesced": ("allgather", 1, None),
    "allgather_into_tensor_coalesced": ("allgather", 1, None),
    "all_gather_single": ("allgather", 1, None),
    "all_gather_single_coalesced": ("allgather", 1, None),
    "_allgather_base": ("allgather", 1, None),
    "reduce_scatter": ("reducescatter", 1, None),
    "reduce_scatter_single": ("reducescatter", 1, None),
    "reduce_scatter_single_coalesced": ("reducescatter", 1, None),
    "reduce_scatter_tensor_coalesced": ("reducescatter", 1, None),
    "_reduce_scatter_base": ("reducescatter", 1, None),
    "broadcast": ("broadcast", 0, None),
    "reduce": ("reduce", 0, None),
    "gather": ("reduce", 1, None),
    "scatter": ("broadcast", 1, None),
    "alltoall": ("alltoall", 1, None),
    "alltoall_base": ("alltoall", 1, None),
    "all_to_all_single": ("alltoall", 1, None),
    "barrier": ("barrier", None, None),
    "monitored_barrier": ("barrier", None, None),
    "send": ("send", 0, 1),
    "recv": ("recv", 0, 1),
    "recv_anysource": ("recv", 0, None),
}
# ProcessGroup methods that never move data.
_PG_NOT_COMM = {"abort", "shutdown", "set_timeout", "split_group", "merge_remote_group",
                "get_group_store", "boxed", "unbox", "rank", "size", "name",
                "use_pg_for_symm_mem_rendezvous", "group_name", "group_desc",
                "bound_device_id"}
_KEYWORDS = (("reduce_scatter", "reducescatter"), ("allreduce", "allreduce"),
             ("all_reduce", "allreduce"), ("allgather", "allgather"),
             ("all_gather", "allgather"), ("alltoall", "alltoall"),
             ("all_to_all", "alltoall"), ("broadcast", "broadcast"),
             ("barrier", "barrier"), ("isend", "send"), ("irecv", "recv"),
             ("send", "send"), ("recv", "recv"), ("scatter", "broadcast"),
             ("gather", "reduce"), ("reduce", "reduce"), ("p2p", "send"))


def _guess_op(name: str) -> str | None:
    for word, op in _KEYWORDS:
        if word in name:
            return op
    return None


def nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.nbytes
    if isinstance(x, list | tuple):
        return sum([nbytes(t) for t in x])
    return 0


def first_tensor(x: Any) -> torch.Tensor | None:
    while isinstance(x, list | tuple) and x:
        x = x[0]
    return x if isinstance(x, torch.Tensor) else None


class Seams:
    """Installs the patches; calls ``sink`` (the TrainingHook) back for each op.

    sink methods: ``_on_issue(op, group, nbytes, peer, tensor) -> handle``,
    ``_on_return(handle, work, t0, t1, is_async)``, ``_on_wait(work, t0, t1)``,
    ``_on_funcol(op, group_name, nbytes, peer, tensor, outputs, t0, t1)``,
    ``_on_funcol_wait(tensor, t0, t1)``; and ``_wait_t0``, set to the start of a wait
    while one is in progress (0.0 otherwise).
    """

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.local = threading.local()
        self._saved: list[tuple[Any, str, Any]] = []
        self._libs: list[Any] = []

    def install(self) -> None:
        pg_cls = dist.ProcessGroup
        for name in dir(pg_cls):
            if name.startswith("__") or name in _PG_NOT_COMM:
                continue
            spec = PG_METHODS.get(name)
            if spec is None:
                op = None if name.startswith("_") else _guess_op(name)
                if op is None:
                    continue
                spec = (op, 1, None)
            self._patch(pg_cls, name, self._wrap_pg(getattr(pg_cls, name), *spec))
        self._patch(dist.Work, "wait", self._wrap_wait(dist.Work.wait))
        self._install_functional()

    def uninstall(self) -> None:
        for owner, name, raw in reversed(self._saved):
            setattr(owner, name, raw)
        self._saved.clear()
        for lib in self._libs:
            lib._destroy()
        self._libs.clear()

    def _patch(self, owner: Any, name: str, fn: Callable) -> None:
        # The raw class attribute (an instancemethod descriptor) goes back on uninstall;
        # the bound builtin getattr returns would lose ``self``.
        self._saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name))))
        setattr(owner, name, fn)

    def _wrap_pg(self, fn: Callable, op: str, di: int | None, pi: int | None) -> Callable:
        sink, local = self.sink, self.local

        def method(pg: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(local, "inside", False):
                return fn(pg, *args, **kwargs)
            data = args[di] if di is not None and len(args) > di else None
            peer = args[pi] if pi is not None and len(args) > pi else None
            handle = sink._on_issue(op, pg, nbytes(data), peer, first_tensor(data))
            local.inside = True
            t0 = time.perf_counter()
            try:
                work = fn(pg, *args, **kwargs)
            finally:
                local.inside = False
            # The public functions say in their options whether they wait right away.
            opts = kwargs.get("opts", args[-1] if args else None)
            sink._on_return(handle, work, t0, time.perf_counter(),
                            getattr(opts, "asyncOp", True))
            return work

        method.__name__ = getattr(fn, "__name__", op)
        return method

    def _wrap_wait(self, fn: Callable) -> Callable:
        sink = self.sink

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = sink._wait_t0 = time.perf_counter()  # a wait in progress, for comm windows
            try:
                return fn(work, *args, **kwargs)
            finally:
                sink._on_wait(work, t0, time.perf_counter())
                sink._wait_t0 = 0.0

        return wait

    # -- functional collectives -------------------------------------------------------------

    def _install_functional(self) -> None:
        names = sorted(n.split("::")[1].split(".")[0]
                       for n in torch._C._dispatch_get_all_op_names()
                       if n.startswith("_c10d_functional::"))
        if not names:
            return
        lib = torch.library.Library("_c10d_functional", "IMPL")
        self._libs.append(lib)
        after = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
        ns = torch.ops._c10d_functional
        for name in names:
            packet = getattr(ns, name)
            for overload in packet.overloads():
                opo = getattr(packet, overload)
                key = name if overload == "default" else f"{name}.{overload}"
                if name == "wait_tensor":
                    kernel = self._funcol_wait(opo, after)
                else:
                    op = None if name.startswith("_") else _guess_op(name)
                    if op is None:
                        continue
                    kernel = self._funcol_kernel(name, op, opo, after)
                with warnings.catch_warnings():  # "overriding a kernel": ours redispatches
                    warnings.simplefilter("ignore")
                    lib.impl(key, kernel, "BackendSelect", with_keyset=True)

    def _funcol_kernel(self, name: str, op: str, opo: Any, after: Any) -> Callable:
        sink = self.sink
        redispatch = opo._handle.redispatch_boxed
        schema = [a.name for a in opo._schema.arguments]
        gi = schema.index("group_name")
        pi = next((schema.index(p) for p in ("dst", "src", "peer_list") if p in schema), None)

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            first = first_tensor(args[0])
            if first is not None and first.is_meta:  # tracing (fake tensors): no data moves
                return redispatch(keyset & after, *args, **kwargs)
            t0 = time.perf_counter()
            out = redispatch(keyset & after, *args, **kwargs)
            peer = args[pi] if pi is not None else None
            if name == "batch_p2p_ops":
                for kind, p, t in zip(args[0], args[1], args[3], strict=False):
                    sink._on_funcol(_guess_op(kind) or op, args[gi], nbytes(t), p, t,
                                    [t], t0, time.perf_counter())
            else:
                sink._on_funcol(op, args[gi], nbytes(args[0]), peer, first,
                                out if isinstance(out, list | tuple) else [out],
                                t0, time.perf_counter())
            return out

        return kernel

    def _funcol_wait(self, opo: Any, after: Any) -> Callable:
        sink = self.sink
        redispatch = opo._handle.redispatch_boxed

        def kernel(keyset: Any, tensor: Any) -> Any:
            t0 = sink._wait_t0 = time.perf_counter()
            out = redispatch(keyset & after, tensor)
            sink._on_funcol_wait(tensor, t0, time.perf_counter())
            sink._wait_t0 = 0.0
            return out

        return kernel

