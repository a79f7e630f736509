"""One large job on 1 and 2 workers (issue 16): sustained judged rank-steps/s, in wall
time and per worker CPU, with the job cut into shards (``models.shard``) and, for
comparison, judged whole on its home partition as before (``FAILSLOW_SHARD_RANKS`` above
the job's size).

Workload: one job of ``--ranks`` ranks (tp8 pp8, ranks / 8 hosts with 1 Hz GPU/NIC/host
telemetry, comm grain, 1 s steps), ``--steps`` steps, published up front in 1 s slices as
live collectors would (``bench/streams_throughput.py``'s), 4 partitions, once the workers
have started and joined (``--settle``), so they read it while it is published and after.

This VM has 2 cores shared with the broker and other work, so the wall-clock rate of two
workers says little about what two machines would do. The CPU-normalized rate is the
one to compare: judged rank-steps / the CPU of the *busiest* worker, each worker's CPU
counted from its first processed event to the last judged step (start-up and group join
left out). That is the rate the run would reach if each worker had a core of its own and
the broker kept up: the busiest worker bounds it.

    .venv/bin/python bench/streams_shards.py [--ranks 16384] [--steps 5] [--runs sharded:1 sharded:2 whole:1]

Each worker's event loop is watched (``streams/loopprobe.py``): the longest block seen
(``failslow_stream_loop_blocked_max_seconds``, polled), the per-minute p99 the worker
logs, and how many assignments each worker got (a rebalance after the start, e.g. a
live worker evicted because its heartbeats came too late, adds one). ``--code DIR`` runs
the workers from another checkout (a ``git archive`` of the code before a change).

Prints numbers and writes bench/results/streams_shards.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from streams_throughput import (  # noqa: E402
    cpu_seconds,
    machine_load,
    processed,
    publish_sliced,
    rss_bytes,
    scenario,
)

from failslow.schema import Topics  # noqa: E402
from failslow.simulator import simulate  # noqa: E402
from failslow.stack import create_topics, free_port, start_broker  # noqa: E402
from failslow.worker_process import WorkerProcess  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
JUDGED = "failslow_stream_judged_rank_steps_total"
BLOCKED = "failslow_stream_loop_blocked_max_seconds"
_LOOP = re.compile(BLOCKED + r'(?:\{loop="(\w+)"\})? ([\d.e+-]+)')


def blocked(port: int, seen: dict[str, float]) -> dict[str, float]:
    """``seen`` with each of a worker's loops' longest block in the last minute (its
    metric) taken in: the longest per loop so far."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return seen
    out = dict(seen)
    for loop, value in _LOOP.findall(body.decode()):
        loop = loop or "worker"   # the first probe had no label
        out[loop] = max(out.get(loop, 0.0), float(value))
    return out


