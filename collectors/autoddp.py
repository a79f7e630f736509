"""Every DistributedDataParallel model's gradient all-reduces through the no-code hook.

DDP issues its bucket all-reduces from C++, out of the hook's sight, unless a comm hook
issues them from Python (``TrainingHook.instrument_ddp``). Here every DDP built while
the hook is up gets such a comm hook, doing what DDP's default does. DDP takes one comm
hook per model, once: a job that registers its own afterwards (``register_comm_hook``,
or a built-in one: ``allreduce``, ``fp16_compress``) would fail on the second call, so
those calls are caught and the job's hook becomes the one ours calls. Its collectives
still pass the hook's seams; only the end-of-backward wait is no longer told apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_patched = False


def patch_ddp(current_hook: Callable[[], Any], say: Callable[[str], None]) -> None:
    """Patch ``DistributedDataParallel`` (once per process): a DDP built while
    ``current_hook()`` returns a ``TrainingHook`` reports to it; ``say`` tells why not."""
    global _patched
    if _patched:
        return
    _patched = True
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = DDP.__init__
    register = DDP.register_comm_hook
    builtin = DDP._register_builtin_comm_hook

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        hook = current_hook()
        if hook is None:
            return
        try:
            instrument(self, hook)
        except Exception as exc:
            say(f"DDP's gradient all-reduces are not instrumented: {exc}")

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        holder = self.__dict__.get("_failslow_ddp")
        if holder is None:
            return register(self, state, hook)
        self._check_comm_hook(hook)
        holder["user"] = (hook, state)

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        holder = self.__dict__.get("_failslow_ddp")
        if holder is None:
            return builtin(self, comm_hook_type)
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        kinds = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                 dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        holder["user"] = (kinds[comm_hook_type], self.process_group)

    DDP.__init__ = __init__  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook  # type: ignore[method-assign]


def instrument(model: Any, hook: Any) -> None:
    """Register the comm hook that reports ``model``'s buckets to ``hook`` (a
    ``TrainingHook``) or hands them to the job's own comm hook once it registers one."""
    import torch.distributed as dist

    pg = model.process_group
    world = dist.get_world_size(pg)
    # the comm hook lives in the C++ reducer the model owns: it must not hold the model
    holder: dict[str, Any] = {}

    # No annotations: DDP rejects any that are not exactly GradBucket / Future, and
    # postponed (string) annotations never are.
    def allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
        user = holder.get("user")
        if user is not None:
            return user[0](user[1], bucket)
        tensor = bucket.buffer().div_(world)
        work = dist.all_reduce(tensor, group=pg, async_op=True)
        hook._ddp_bucket(work)
        return work.get_future().then(lambda fut: fut.value()[0])

    model.register_comm_hook(None, allreduce_hook)  # before the holder: DDP's own call
    model.__dict__["_failslow_ddp"] = holder
