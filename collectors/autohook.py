"""The training hook with no code in the job: started by the environment in every rank.

``failslow run -- torchrun ... train.py`` puts a start-up file on ``PYTHONPATH`` (see
``failslow.commands.run``) that calls ``boot()`` in every Python process the job starts.
With ``FAILSLOW_TRACE_DIR`` set, boot imports nothing heavy: it waits for torch to
import ``torch.distributed`` (a finder on ``sys.meta_path``) and wraps
``init_process_group``. When a rank's process group is up, the rank builds a
``TrainingHook`` writing ``collectors.runs.trace_path(...)`` and:

* counts steps from the optimizer: a global ``Optimizer.step`` post-hook ends the step
  in progress and begins the next (the first optimizer that steps; a job with several
  steps them all once per step). ``failslow.step()`` in the training loop replaces
  that when the optimizer cannot tell (several optimizers stepped at different
  rates, none at all); the Lightning and Hugging Face callbacks mark steps themselves;
* routes every ``DistributedDataParallel`` model's gradient all-reduces through the
  hook (a comm hook doing what DDP's default one does; a comm hook the job registers
  later replaces it and still runs, its collectives seen by the hook's seams);
* closes the hook (publishing what is left) before ``destroy_process_group`` and at exit.

A process it cannot instrument (no torch, never distributed, a trace file that exists)
gets one line on stderr from a rank that never started, and runs as if it were absent:
every failure inside these patches is caught and reported, never raised into the job.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from failslow.collectors.runs import (
    ENV_RUN_ID,
    ENV_TRACE_DIR,
    default_job_id,
    new_run_id,
    restart_suffix,
    trace_path,
)

_C10D = "torch.distributed.distributed_c10d"
_STORE_WAIT_S = 60.0  # how long a rank waits for rank 0's run id before picking its own
STEPS_FROM = ("optimizer", "marker", "callback")

_active: AutoHook | None = None
_patched = False
_booted = False


def say(msg: str) -> None:
    print(f"failslow: {msg}", file=sys.stderr, flush=True)


class AutoHook:
    """This process's hook, built when its process group is up.

    trace_dir: the traces' root folder; job_id: None for ``runs.default_job_id()``;
    steps_from: ``optimizer`` | ``marker`` | ``callback`` (who says where steps end).
    """

    def __init__(self, trace_dir: str | Path, job_id: str | None = None,
                 steps_from: str = "optimizer", env: Mapping[str, str] | None = None) -> None:
        if steps_from not in STEPS_FROM:
            raise ValueError(f"steps_from must be one of {STEPS_FROM}, not {steps_from!r}")
        self.env = os.environ if env is None else env
        self.trace_dir = Path(trace_dir)
        self.job_id = job_id or default_job_id(self.env)
        self.steps_from = steps_from
        self.hook: Any = None
        self.publisher: Any = None
        self.path: Path | None = None
        self.failed = False
        self._scope: Any = None
        self._optimizer: Any = None  # weakref to the optimizer whose step() ends steps
        self._handle: Any = None

    # -- starting --------------------------------------------------------------------------------

    def start(self) -> None:
        """Build and install the hook; once, after ``init_process_group``. Never raises."""
        if self.hook is not None or self.failed:
            return
        try:
            self._start()
        except Exception as exc:  # the job must run on whatever went wrong here
            self.failed = True
            say(f"not instrumenting this rank: {type(exc).__name__}: {exc}")

    def _start(self) -> None:
        import torch
        import torch.distributed as dist

        from failslow.collectors.autoddp import patch_ddp
        from failslow.collectors.file_publisher import FilePublisher
        from failslow.collectors.torch_hook import TrainingHook

        rank = dist.get_rank()
        run_id = self._run_id(rank)
        self.path = trace_path(self.trace_dir, self.job_id, run_id, rank)
        from failslow.collectors.relay import SOCKET_ENV, AgentPublisher

        # issue 31: with a host agent relaying, the rank hands its windows to it instead
        self.publisher = (AgentPublisher(self.env[SOCKET_ENV]) if self.env.get(SOCKET_ENV)
                          else FilePublisher(self.path))
        # the local GPU index joins the GPU sampler's telemetry; torchrun's LOCAL_RANK is
        # the device a rank uses by convention (the process may not have picked it yet)
        local = self.env.get("LOCAL_RANK")
        gpu = int(local) if local and local.isdigit() and torch.cuda.is_available() else None
        self.hook = TrainingHook(self.publisher, job_id=self.job_id, gpu=gpu).install()
        # torch is whole by now (and no DDP can be built before a process group)
        patch_ddp(lambda: _active.hook if _active is not None else None, say)
        self._handle = _optimizer_post_hook(self._after_optimizer_step)
        atexit.register(self.close)
        if rank == 0:
            say(f"tracing job {self.job_id!r} to {self.path.parent}/ "
                f"(failslow detect {self.path.parent}/rank*.jsonl)")

    def _run_id(self, rank: int) -> str:
        """``FAILSLOW_RUN_ID``, else rank 0's, handed to the others by the job's store."""
        if self.env.get(ENV_RUN_ID):
            return self.env[ENV_RUN_ID] + restart_suffix(self.env)
        from datetime import timedelta

        import torch.distributed.distributed_c10d as c10d

        store = c10d._get_default_store()
        key = f"failslow/run_id{restart_suffix(self.env)}"
        if rank == 0:
            store.set(key, new_run_id())
        store.wait([key], timedelta(seconds=_STORE_WAIT_S))
        return store.get(key).decode() + restart_suffix(self.env)

    # -- steps -------------------------------------------------------------------------------------

    def _after_optimizer_step(self, optimizer: Any, *_: Any) -> None:
        if self.steps_from != "optimizer":
            return
        first = self._optimizer() if self._optimizer is not None else None
        if first is None:
            self._optimizer = weakref.ref(optimizer)
        elif first is not optimizer:
            return
        self.boundary()

    def boundary(self) -> None:
        """End the step in progress (if any) and begin the next one."""
        self.end_step()
        self.begin_step()

    def begin_step(self) -> None:
        if self.hook is None or self._scope is not None:
            return
        self._scope = self.hook.step()
        self._scope.__enter__()

    def end_step(self) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(None, None, None)

    def marker(self) -> None:
        """``failslow.step()``: from now on the job's markers end steps, not its optimizer."""
        if self.steps_from == "optimizer":
            self.steps_from = "marker"
        self.boundary()

    # -- the end -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Publish what is left and close the file; a step still open is dropped (it
        would hold the teardown). Idempotent."""
        hook, self.hook = self.hook, None
        if hook is None:
            return
        self._scope = None
        if self._handle is not None:
            self._handle.remove()
        try:
            hook.close(timeout=2.0)
        finally:
            self.publisher.close()


def _optimizer_post_hook(fn: Any) -> Any:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    return register_optimizer_step_post_hook(fn)


def active() -> AutoHook | None:
    return _active


def activate(trace_dir: str | Path | None = None, job_id: str | None = None,
             steps_from: str = "optimizer") -> AutoHook:
    """The process's AutoHook (made on the first call; later calls may switch who marks
    steps to ``callback``). Starts it now when the process group is already up."""
    global _active
    if _active is None:
        where = trace_dir or os.environ.get(ENV_TRACE_DIR) or "failslow-traces"
        _active = AutoHook(where, job_id, steps_from)
    elif steps_from == "callback":
        _active.steps_from = "callback"
    _patch_when_imported()
    start_if_up()
    return _active


def start_if_up(say_why_not: bool = False) -> None:
    """Start the hook when the process group is up; else, with ``say_why_not``, say once
    that this process is not instrumented (a trainer running a single process)."""
    c10d = sys.modules.get(_C10D)
    if _active is None:
        return
    if c10d is not None and c10d.is_initialized():
        _active.start()
    elif say_why_not and not _active.failed:
        _active.failed = True
        say("not instrumenting: torch.distributed is not initialized (a single-process run)")


def boot(env: Mapping[str, str] | None = None) -> None:
    """Called at interpreter start: arm the hook when ``FAILSLOW_TRACE_DIR`` is set.
    Never raises (it runs before the job's first line)."""
    global _booted
    env = os.environ if env is None else env
    if _booted or not env.get(ENV_TRACE_DIR):
        return
    _booted = True
    try:
        activate(env[ENV_TRACE_DIR])
    except Exception as exc:
        say(f"not instrumenting: {type(exc).__name__}: {exc}")
        return
    if "RANK" in env:  # a rank of a launched job (not the launcher, not a loader worker)
        atexit.register(_report_never_started)


def _report_never_started() -> None:
    import multiprocessing

    if (_active is None or _active.path is not None or _active.failed
            or multiprocessing.parent_process() is not None):  # a loader worker, say
        return
    why = ("torch was never imported" if _C10D not in sys.modules
           else "torch.distributed.init_process_group was never called")
    say(f"not instrumented: {why}")


# -- patching torch ----------------------------------------------------------------------------


class _AfterImport:
    """Runs ``_patch_torch`` right after torch.distributed's c10d module is executed: a
    finder and loader by their methods (``importlib.abc`` would cost ~20 ms at start-up)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _C10D:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                self._loader = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            _patch_torch(module)
        except Exception as exc:
            say(f"not instrumenting: patching torch.distributed failed: {exc}")


def _patch_when_imported() -> None:
    c10d = sys.modules.get(_C10D)
    if c10d is not None:
        _patch_torch(c10d)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _patch_torch(c10d: Any) -> None:
    global _patched
    if _patched:
        return
    _patched = True
    init, destroy = c10d.init_process_group, c10d.destroy_process_group

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = init(*args, **kwargs)
        start_if_up()
        return out

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if _active is not None and (not args and kwargs.get("group") is None):
            try:
                _active.close()
            except Exception as exc:
                say(f"closing the hook failed: {exc}")
        return destroy(*args, **kwargs)

    c10d.init_process_group = init_process_group
    c10d.destroy_process_group = destroy_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "init_process_group"):
        setattr(dist, "init_process_group", init_process_group)  # noqa: B010 - a module
        setattr(dist, "destroy_process_group", destroy_process_group)  # noqa: B010
