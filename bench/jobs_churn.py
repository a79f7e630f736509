"""Memory after many sequential jobs: RSS after 10 and after 1,000 64-rank jobs.

Offline, at the Detector level (``models.pipeline.Detector``, the object the worker's
partitions hold): the simulator's ``healthy_hybrid_64`` job (64 ranks, 8 hosts, comm
windows and 1 Hz device telemetry) is run ``--jobs`` times one after another on the same
hosts, each with its own job id, shifted in event time so the next starts ``--gap``
seconds after the previous one's last event. Jobs end by ``--job-idle`` (event time),
as in the worker. After each checkpoint the process's resident memory (VmRSS, after a
full garbage collection), the jobs still tracked and the size of the Detector's snapshot
are printed. ``--job-idle 1e12`` shows the memory when jobs never end (the code before
issue 17). ``--fresh-hosts``: each job runs on hosts (and GPUs) of its own, as in a
cluster whose jobs land on other machines (the soak's workload): the devices of the hosts
of ended jobs must go too (issue 17, "worker memory flat"). A worker run of 1,000 jobs would take hours on this VM; the worker adds its
partition state (de-duplication marks, input caps, emitted incidents), which prunes by
event time too (``JobPartition.prune``).

    .venv/bin/python bench/jobs_churn.py [--jobs 1000] [--steps 20]

Prints numbers and writes bench/results/jobs_churn.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import orjson

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate

RESULTS = Path(__file__).parent / "results"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gap", type=float, default=5.0, help="event-time s between two jobs")
    ap.add_argument("--job-idle", type=float, default=300.0)
    ap.add_argument("--scenario", default="healthy_hybrid_64")
    ap.add_argument("--fresh-hosts", action="store_true",
                    help="each job on hosts of its own (renamed), not the same 8")
    args = ap.parse_args()
    base = list(simulate(SCENARIOS[args.scenario], seed=0, steps=args.steps).events())
    t0, t1 = base[0]["ts"], base[-1]["ts"]
    ranks = max(e["rank"] for e in base if e["kind"] == "step") + 1
    raw = [orjson.dumps(e) for e in base]   # each job decodes a fresh copy, as a stream would
    det = Detector(job_idle_s=args.job_idle)
    checkpoints = sorted({c for c in (1, 10, 100, 300, args.jobs) if c <= args.jobs})
    rows = []
    incidents = 0
    started = time.process_time()
    for k in range(args.jobs):
        shift = k * (t1 - t0 + args.gap)
        job = f"churn{k}"
        events = []
        for line in raw:
            ev = orjson.loads(line)
            ev["ts"] += shift
            if "window_start_ts" in ev:
                ev["window_start_ts"] += shift
            if "job_id" in ev:
                ev["job_id"] = job
            if args.fresh_hosts:
                if "host" in ev:
                    ev["host"] = f"{job}-{ev['host']}"
                if "uuid" in ev:
                    ev["uuid"] = f"{ev['uuid']}-{k}"
            events.append(ev)
        incidents += len(det.process_batch(events))
        if k + 1 in checkpoints:
            gc.collect()
            state = len(orjson.dumps(det.state_dict()))
            st = det.store
            rows.append({"jobs": k + 1, "rss_bytes": rss_bytes(), "tracked_jobs": len(det.jobs),
                         "jobs_ended": det.jobs_ended, "state_bytes": state,
                         "devices": len(st.gpus) + len(st.nics) + len(st.hosts)})
            r = rows[-1]
            print(f"after {k + 1:>5} jobs: RSS {r['rss_bytes'] / 2**20:7.1f} MiB, "
                  f"{r['tracked_jobs']} jobs tracked, {r['jobs_ended']} ended, "
                  f"{r['devices']} devices, "
                  f"snapshot {state / 2**10:8.1f} KiB", flush=True)
    cpu = time.process_time() - started
    first = next(r for r in rows if r["jobs"] == min(10, args.jobs))
    last = rows[-1]
    growth = last["rss_bytes"] / first["rss_bytes"] - 1
    print(f"{ranks}-rank jobs, {args.steps} steps each, job idle {args.job_idle:g} s: RSS after "
          f"{last['jobs']} jobs is {100 * growth:+.1f} % of after {first['jobs']} "
          f"({cpu:.0f} CPU s; {incidents} incident events)")
    RESULTS.mkdir(exist_ok=True)
    name = "jobs_churn.json" if args.job_idle < 1e9 else "jobs_churn_never_end.json"
    if args.fresh_hosts:
        name = name.replace(".json", "_fresh_hosts.json")
    (RESULTS / name).write_text(json.dumps(
        {"scenario": args.scenario, "ranks": ranks, "steps": args.steps,
         "fresh_hosts": args.fresh_hosts,
         "job_idle_s": args.job_idle, "rows": rows, "rss_growth": growth,
         "cpu_s": cpu}, indent=2))


if __name__ == "__main__":
    main()
