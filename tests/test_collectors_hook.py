"""The training hook in a real 4-rank PyTorch DDP job on CPU (gloo), publishing to Tansu
its default grain: step events and ``comm`` windows."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from statistics import median

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from fakes.kafka import read_events, read_messages  # noqa: E402

from failslow.collectors.publisher import Publisher  # noqa: E402
from failslow.collectors.torch_hook import TrainingHook  # noqa: E402
from failslow.schema import Topics, validate  # noqa: E402
from failslow.stack import free_port  # noqa: E402

WORLD, STEPS, SLOW_RANK, SLOW_FROM, SLOW_S = 4, 30, 2, 10, 0.03


def _rank_main(rank: int, port: int, bootstrap: str, prefix: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    pub = Publisher(bootstrap, Topics(prefix))
    hook = TrainingHook(pub, job_id="job-ddp", host=f"host{rank // 2}").install()
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = torch.nn.parallel.DistributedDataParallel(net)
    hook.instrument_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(16, 32), torch.randn(16, 8)) for _ in range(STEPS)]
    for i, (x, y) in enumerate(hook.wrap_loader(batches)):
        with hook.step(i):
            if rank == SLOW_RANK and i >= SLOW_FROM:
                time.sleep(SLOW_S)  # this rank computes slower from step SLOW_FROM on
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % 5 == 0:
                dist.all_reduce(loss.detach().clone())
            if i % 10 == 0:  # a ring of point-to-point transfers
                buf = torch.zeros(4)
                reqs = [dist.isend(torch.ones(4), (rank + 1) % WORLD),
                        dist.irecv(buf, (rank - 1) % WORLD)]
                for r in reqs:
                    r.wait()
    dist.barrier()
    hook.close()
    assert pub.close() == 0
    dist.destroy_process_group()


@pytest.mark.integration
def test_ddp_job_comm_windows_show_the_slow_rank(broker, topics):
    mp.spawn(_rank_main, args=(free_port(), broker.bootstrap, topics.prefix), nprocs=WORLD)

    steps = read_events(broker.bootstrap, topics.for_kind("step"), expect_events=WORLD * STEPS)
    for ev in steps:
        validate(ev)
    by_rank = defaultdict(dict)
    for ev in steps:
        by_rank[ev["rank"]][ev["step"]] = ev
    assert {r: sorted(s) for r, s in by_rank.items()} == {r: list(range(STEPS))
                                                           for r in range(WORLD)}

    # per step: 1 DDP all-reduce; every 5th step an explicit all-reduce; every 10th a
    # send and a recv; one barrier at the end. The default grain sums them per window.
    n_world = STEPS + STEPS // 5 + 1
    per_rank = n_world + 2 * (STEPS // 10)
    msgs = read_messages(broker.bootstrap, topics.for_kind("comm"))
    assert {key for key, _ in msgs} == {"job-ddp"}
    comm = [ev for _, evs in msgs for ev in evs]
    assert {ev["kind"] for ev in comm} == {"comm"}
    n_ops: dict[int, int] = defaultdict(int)
    world_seqs: dict[int, set] = defaultdict(set)
    p2p: dict[int, dict] = defaultdict(dict)
    grad_blocked: dict[int, dict[int, float]] = defaultdict(dict)
    for ev in comm:
        validate(ev)
        for o in ev["ops"]:
            n_ops[ev["rank"]] += o["n"]
            if o["group"] == "world":
                world_seqs[ev["rank"]] |= set(range(o["first_seq"], o["last_seq"] + 1))
            if o["op"] in ("send", "recv"):
                peer, n = p2p[ev["rank"]].get(o["op"], (o["peer"], 0))
                assert peer == o["peer"]
                p2p[ev["rank"]][o["op"]] = (peer, n + o["n"])
            if o["op"] == "allreduce" and ev["step"] is not None:
                steps_of = grad_blocked[ev["step"]]
                steps_of[ev["rank"]] = steps_of.get(ev["rank"], 0.0) + o["blocked_s"]
    assert dict(n_ops) == dict.fromkeys(range(WORLD), per_rank)
    assert dict(world_seqs) == {r: set(range(n_world)) for r in range(WORLD)}
    for r in range(WORLD):  # a ring: each rank sends to the next, receives from the previous
        assert p2p[r] == {"send": ((r + 1) % WORLD, STEPS // 10),
                          "recv": ((r - 1) % WORLD, STEPS // 10)}

    # The slow rank: the most compute per step, and the last to arrive at the gradient
    # all-reduce (so its own blocked time there is the shortest).
    def med(rank: int, field: str) -> float:
        return median(by_rank[rank][s][field] for s in range(SLOW_FROM, STEPS))

    others = [r for r in range(WORLD) if r != SLOW_RANK]
    assert med(SLOW_RANK, "compute_s") > max(med(r, "compute_s") for r in others) + SLOW_S / 2
    slow_steps = [grad_blocked[s] for s in range(SLOW_FROM, STEPS)]
    last_in = sum(min(b, key=b.__getitem__) == SLOW_RANK for b in slow_steps)
    assert last_in >= 0.8 * len(slow_steps)
    for r in range(WORLD):
        for s in by_rank[r].values():
            parts = s["compute_s"] + s["comm_s"] + s["data_s"]
            assert abs(parts - s["duration_s"]) < 1e-6
