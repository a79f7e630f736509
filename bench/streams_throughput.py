"""Sustained events/s through `failslow worker` on the real Tansu broker, detection on.

Workload: the simulator's ``large_4096`` scenario (one 4,096-rank job, tp8 pp8 dp64,
512 hosts of GPU/NIC/host telemetry), ``--steps`` steps, published up front in 1 s
slices as live collectors would. Then 1 (and 2) workers start and the rate is
taken from the workers' own metrics, from the first event processed to the last
(worker start-up and group join are not counted).

    .venv/bin/python bench/streams_throughput.py [--steps 6] [--workers 1 2] [--worker-args ...]
    .venv/bin/python bench/streams_throughput.py --ranks 16384 --steps 8   # one 16,384-rank job

With ``--ranks N`` the job is N ranks, tp8 pp8 (N / 8 hosts), comm grain, 1 s steps,
and the rate is also given in judged rank-steps/s (``failslow_stream_judged_rank_steps_total``
over the same span). What else ran on the machine (load average, the busiest processes)
is recorded at the start and the end of each run: the ratio of two runs is only
meaningful when the same things ran beside them.

Prints numbers and writes bench/results/streams_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
import uuid
from pathlib import Path

from failslow.collectors.publisher import Publisher
from failslow.schema import Topics
from failslow.simulator import SCENARIOS, JobSpec, Scenario, simulate
from failslow.stack import create_topics, free_port, start_broker
from failslow.worker_process import WorkerProcess

RESULTS = Path(__file__).parent / "results"


def scenario(jobs: int, ranks: int | None = None) -> Scenario:
    if ranks:
        return Scenario(f"one_{ranks}", f"one {ranks:,}-rank job tp8 pp8, comm grain",
                        (JobSpec(job_id="big", hosts=ranks // 8, tp=8, pp=8, micro_batches=8),),
                        steps=40, large=True)
    if jobs == 1:
        return SCENARIOS["large_4096"]
    # job5 and job1 are homed on partitions 0 and 1 of 4 (crc32 % 4), which faust gives to
    # different workers.
    specs = tuple(JobSpec(job_id=j, hosts=256, tp=8, pp=8, micro_batches=8)
                  for j in ("job5", "job1"))
    return Scenario("large_4096_2jobs", "two 2,048-rank jobs", specs, steps=40, large=True)


def publish_sliced(bootstrap: str, topics: Topics, events: list[dict], slice_s: float = 1.0) -> None:
    pub = Publisher(bootstrap, topics)
    start = 0
    for n in range(1, len(events) + 1):
        if n == len(events) or events[n]["ts"] - events[start]["ts"] >= slice_s:
            pub.publish(events[start:n])
            start = n
    if pub.flush(120):
        raise SystemExit("publisher could not deliver everything")
    pub.close()


def processed(ports: list[int], name: str = "failslow_stream_events_total") -> float:
    """The sum of metric ``name`` over the workers' metrics endpoints."""
    total = 0.0
    for port in ports:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        except OSError:
            continue
        for line in body.decode().splitlines():
            if line.startswith(name) and line[len(name)] in "{ ":
                total += float(line.rsplit(" ", 1)[1])
    return total


