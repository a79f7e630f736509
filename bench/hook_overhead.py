"""Training-hook overhead per collective on CPU (gloo), in µs. Target: < 20 µs.

One process, a world of one (gloo), a 16-float tensor: ``dist.all_reduce`` is timed
``--ops`` times bare and with the hook installed (events built and queued; the
background thread publishes them to a null sink, so no broker is involved), in
alternating rounds; the overhead is the difference of the medians. Also reports
the cost inside a step (``with hook.step()``), of an async op (future callback), and
the hook's own cost on a do-nothing collective (``hook_own_cost_us``: what the hook
adds at its seam, ``ProcessGroup.allreduce``, free of gloo's thread hand-off noise, which on a
busy machine is larger than it), and the same as the fastest of many short batches
(``hook_own_cost_min_us``, outside and inside a step: stable on a loaded machine). A
blocking call also passes the ``Work.wait`` patch.
The grain is the hook's default (``comm``; ``FAILSLOW_HOOK_GRAIN=collective`` for raw
events); the publishing thread runs as in a job, so the timings include its share of the
GIL. ``comm_window_close_us_per_op``: what the ``comm`` grain costs the publishing
thread per op, closing a window of 2,000 ops of a step (fastest of 10) (the NullPublisher hides what
publishing one event per op costs the ``collective`` grain instead: a real Publisher's
encoding and produce).

    .venv/bin/python bench/hook_overhead.py [--ops 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from failslow.collectors.torch_hook import TrainingHook  # noqa: E402
from failslow.stack import free_port  # noqa: E402


class NullPublisher:
    def __init__(self) -> None:
        self.events = 0

    def publish(self, events: list[dict]) -> None:
        self.events += len(events)


def per_op_us(n: int, async_op: bool = False, hook: TrainingHook | None = None) -> float:
    t = torch.ones(16)
    t0 = time.perf_counter()
    if hook is not None:
        with hook.step():
            for _ in range(n):
                w = dist.all_reduce(t, async_op=async_op)
                if async_op:
                    w.wait()
    else:
        for _ in range(n):
            w = dist.all_reduce(t, async_op=async_op)
            if async_op:
                w.wait()
    return (time.perf_counter() - t0) / n * 1e6


def wrapper_only_us(n: int, hook: TrainingHook) -> tuple[float, float]:
    """The hook's own cost: a do-nothing ``ProcessGroup.allreduce``, bare and wrapped by
    the hook's seam (immune to gloo's thread hand-off noise)."""
    def fake_allreduce(pg, tensors, opts=None):  # noqa: ANN001
        return None

    wrapped = hook._seams._wrap_pg(fake_allreduce, "allreduce", 0, None)
    pg = dist.group.WORLD
    t = [torch.ones(16)]
    times = []
    for fn in (fake_allreduce, wrapped):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(pg, t)
        times.append((time.perf_counter() - t0) / n * 1e6)
    return times[0], times[1]


def own_cost_min_us(hook: TrainingHook, in_step: bool, batches: int = 300) -> float:
    """The hook's own cost at its seam as the fastest of ``batches`` batches of 200 calls,
    wrapped minus bare: the minimum is what the code costs when nothing else runs, so it
    holds still on a loaded machine where medians do not."""
    def fake_allreduce(pg, tensors, opts=None):  # noqa: ANN001
        return None

    wrapped = hook._seams._wrap_pg(fake_allreduce, "allreduce", 0, None)
    pg, t = dist.group.WORLD, [torch.ones(16)]

    def batch(fn: object) -> float:
        t0 = time.perf_counter()
        for _ in range(200):
            fn(pg, t)  # type: ignore[operator]
        return (time.perf_counter() - t0) / 200 * 1e6

    bare, hooked = [], []
    for i in range(batches):
        if in_step and i % 50 == 0:  # steps of 10,000 ops
            if hook._step is not None:
                hook._end_step()
            hook._begin_step(None, None)
        bare.append(batch(fake_allreduce))
        hooked.append(batch(wrapped))
    if hook._step is not None:
        hook._end_step()
    return min(hooked) - min(bare)


def window_cost_us(n: int, sink: NullPublisher, windows: int = 10) -> float:
    """The publishing thread's cost per op of the ``comm`` grain: closing a window that
    holds ``n`` ended all-reduces of one step (blocked time split, entries summed), per
    op, the fastest of ``windows`` closes. Off the training thread, but it holds the GIL
    while it runs."""
    hook = TrainingHook(sink, job_id="bench", rank=0, world_size=1, grain="comm")
    hook._begin_step(0, None)
    step = hook._step
    assert step is not None
    best = float("inf")
    for _ in range(windows):
        for _ in range(n):
            h = hook._on_issue("allreduce", None, 64, None, None)
            step.open_ops += 1
            hook._end_op(h, time.perf_counter())
        t0 = time.perf_counter()
        with hook._lock:
            hook._comm_window(step, time.perf_counter(), final=False)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    sink = NullPublisher()
    results: dict[str, list[float]] = {k: [] for k in
                                       ("bare", "hooked", "bare_async", "hooked_async",
                                        "hooked_in_step")}
    per_op_us(2000)
    for _ in range(args.rounds):
        results["bare"].append(per_op_us(args.ops))
        results["bare_async"].append(per_op_us(args.ops, async_op=True))
        hook = TrainingHook(sink, job_id="bench").install()
        results["hooked"].append(per_op_us(args.ops))
        results["hooked_async"].append(per_op_us(args.ops, async_op=True))
        results["hooked_in_step"].append(per_op_us(args.ops, hook=hook))
        bare_fn, wrapped_fn = wrapper_only_us(args.ops, hook)
        results.setdefault("wrapper_only", []).append(wrapped_fn - bare_fn)
        results.setdefault("own_min", []).append(own_cost_min_us(hook, in_step=False))
        results.setdefault("own_min_in_step", []).append(own_cost_min_us(hook, in_step=True))
        hook.close()
        if "_comm_window" in dir(hook):  # (hooks before the comm grain had no windows)
            results.setdefault("window_close_per_op", []).append(window_cost_us(2000, sink))
    dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in results.items()}
    out = {"ops_per_round": args.ops, "rounds": args.rounds,
           "median_us_per_op": {k: round(v, 2) for k, v in med.items()},
           "overhead_us_sync": round(med["hooked"] - med["bare"], 2),
           "overhead_us_async": round(med["hooked_async"] - med["bare_async"], 2),
           "overhead_us_sync_in_step": round(med["hooked_in_step"] - med["bare"], 2),
           "hook_own_cost_us": round(med["wrapper_only"], 2),
           "hook_own_cost_min_us": round(min(results["own_min"]), 2),
           "hook_own_cost_min_in_step_us": round(min(results["own_min_in_step"]), 2),
           "comm_window_close_us_per_op": round(min(results.get("window_close_per_op", [0.0])), 2),
           "events_published": sink.events, "target_us": 20}
    print(json.dumps(out, indent=2))
    path = ROOT / "bench/results/hook_overhead.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
