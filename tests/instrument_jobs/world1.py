"""One-rank gloo jobs that exercise the no-code hook's edge cases; run with
FAILSLOW_TRACE_DIR set (tests/test_collectors_autohook.py). ``argv[1]`` picks one:

- ``optimizers``: two optimizers step every iteration (6 iterations); only the first
  marks steps.
- ``marker``: no optimizer; ``failslow.step()`` ends each of 4 iterations.
- ``user_comm_hook``: the job registers its own DDP comm hook after DDP is built (DDP
  allows one); it must run, and the job must not fail. Prints ``user hook calls: N``.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main(mode: str) -> None:
    dist.init_process_group("gloo", rank=0, world_size=1)
    net = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    if mode == "optimizers":
        a = torch.optim.SGD(net.parameters(), lr=0.1)
        b = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(6):
            net(x).sum().backward()
            a.step()
            b.step()
    elif mode == "marker":
        import failslow

        for _ in range(4):
            dist.all_reduce(net(x).detach())
            failslow.step()
    elif mode == "user_comm_hook":
        model = DistributedDataParallel(net)
        calls = []

        def mine(state, bucket):
            calls.append(1)
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        model.register_comm_hook(None, mine)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
        print(f"user hook calls: {len(calls)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    main(sys.argv[1])