def run(bootstrap: str, topics: Topics, n_events: int, n_workers: int, timeout: float,
        extra: list[str]) -> dict:
    ports = [free_port() for _ in range(n_workers)]
    group = f"bench-{uuid.uuid4().hex[:6]}"
    workers = [WorkerProcess(bootstrap, topics, group=group, metrics_port=p, extra=extra)
               for p in ports]
    try:
        t_first = None
        deadline = time.monotonic() + timeout
        done = 0.0
        while time.monotonic() < deadline:
            done = processed(ports)
            now = time.monotonic()
            if done > 0 and t_first is None:
                t_first, first = now, done
            if done >= n_events:
                break
            time.sleep(0.5)  # each scrape costs the worker ~10 ms of its one core
        t_end = time.monotonic()
        cpu = sum(cpu_seconds(w.proc.pid) for w in workers)
        unmapped = processed(ports, "failslow_stream_unmapped_telemetry_total")
        judged = processed(ports, "failslow_stream_judged_rank_steps_total")
        rss = [rss_bytes(w.proc.pid) for w in workers]
        # The last steps of a backlog are judged once --lateness (10 s) has passed, or
        # once a rebalance settled: wait until judging stops (15 s without growth).
        judged_end, t_judged = judged, t_end
        while time.monotonic() < deadline and time.monotonic() - t_judged < 15:
            time.sleep(1.0)
            now_judged = processed(ports, "failslow_stream_judged_rank_steps_total")
            if now_judged != judged_end:
                judged_end, t_judged = now_judged, time.monotonic()
    finally:
        for w in workers:
            w.stop()
    span = t_end - (t_first or t_end)
    rate = (done - first) / span if t_first and span > 0 else 0.0
    return {"workers": n_workers, "events": n_events, "processed": done, "seconds": span,
            "events_per_s": rate, "worker_cpu_s": cpu,
            "judged_rank_steps_when_all_events_processed": judged,
            "judged_rank_steps_per_s": judged / span if t_first and span > 0 else 0.0,
            "judged_rank_steps": judged_end,
            "seconds_to_last_judged": t_judged - (t_first or t_judged),
            "worker_rss_bytes": rss,
            "telemetry_messages_to_every_partition": unmapped}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def machine_load() -> dict:
    """What else runs here: load average and the busiest processes (ps)."""
    import subprocess

    ps = subprocess.run(["ps", "-eo", "pcpu,rss,args", "--sort=-pcpu"], capture_output=True,
                        text=True, check=False).stdout.splitlines()[1:9]
    return {"loadavg": os.getloadavg(), "busiest": [line.strip()[:120] for line in ps]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, choices=(1, 2), default=1,
                    help="1: large_4096 as is; 2: the same 4,096 ranks as two 2,048-rank "
                         "jobs homed on different partitions, so two workers can share "
                         "the detection (one job's detection runs in one place)")
    ap.add_argument("--worker-args", default="",
                    help="extra `failslow worker` flags, e.g. '--fetch-wait-ms 30'")
    ap.add_argument("--ranks", type=int, default=None,
                    help="one job of this many ranks (tp8 pp8) instead of large_4096")
    args = ap.parse_args()
    t0 = time.monotonic()
    sc = scenario(args.jobs, args.ranks)
    events = list(simulate(sc, seed=0, steps=args.steps).events())
    print(f"simulated {len(events):,} events ({args.steps} steps of {sc.description}) in "
          f"{time.monotonic() - t0:.1f} s")
    broker = start_broker()
    results = []
    try:
        for n in args.workers:
            topics = Topics(f"b{uuid.uuid4().hex[:8]}.")
            create_topics(broker.bootstrap, topics, partitions=4)
            t0 = time.monotonic()
            publish_sliced(broker.bootstrap, topics, events)
            print(f"published in {time.monotonic() - t0:.1f} s")
            load0 = machine_load()
            r = run(broker.bootstrap, topics, len(events), n, args.timeout,
                    args.worker_args.split())
            r["load_before"], r["load_after"] = load0, machine_load()
            results.append(r)
            print(f"{n} worker(s): {r['processed']:,.0f} events in {r['seconds']:.1f} s = "
                  f"{r['events_per_s']:,.0f} events/s, "
                  f"{r['judged_rank_steps_per_s']:,.0f} judged rank-steps/s (all "
                  f"{r['judged_rank_steps']:,.0f} judged after {r['seconds_to_last_judged']:.1f} s; "
                  f"worker CPU "
                  f"{r['worker_cpu_s']:.1f} s incl. start-up; RSS "
                  f"{[round(b / 2**20) for b in r['worker_rss_bytes']]} MiB; "
                  f"{r['telemetry_messages_to_every_partition']:.0f} telemetry "
                  f"messages went to every partition; load {r['load_before']['loadavg']})")
        if len(results) > 1 and results[0]["events_per_s"]:
            for r in results[1:]:
                print(f"{r['workers']} workers / {results[0]['workers']}: "
                      f"{r['events_per_s'] / results[0]['events_per_s']:.2f}x events/s")
    finally:
        broker.stop(2)
    RESULTS.mkdir(exist_ok=True)
    name = "streams_throughput" + ("" if args.jobs == 1 else "_2jobs")
    if args.ranks:
        name += f"_{args.ranks}ranks"
    if args.worker_args:
        name += "_tuned"
    (RESULTS / f"{name}.json").write_text(json.dumps(
        {"scenario": sc.name, "steps": args.steps, "runs": results,
         "worker_args": args.worker_args}, indent=2))


if __name__ == "__main__":
    main()
