"""The training hook sees every collective the INSTALLED torch offers, in a real 2-rank
gloo job: each public torch.distributed collective / point-to-point function and each
functional collective runs in its own step, and that step's ``comm`` windows (the
default grain) must carry its ops.

A torch release that adds a public collective fails ``test_every_public_collective_has_a_recipe``
until it has a recipe here (and the hook sees it)."""

from __future__ import annotations

import inspect
import json
import os
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")

import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from failslow.collectors.file_publisher import FilePublisher  # noqa: E402
from failslow.collectors.torch_hook import TrainingHook  # noqa: E402
from failslow.collectors.torch_seams import _PG_NOT_COMM, PG_METHODS, _guess_op  # noqa: E402
from failslow.schema import validate  # noqa: E402
from failslow.stack import free_port  # noqa: E402

WORLD = 2
# Public functions of torch.distributed that take a group but move no data.
NOT_COLLECTIVES = {"destroy_process_group", "get_backend_config", "get_backend", "get_rank",
                   "get_world_size", "new_subgroups", "get_group_rank", "get_global_rank",
                   "get_process_group_ranks", "shrink_group"}


def _public_collectives() -> set[str]:
    names = set()
    for name in c10d.__all__:
        fn = getattr(c10d, name, None)
        if not callable(fn) or not inspect.isfunction(inspect.unwrap(fn)):
            continue
        if "group" in inspect.signature(fn).parameters and name not in NOT_COLLECTIVES:
            names.add(name)
    return names | {"batch_isend_irecv"}