def loop_log(log: Path) -> dict:
    """From a worker's log: its assignments and the loop probe's per-minute lines."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = re.findall(r"event loop blocked(?: \((\w+)\))?: longest ([\d.]+) s, p99 ([\d.]+) s",
                       text)
    p99 = [(loop or "worker", float(x)) for loop, _, x in lines]
    longest = [(loop or "worker", float(x)) for loop, x, _ in lines]
    return {"assignments": text.count("Executing _on_partitions_assigned"),
            "loop_blocked_p99_per_minute_s": p99, "loop_blocked_longest_per_minute_s": longest}


def run(bootstrap: str, topics: Topics, events: list[dict], expect_judged: int,
        n_workers: int, timeout: float, settle: float, extra: list[str]) -> dict:
    n_events = len(events)
    ports = [free_port() for _ in range(n_workers)]
    group = f"bench-{uuid.uuid4().hex[:6]}"
    logs = [Path(tempfile.gettempdir()) / f"{group}-w{n}.log" for n in range(n_workers)]
    workers = [WorkerProcess(bootstrap, topics, group=group, metrics_port=p, log_path=log,
                             extra=extra)
               for p, log in zip(ports, logs, strict=True)]
    pids = [w.proc.pid for w in workers]
    try:
        # The workers join the group before the backlog comes: a worker that started
        # alone would take every partition, and hand half over (snapshot, replay) when the
        # other one joins, which is a rebalance's cost, not the job's.
        time.sleep(settle / 2)
        idle0, t_idle = [cpu_seconds(p) for p in pids], time.monotonic()
        time.sleep(settle / 2)
        idle = [(cpu_seconds(p) - c) / (time.monotonic() - t_idle)
                for p, c in zip(pids, idle0, strict=True)]
        publish_sliced(bootstrap, topics, events)
        deadline = time.monotonic() + timeout
        t_first = None
        cpu0 = [0.0] * n_workers
        while time.monotonic() < deadline:
            done = processed(ports)
            if done > 0:
                t_first = time.monotonic()
                cpu0 = [cpu_seconds(p) for p in pids]
                break
            time.sleep(0.2)
        judged, t_judged = 0.0, time.monotonic()
        cpu1 = cpu0
        rss = [0] * n_workers
        longest: list[dict[str, float]] = [{} for _ in range(n_workers)]  # per loop (issue 16)
        # done when every step is judged, or every event was processed and judging
        # stopped growing for 20 s
        t_all, judged_all = None, 0.0   # when every event was processed, judged by then
        while time.monotonic() < deadline:
            now_judged = processed(ports, JUDGED)
            rss = [max(a, rss_bytes(p)) for a, p in zip(rss, pids, strict=True)]
            longest = [blocked(p, b) for b, p in zip(longest, ports, strict=True)]
            if now_judged != judged:
                judged, t_judged = now_judged, time.monotonic()
                cpu1 = [cpu_seconds(p) for p in pids]
            all_in = processed(ports) >= n_events
            if all_in and t_all is None:
                t_all, judged_all = time.monotonic(), now_judged
            if judged >= expect_judged or (time.monotonic() - t_judged > 20 and all_in):
                break
            time.sleep(0.5 if t_all is None else 1.0)
        done = processed(ports)
        unmapped = processed(ports, "failslow_stream_unmapped_telemetry_total")
        cpu_total = [cpu_seconds(p) for p in pids]
        alive = [w.proc.poll() is None for w in workers]
    finally:
        codes = [w.stop() for w in workers]
    loops = [loop_log(log) for log in logs]
    if not all(alive):
        print(f"a worker exited during the run (codes {codes}); logs: {logs}", flush=True)
    span = t_judged - (t_first or t_judged)
    # the rate the workers kept up with the input: rank-steps judged by the time every
    # event was processed (the last steps wait for --lateness, not for CPU)
    span_all = (t_all - t_first) if t_all is not None and t_first is not None else 0.0
    cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    busiest = max(cpu) if cpu else 0.0
    # what each worker spent beyond its idle rate (timers, fetch loops, heartbeats: paid per
    # wall second, so a starved worker on a loaded VM pays more of it)
    work = [c - rate * span for c, rate in zip(cpu, idle, strict=True)]
    return {"workers": n_workers, "events": n_events, "processed": done,
            "judged_rank_steps": judged, "expected_rank_steps": expect_judged,
            "seconds_to_last_judged": span,
            "judged_rank_steps_per_s_wall": judged / span if span > 0 else 0.0,
            "seconds_to_all_processed": span_all,
            "judged_rank_steps_when_all_processed": judged_all,
            "judged_rank_steps_per_s_wall_until_all_processed":
                judged_all / span_all if span_all > 0 else 0.0,
            "worker_cpu_s": cpu, "worker_cpu_since_start_s": cpu_total,
            "judged_rank_steps_per_busiest_worker_cpu_s": judged / busiest if busiest else 0.0,
            "worker_idle_cpu_per_s": idle, "worker_cpu_beyond_idle_s": work,
            "judged_rank_steps_per_busiest_worker_cpu_beyond_idle_s":
                judged / max(work) if work and max(work) > 0 else 0.0,
            "worker_rss_bytes": rss, "workers_alive_to_the_end": alive,
            "loop_blocked_max_s": longest, "assignments": [x["assignments"] for x in loops],
            "loop_blocked_p99_per_minute_s": [x["loop_blocked_p99_per_minute_s"] for x in loops],
            "loop_blocked_longest_per_minute_s":
                [x["loop_blocked_longest_per_minute_s"] for x in loops], "logs": [str(x) for x in logs], "telemetry_messages_to_every_partition": unmapped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--worker-args", default="--session-timeout 2 --log-level info",
                    help="extra `failslow worker` flags (e.g. --session-timeout 2)")
    ap.add_argument("--code", default=None, help="run the workers from this checkout")
    ap.add_argument("--out", default="streams_shards.json",
                    help="file under bench/results to write")
    ap.add_argument("--settle", type=float, default=20.0,
                    help="seconds the workers get to join before the backlog is published")
    ap.add_argument("--runs", nargs="+", default=["sharded:1", "sharded:2", "whole:1"],
                    help="mode:workers; mode sharded (the default shard size) or whole "
                         "(the job judged on its home partition, as before issue 16)")
    args = ap.parse_args()
    t0 = time.monotonic()
    sc = scenario(1, args.ranks)
    events = list(simulate(sc, seed=0, steps=args.steps).events())
    steps = len({(e["step"]) for e in events if e["kind"] == "step"})
    expect = steps * args.ranks
    print(f"simulated {len(events):,} events ({steps} steps of {sc.description}) in "
          f"{time.monotonic() - t0:.1f} s")
    broker = start_broker()
    if args.code:
        os.environ["PYTHONPATH"] = str(Path(args.code).resolve())
        os.chdir(args.code)     # python -m puts the cwd first on the path
    results = []
    shard_env = os.environ.get("FAILSLOW_SHARD_RANKS")
    try:
        for spec in args.runs:
            mode, n = spec.split(":")
            if mode == "whole":
                os.environ["FAILSLOW_SHARD_RANKS"] = str(args.ranks)
            elif shard_env is None:
                os.environ.pop("FAILSLOW_SHARD_RANKS", None)
            else:
                os.environ["FAILSLOW_SHARD_RANKS"] = shard_env
            topics = Topics(f"b{uuid.uuid4().hex[:8]}.")
            create_topics(broker.bootstrap, topics, partitions=4)
            load0 = machine_load()
            r = run(broker.bootstrap, topics, events, expect, int(n), args.timeout,
                    args.settle, args.worker_args.split())
            r["mode"] = mode
            r["shard_ranks"] = os.environ.get("FAILSLOW_SHARD_RANKS", "default")
            r["load_before"], r["load_after"] = load0, machine_load()
            results.append(r)
            print(f"{mode} x{n}: {r['judged_rank_steps']:,.0f}/{expect:,} rank-steps judged in "
                  f"{r['seconds_to_last_judged']:.1f} s = "
                  f"{r['judged_rank_steps_per_s_wall']:,.0f}/s wall; worker CPU "
                  f"{[round(c, 1) for c in r['worker_cpu_s']]} s -> "
                  f"{r['judged_rank_steps_per_busiest_worker_cpu_s']:,.0f} rank-steps per "
                  f"busiest-worker CPU s (idle {[round(i, 3) for i in r['worker_idle_cpu_per_s']]}"
                  f" CPU s/s; beyond idle "
                  f"{r['judged_rank_steps_per_busiest_worker_cpu_beyond_idle_s']:,.0f}); RSS {[round(b / 2**20) for b in r['worker_rss_bytes']]}"
                  f" MiB; load {r['load_before']['loadavg']} -> {r['load_after']['loadavg']}",
                  flush=True)
            print(f"  event loops: longest block {r['loop_blocked_max_s']} s,"
                  f" per-minute p99 {r['loop_blocked_p99_per_minute_s']} s; assignments "
                  f"{r['assignments']}", flush=True)
    finally:
        broker.stop(2)
    base = {r["mode"]: r for r in results if r["workers"] == 1}
    for r in results:
        ref = base.get("sharded")
        if r["workers"] > 1 and ref and ref["judged_rank_steps_per_busiest_worker_cpu_s"]:
            cpu = (r["judged_rank_steps_per_busiest_worker_cpu_s"]
                   / ref["judged_rank_steps_per_busiest_worker_cpu_s"])
            wall = (r["judged_rank_steps_per_s_wall"] / ref["judged_rank_steps_per_s_wall"]
                    if ref["judged_rank_steps_per_s_wall"] else 0.0)
            r["speedup_cpu_normalized"], r["speedup_wall"] = cpu, wall
            # the sustained rate: time to take the whole backlog (the last steps of a
            # backlog are judged when the worker goes idle, up to 6 x lateness later, so
            # "to the last judged" can count different rank-steps in the two runs)
            if r["seconds_to_all_processed"] and ref["seconds_to_all_processed"]:
                r["speedup_wall_backlog"] = (ref["seconds_to_all_processed"]
                                             / r["seconds_to_all_processed"])
                print(f"  backlog taken: {r['speedup_wall_backlog']:.2f}x wall")
            if ref["judged_rank_steps_per_busiest_worker_cpu_beyond_idle_s"]:
                r["speedup_cpu_beyond_idle"] = (
                    r["judged_rank_steps_per_busiest_worker_cpu_beyond_idle_s"]
                    / ref["judged_rank_steps_per_busiest_worker_cpu_beyond_idle_s"])
                print(f"  beyond idle: {r['speedup_cpu_beyond_idle']:.2f}x")
            print(f"{r['mode']} x{r['workers']} / sharded x1: {cpu:.2f}x CPU-normalized, "
                  f"{wall:.2f}x wall (2 cores shared with the broker)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(
        {"scenario": sc.name, "ranks": args.ranks, "steps": args.steps, "runs": results,
         "worker_args": args.worker_args, "code": args.code or "this checkout"},
        indent=2))


if __name__ == "__main__":
    main()
