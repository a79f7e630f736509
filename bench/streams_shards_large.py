"""The worker on one very large job (issue 16): a 131,072-rank job (16,384 hosts, tp8 pp8,
comm grain, 2 s steps, 1 Hz GPU/NIC/host telemetry: bench/streams_scale.py's scenario,
written as `failslow simulate --out` writes a trace) through 2 workers, then one worker
killed (-9) and replaced.

The trace (``--steps`` steps; each is ~2.4 M events at 131,072 ranks) is published to a
Tansu broker with ``--partitions`` partitions (default 32: one 4,096-rank shard per
partition, ``FAILSLOW_SHARD_RANKS`` left at its default) once both workers have joined.
Every ``--poll`` seconds the workers' metrics, CPU and RSS are sampled. Once the first
step is judged on every shard and each partition has written a snapshot since (or
``--kill-after`` seconds later at most), the second worker is killed with SIGKILL and a
new one started in the group: the restart time is from the kill to the first rank-step
the new worker judges (the group noticing the dead member, the rebalance, the take-over:
snapshot read back and restore, the replay from the committed offsets).

Reported: CPU seconds per judged step per worker (a worker's CPU from its first processed
event to its last judged step / the job steps judged), RSS per 1,000 ranks the worker
holds (its share of the judged rank-steps x the job's ranks), the partitions' snapshot
sizes and the restart time. ``--deadline HH:MM`` (UTC) stops everything at that time.

    .venv/bin/python bench/streams_shards_large.py [--ranks 131072] [--steps 2] [--deadline 01:45]

Prints numbers and writes bench/results/streams_shards_<ranks>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from streams_scale import write_trace  # noqa: E402
from streams_throughput import cpu_seconds, machine_load, rss_bytes  # noqa: E402

from failslow.collectors.publisher import Publisher  # noqa: E402
from failslow.models.shard import SHARD_RANKS, shards_of  # noqa: E402
from failslow.schema import Topics  # noqa: E402
from failslow.stack import create_topics, free_port, start_broker  # noqa: E402
from failslow.worker_process import WorkerProcess  # noqa: E402

RESULTS = Path(__file__).parent / "results"
_SAMPLE = re.compile(r'^(failslow_stream_[a-z_]+?)(?:_total)?(?:\{([^}]*)\})? ([0-9.e+-]+)$')


# metric (without _total) -> the key its value is summed into
_SUMMED = {f"failslow_stream_{m}": k for m, k in (
    ("events", "events"), ("judged_rank_steps", "judged"), ("capped_events", "capped"),
    ("unmapped_telemetry", "unmapped"), ("late_events", "late"),
    ("late_samples", "late_samples"), ("duplicates", "duplicates"),
    ("buffered_events", "buffered"), ("pooled_events", "pooled"))}


def scrape(port: int) -> dict:
    """A worker's metrics: events, judged rank-steps, snapshot bytes per partition."""
    out: dict = {"events": 0.0, "judged": 0.0, "snapshots": {}, "capped": 0.0,
                 "unmapped": 0.0, "late": 0.0, "late_samples": 0.0, "duplicates": 0.0,
                 "buffered": 0.0, "pooled": 0.0}
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return out
    for line in body.decode().splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name in _SUMMED:
            out[_SUMMED[name]] += value
        elif name == "failslow_stream_snapshot_bytes":
            p = re.search(r'partition="(\d+)"', labels)
            if p and value > 0:
                out["snapshots"][int(p.group(1))] = value
    return out


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def publish_file(bootstrap: str, topics: Topics, trace: Path, done: dict,
                 slice_s: float = 0.1) -> None:
    """Publish a JSON Lines trace in ``slice_s`` slices of event time, as collectors would."""
    t0 = time.monotonic()
    pub = Publisher(bootstrap, topics)
    batch: list[dict] = []
    n = 0
    with trace.open("rb") as f:
        for line in f:
            ev = orjson.loads(line)
            if batch and ev["ts"] - batch[0]["ts"] >= slice_s:
                pub.publish(batch)
                n += len(batch)
                batch = []
                done["published"] = n
            batch.append(ev)
    pub.publish(batch)
    n += len(batch)
    left = pub.flush(600)
    pub.close()
    done.update(published=n, publish_s=time.monotonic() - t0, undelivered=left)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--trace", default=None, help="trace to reuse (written if missing)")
    ap.add_argument("--session-timeout", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=25.0)
    ap.add_argument("--poll", type=float, default=5.0)
    ap.add_argument("--kill-after", type=float, default=240.0,
                    help="longest wait after the first step is judged for every "
                         "partition's snapshot before the kill")
    ap.add_argument("--deadline", default="01:45", help="UTC HH:MM: stop by then")
    ap.add_argument("--out", default=None, help="results file (default "
                    "bench/results/streams_shards_<ranks>.json)")
    ap.add_argument("--stop-after-restart", action="store_true",
                    help="stop once the new worker judged and took over all its partitions "
                         "(120 s after it judged at most)")
    args = ap.parse_args()
    hh, mm = map(int, args.deadline.split(":"))
    now_utc = dt.datetime.now(dt.UTC)
    stop_at = now_utc.replace(hour=hh, minute=mm, second=0, microsecond=0)
    if stop_at < now_utc:
        stop_at += dt.timedelta(days=1)
    deadline = time.monotonic() + (stop_at - now_utc).total_seconds()
    log_lines: list[str] = []

    def say(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.1f}: {msg}"
        log_lines.append(line)
        print(line, flush=True)

    trace = Path(args.trace or Path(tempfile.gettempdir()) /
                 f"failslow-{args.ranks}-{args.steps}steps.jsonl")
    res: dict = {"ranks": args.ranks, "steps": args.steps, "partitions": args.partitions,
                 "shard_ranks": SHARD_RANKS, "shards": shards_of(args.ranks, SHARD_RANKS),
                 "session_timeout_s": args.session_timeout, "load_before": machine_load()}
    if not trace.exists() or trace.stat().st_size == 0:
        say(f"writing {trace}")
        res["trace"] = write_trace(args.ranks, args.steps, trace)
    else:
        res["trace"] = {"trace_bytes": trace.stat().st_size, "reused": True}
    say(f"trace: {res['trace']}")
    expect = args.ranks * args.steps
    broker = start_broker()
    topics = Topics(f"x{uuid.uuid4().hex[:8]}.")
    create_topics(broker.bootstrap, topics, partitions=args.partitions)
    group = f"large-{uuid.uuid4().hex[:6]}"
    extra = ["--session-timeout", str(args.session_timeout), "--log-level", "info"]
    logs = [Path(tempfile.gettempdir()) / f"{group}-w{i}.log" for i in range(3)]
    ports = [free_port() for _ in range(3)]
    workers = [WorkerProcess(broker.bootstrap, topics, group=group, metrics_port=ports[i],
                             log_path=logs[i], extra=extra) for i in range(2)]
    say(f"workers {[w.proc.pid for w in workers]}, logs {[str(p) for p in logs[:2]]}")
    timeline: list[dict] = []
    pub_state: dict = {"published": 0}
    first_cpu: dict[int, float] = {}
    last_judged_cpu: dict[int, float] = {}
    judged_seen: dict[int, float] = {}
    peak_rss: dict[int, int] = {}
    kill: dict = {}
    try:
        time.sleep(args.settle)
        publisher = threading.Thread(target=publish_file, daemon=True,
                                     args=(broker.bootstrap, topics, trace, pub_state))
        publisher.start()
        t_pub = time.monotonic()
        t_step0 = None
        snaps0: dict[int, float] = {}
        while time.monotonic() < deadline:
            time.sleep(args.poll)
            now = time.monotonic()
            row: dict = {"t": round(now - t_pub, 1), "published": pub_state.get("published")}
            total = 0.0
            snaps: dict[int, float] = {}
            for i, w in enumerate(workers):
                if w.proc.poll() is not None:
                    continue
                pid = w.proc.pid
                m = scrape(ports[i])
                cpu, rss = cpu_seconds(pid), rss_bytes(pid)
                peak_rss[i] = max(peak_rss.get(i, 0), rss)
                if m["events"] > 0 and i not in first_cpu:
                    first_cpu[i] = cpu
                if m["judged"] != judged_seen.get(i, 0.0):
                    judged_seen[i] = m["judged"]
                    last_judged_cpu[i] = cpu
                total += m["judged"]
                snaps.update(m["snapshots"])
                row[f"w{i}"] = {"events": m["events"], "judged": m["judged"],
                                "cpu_s": round(cpu, 1), "rss_mib": round(rss / 2**20),
                                "capped": m["capped"], "unmapped": m["unmapped"],
                                "buffered": m["buffered"], "pooled": m["pooled"],
                                "snapshot_partitions": len(m["snapshots"]),
                                "snapshot_max_mib": round(max(m["snapshots"].values(),
                                                              default=0) / 2**20, 2)}
            total += kill.get("judged_by_killed", 0.0)
            row["judged"] = total
            # anything moving: events taken in, capped or judged on any worker
            row["progress"] = total + sum(row[k]["events"] + row[k]["capped"]
                                          for k in row if k.startswith("w"))
            row["load1"] = os.getloadavg()[0]
            row["mem_available_gib"] = round(mem_available() / 2**30, 1)
            timeline.append(row)
            say(json.dumps(row))
            if t_step0 is None and total >= args.ranks:
                t_step0, snaps0 = now, dict(snaps)
                say("first step judged")
            # a snapshot newer than the first step's judging on every partition (its size
            # changed), or --kill-after
            fresh = t_step0 is not None and len(snaps) >= args.partitions and all(
                snaps0.get(p) != b for p, b in snaps.items())
            if (t_step0 is not None and not kill and args.steps > 1
                    and (fresh or now - t_step0 > args.kill_after)):
                # kill -9 the second worker, start a new one in its place
                victim = workers[1]
                kill.update(judged_by_killed=judged_seen.get(1, 0.0), killed_pid=victim.proc.pid,
                            cpu_killed=cpu_seconds(victim.proc.pid),
                            rss_killed=rss_bytes(victim.proc.pid),
                            snapshots_before_kill={str(p): b for p, b in sorted(snaps.items())})
                victim.kill()
                t_kill = time.monotonic()
                kill["t_kill"] = round(t_kill - t_pub, 1)
                kill["t_kill_wall"] = time.time()
                workers.append(WorkerProcess(broker.bootstrap, topics, group=group,
                                             metrics_port=ports[2], log_path=logs[2],
                                             extra=extra))
                say(f"killed worker 1 (pid {kill['killed_pid']}, {kill['judged_by_killed']:,.0f}"
                    f" rank-steps judged); started {workers[2].proc.pid}")
            if kill and "restart_s" not in kill and judged_seen.get(2, 0.0) > 0:
                kill["restart_s"] = time.monotonic() - t_kill
                kill["t_judged_wall"] = time.time()
                say(f"the new worker judges again {kill['restart_s']:.1f} s after the kill")
            if args.stop_after_restart and "t_judged_wall" in kill:
                from streams_restart import stamped, taken_over

                assigned = stamped(logs[2], "Executing _on_partitions_assigned")
                if ((assigned and len(taken_over(logs[2], assigned[-1])) >= args.partitions // 2)
                        or time.time() - kill["t_judged_wall"] > 120):
                    say("the new worker took over its partitions: stopping")
                    break
            # done once nothing moves (events, capped, judged) for 60 s after the restart
            # (a restarted partition may judge a step again), 180 s before it
            quiet = 60 if kill.get("restart_s") else 180
            back = int(quiet / args.poll)
            stalled = (pub_state.get("publish_s") is not None and len(timeline) > back
                       and timeline[-1]["progress"] == timeline[-1 - back]["progress"])
            if total >= expect and not kill and args.steps == 1:
                say("every step judged")
                break
            if stalled:
                say(f"nothing moved for {quiet} s: stopping ({total:,.0f} judged, "
                    f"{expect:,} rank-steps in the trace)")
                break
    finally:
        alive = [w.proc.poll() is None for w in workers]
        for w in workers:
            w.stop()
        broker.stop(5)
    if "t_judged_wall" in kill:
        # the restart's parts from the new worker's log (bench/streams_restart.py)
        from streams_restart import split

        kill["split"] = split({"t_kill": kill["t_kill_wall"], "t_judged": kill["t_judged_wall"]},
                              logs[2], args.partitions // 2)
        say(f"restart split: {kill['split']}")
    res.update(publish=pub_state, timeline=timeline, kill=kill, workers_alive=alive,
               load_after=machine_load(), log=log_lines)
    per = []
    judged_total = timeline[-1]["judged"] if timeline else 0.0
    steps_judged = judged_total / args.ranks
    for i in sorted(first_cpu):
        cpu = last_judged_cpu.get(i, first_cpu[i]) - first_cpu[i]
        share = judged_seen.get(i, 0.0) / judged_total if judged_total else 0.0
        ranks_held = share * args.ranks
        # the same peak over the ranks of the most partitions it snapshotted (a replacement
        # stopped soon after its restart judged little of what it holds)
        parts = max((r[f"w{i}"]["snapshot_partitions"] for r in timeline if f"w{i}" in r),
                    default=0)
        ranks_of_parts = min(parts * res["shard_ranks"], args.ranks)
        per.append({"worker": i, "cpu_s": cpu, "judged_rank_steps": judged_seen.get(i, 0.0),
                    "cpu_s_per_judged_job_step": cpu / steps_judged if steps_judged else None,
                    "cpu_us_per_rank_step": (cpu / judged_seen[i] * 1e6
                                             if judged_seen.get(i) else None),
                    "peak_rss_mib": peak_rss.get(i, 0) / 2**20,
                    "ranks_held": ranks_held,
                    "rss_mib_per_1000_ranks": (peak_rss.get(i, 0) / 2**20 / (ranks_held / 1000)
                                               if ranks_held else None),
                    "partitions_held": parts,
                    "rss_mib_per_1000_ranks_of_partitions": (
                        peak_rss.get(i, 0) / 2**20 / (ranks_of_parts / 1000)
                        if ranks_of_parts else None)})
    res["per_worker"] = per
    res["judged_rank_steps"] = judged_total
    for p in per:
        say(f"worker {p['worker']}: {p['cpu_s']:.0f} CPU s, {p['judged_rank_steps']:,.0f} "
            f"rank-steps judged ({p['cpu_us_per_rank_step'] or 0:.0f} us each), "
            f"{p['cpu_s_per_judged_job_step'] or 0:.1f} CPU s per judged job step, peak RSS "
            f"{p['peak_rss_mib']:.0f} MiB = {p['rss_mib_per_1000_ranks'] or 0:.0f} MiB per "
            f"1,000 ranks held ({p['rss_mib_per_1000_ranks_of_partitions'] or 0:.0f} MiB per "
            f"1,000 ranks of the {p['partitions_held']} partitions it snapshotted)")
    RESULTS.mkdir(exist_ok=True)
    dest = Path(args.out) if args.out else RESULTS / f"streams_shards_{args.ranks}.json"
    dest.write_text(json.dumps(res, indent=2))
    say(f"wrote {dest}")


if __name__ == "__main__":
    main()