def _recipes(rank: int) -> dict[str, tuple[str, object]]:
    """name -> (CONTRACT op this rank must report, a call running it on every rank)."""
    W, other = WORLD, 1 - rank

    def t(n: int = 4) -> torch.Tensor:
        return torch.ones(n)

    def ts() -> list[torch.Tensor]:
        return [t() for _ in range(W)]

    def p2p(first: bool) -> None:
        (dist.send if first else dist.recv)(t(), other)

    def ip2p(first: bool) -> None:
        (dist.isend if first else dist.irecv)(t(), other).wait()

    def batch() -> None:
        ops = [dist.P2POp(dist.isend, t(), other), dist.P2POp(dist.irecv, t(), other)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    def objs(first: bool) -> None:
        if first:
            dist.send_object_list([{"r": rank}], other)
        else:
            dist.recv_object_list([None], other)

    def fc(x: object) -> None:
        for r in x if isinstance(x, list) else [x]:
            funcol.wait_tensor(r)

    g = dist.group.WORLD
    return {
        "all_reduce": ("allreduce", lambda: dist.all_reduce(t())),
        "all_reduce_coalesced": ("allreduce", lambda: dist.all_reduce_coalesced([t(), t(2)])),
        "all_gather": ("allgather", lambda: dist.all_gather(ts(), t())),
        "all_gather_coalesced": ("allgather",
                                 lambda: dist.all_gather_coalesced([[t()] for _ in range(W)],
                                                                   [t()])),
        "all_gather_object": ("allgather", lambda: dist.all_gather_object([None] * W, rank)),
        "all_gather_single": ("allgather", lambda: dist.all_gather_single(t(4 * W), t())),
        "all_gather_into_tensor": ("allgather",
                                   lambda: dist.all_gather_into_tensor(t(4 * W), t())),
        "all_to_all": ("alltoall", lambda: dist.all_to_all(ts(), ts())),
        "all_to_all_single": ("alltoall", lambda: dist.all_to_all_single(t(4 * W), t(4 * W))),
        "barrier": ("barrier", lambda: dist.barrier()),
        "monitored_barrier": ("barrier", lambda: dist.monitored_barrier()),
        "broadcast": ("broadcast", lambda: dist.broadcast(t(), src=0)),
        "broadcast_object_list": ("broadcast",
                                  lambda: dist.broadcast_object_list([rank], src=0)),
        "gather": ("reduce", lambda: dist.gather(t(), ts() if rank == 0 else None, dst=0)),
        "gather_object": ("reduce", lambda: dist.gather_object(
            rank, [None] * W if rank == 0 else None, dst=0)),
        "reduce": ("reduce", lambda: dist.reduce(t(), dst=0)),
        "reduce_scatter": ("reducescatter", lambda: dist.reduce_scatter(t(), ts())),
        "reduce_scatter_single": ("reducescatter",
                                  lambda: dist.reduce_scatter_single(t(), t(4 * W))),
        "reduce_scatter_tensor": ("reducescatter",
                                  lambda: dist.reduce_scatter_tensor(t(), t(4 * W))),
        "scatter": ("broadcast", lambda: dist.scatter(t(), ts() if rank == 0 else None, src=0)),
        "scatter_object_list": ("broadcast", lambda: dist.scatter_object_list(
            [None], [1, 2] if rank == 0 else None, src=0)),
        "send": ("send" if rank == 0 else "recv", lambda: p2p(rank == 0)),
        "recv": ("recv" if rank == 0 else "send", lambda: p2p(rank == 1)),
        "isend": ("send" if rank == 0 else "recv", lambda: ip2p(rank == 0)),
        "irecv": ("recv" if rank == 0 else "send", lambda: ip2p(rank == 1)),
        "send_object_list": ("send" if rank == 0 else "recv", lambda: objs(rank == 0)),
        "recv_object_list": ("recv" if rank == 0 else "send", lambda: objs(rank == 1)),
        "batch_isend_irecv": ("send", batch),
        "funcol.all_reduce": ("allreduce", lambda: fc(funcol.all_reduce(t(), "sum", g))),
        "funcol.all_reduce_coalesced": ("allreduce", lambda: fc(
            funcol.all_reduce_coalesced([t(), t(2)], "sum", g))),
        "funcol.all_gather_tensor": ("allgather",
                                     lambda: fc(funcol.all_gather_tensor(t(), 0, g))),
        "funcol.all_gather_into_tensor_coalesced": ("allgather", lambda: fc(
            funcol.all_gather_into_tensor_coalesced([t(), t(2)], g))),
        "funcol.reduce_scatter_tensor": ("reducescatter", lambda: fc(
            funcol.reduce_scatter_tensor(t(4 * W), "sum", 0, g))),
        "funcol.reduce_scatter_tensor_coalesced": ("reducescatter", lambda: fc(
            funcol.reduce_scatter_tensor_coalesced([t(4 * W)], "sum", [0], g))),
        "funcol.all_to_all_single": ("alltoall", lambda: fc(
            funcol.all_to_all_single(t(4 * W), None, None, g))),
        "funcol.broadcast": ("broadcast", lambda: fc(funcol.broadcast(t(), 0, g))),
    }


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    pub = FilePublisher(os.path.join(out, f"rank{rank}.jsonl"))
    hook = TrainingHook(pub, job_id="cov", host=f"host{rank}", dp_rank=rank).install()
    names = sorted(_recipes(rank))
    failed = {}
    for i, name in enumerate(names):
        with hook.step(i):
            try:
                _recipes(rank)[name][1]()  # type: ignore[operator]
            except RuntimeError as e:  # e.g. an op this backend does not implement
                failed[name] = str(e).splitlines()[0]
        dist.barrier()  # outside any step
    hook.close()
    pub.close()
    with open(os.path.join(out, f"rank{rank}.meta.json"), "w") as f:
        json.dump({"names": names, "failed": failed}, f)
    dist.destroy_process_group()


def test_every_public_collective_has_a_recipe():
    missing = _public_collectives() - set(_recipes(0))
    assert not missing, f"public collectives of torch {torch.__version__} with no recipe: {missing}"


def test_every_group_method_and_functional_op_is_wrapped():
    """A method or functional op the seams know nothing of fails here (not silently)."""
    for name in dir(dist.ProcessGroup):
        if name.startswith("_") or name.isupper() or name == "BackendType":
            continue
        known = name in PG_METHODS or name in _PG_NOT_COMM
        assert known or _guess_op(name), f"ProcessGroup.{name}: communicates? add it"
    for op in torch._C._dispatch_get_all_op_names():
        ns, _, name = op.partition("::")
        if ns == "_c10d_functional" and name not in ("wait_tensor", "_wrap_tensor_autograd"):
            assert _guess_op(name), op


@pytest.mark.integration
def test_hook_sees_every_public_collective(tmp_path):
    mp.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD)
    for rank in range(WORLD):
        meta = json.loads((tmp_path / f"rank{rank}.meta.json").read_text())
        ops_by_step: dict[int, set[str]] = defaultdict(set)
        steps = {}
        for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines():
            ev = json.loads(line)
            validate(ev)
            if ev["kind"] == "comm" and ev["step"] is not None:  # the default grain
                ops_by_step[ev["step"]].update(o["op"] for o in ev["ops"])
            elif ev["kind"] == "step":
                steps[ev["step"]] = ev
        recipes = _recipes(rank)
        unseen = {}
        for i, name in enumerate(meta["names"]):
            want = recipes[name][0]
            if name in meta["failed"]:
                continue
            if want not in ops_by_step[i]:
                unseen[name] = sorted(ops_by_step[i])
        assert not unseen, f"rank {rank}: not seen (op wanted, ops seen): {unseen}"
        # gloo implements every one of them today; one it drops must not go unnoticed
        assert not meta["failed"], meta["failed"]
        assert all(s["dp_rank"] == rank and s["comm_s"] > 0 for s in steps.values())
