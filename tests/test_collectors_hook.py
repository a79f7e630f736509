"""The training hook in a real 4-rank PyTorch DDP job on CPU (gloo), publishing to Tansu."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from statistics import median

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from fakes.kafka import read_events  # noqa: E402

from collectors.publisher import Publisher  # noqa: E402
from collectors.torch_hook import TrainingHook  # noqa: E402
from failslow.stack import free_port  # noqa: E402
from schema import Topics, validate  # noqa: E402

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


def test_ddp_job_slow_rank_visible_with_consistent_seq(broker, topics):
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
    # send and a recv; one barrier at the end
    per_rank = STEPS + STEPS // 5 + 2 * (STEPS // 10) + 1
    colls = read_events(broker.bootstrap, topics.for_kind("collective"),
                        expect_events=WORLD * per_rank)
    assert len(colls) == WORLD * per_rank
    members = defaultdict(dict)
    for ev in colls:
        validate(ev)
        members[(ev["group"], ev["seq"])][ev["rank"]] = ev
    world_ops = {k: v for k, v in members.items() if k[0] == "world"}
    assert sorted(k[1] for k in world_ops) == list(range(STEPS + STEPS // 5 + 1))
    for (_, seq), evs in world_ops.items():  # same seq = the same collective on every rank
        assert sorted(evs) == list(range(WORLD))
        assert len({(e["op"], e["bytes"], e["step"]) for e in evs.values()}) == 1, seq
    p2p = {k: v for k, v in members.items() if k[0].startswith("p2p")}
    for (group, _), evs in p2p.items():  # each send meets its recv under one seq
        assert sorted(e["op"] for e in evs.values()) == ["recv", "send"], group
        assert {e["rank"] for e in evs.values()} == {e["peer"] for e in evs.values()}

    # The slow rank: the most compute per step, and the last to arrive at the gradient
    # all-reduce (so its own wait there is the shortest).
    def med(rank: int, field: str) -> float:
        return median(by_rank[rank][s][field] for s in range(SLOW_FROM, STEPS))

    others = [r for r in range(WORLD) if r != SLOW_RANK]
    assert med(SLOW_RANK, "compute_s") > max(med(r, "compute_s") for r in others) + SLOW_S / 2
    grad = [evs for (g, _), evs in world_ops.items()
            if evs[0]["op"] == "allreduce" and evs[0]["bytes"] > 1000
            and evs[0]["step"] is not None and evs[0]["step"] >= SLOW_FROM]
    last_in = sum(min(evs.values(), key=lambda e: e["duration_s"])["rank"] == SLOW_RANK
                  for evs in grad)
    assert last_in >= 0.8 * len(grad)
    for r in range(WORLD):
        for s in by_rank[r].values():
            parts = s["compute_s"] + s["comm_s"] + s["data_s"]
            assert abs(parts - s["duration_s"]) < 1e-6
