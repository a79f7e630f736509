"""A plain DDP training script with no failslow code: tests run it under `failslow run`
or with FAILSLOW_TRACE_DIR set. Gloo on CPU, a tiny MLP; every rank sleeps ``JOB_PAD_S``
per step (device time: four ranks on two cores would otherwise fight over the CPU), and
rank ``JOB_SLOW_RANK`` sleeps ``JOB_SLOW_S`` more from step ``JOB_SLOW_FROM`` on."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    steps = int(os.environ.get("JOB_STEPS", "44"))
    slow_rank = int(os.environ.get("JOB_SLOW_RANK", "-1"))
    slow_from = int(os.environ.get("JOB_SLOW_FROM", "28"))
    slow_s = float(os.environ.get("JOB_SLOW_S", "0.15"))
    pad_s = float(os.environ.get("JOB_PAD_S", "0.05"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)
    for i in range(steps):
        time.sleep(pad_s + (slow_s if rank == slow_rank and i >= slow_from else 0.0))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
