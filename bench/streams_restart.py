"""Restart of a worker that holds many shards (issue 16): one large job cut into many
shards on 2 workers, one killed (-9) once its partitions have snapshots, a new one
started in its place; the time from the kill to the first rank-step the new worker
judges, split into its parts from the new worker's log:

- start: the kill to the new worker's join request ("(Re-)joining group": the process
  and faust start);
- rebalance: the join request to the assignment ("Setting newly assigned partitions":
  the group waits for the dead member to be dropped, ``--session-timeout``);
- take-over: the assignment to the last partition taken over ("partition N taken over":
  snapshot read back and restored, emitted incidents scanned);
- first judged: the last take-over to the first rank-step judged (the replay from the
  committed offsets up to a step to judge), and to a step's worth of rank-steps judged
  (as many as the new worker's shards have ranks).

The job is ``--ranks`` ranks (bench/streams_scale.py's scenario: tp8 pp8, comm grain,
2 s steps, 1 Hz telemetry) with ``FAILSLOW_SHARD_RANKS=--shard-ranks`` (default 16,384
ranks in shards of 512: 32 shards, 16 on each worker), published as a backlog once both
workers joined. ``--code DIR`` runs the workers from another checkout (e.g. the code
before a change, ``git archive``) for a before/after in one session.

    .venv/bin/python bench/streams_restart.py [--ranks 16384] [--shard-ranks 512] [--code DIR]

Each worker's event loop is watched (``streams/loopprobe.py``): the longest block seen
and the assignments each worker got (``bench/streams_shards.py``'s ``loop_log``).

Prints the numbers and appends them to bench/results/streams_restart.json.
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
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from streams_scale import write_trace  # noqa: E402
from streams_shards import blocked, loop_log  # noqa: E402
from streams_shards_large import publish_file, scrape  # noqa: E402
from streams_throughput import machine_load  # noqa: E402

from failslow.schema import Topics  # noqa: E402
from failslow.stack import create_topics, free_port, start_broker  # noqa: E402
from failslow.worker_process import WorkerProcess  # noqa: E402

RESULTS = HERE / "results"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def stamped(log: Path, needle: str) -> list[float]:
    """Wall times (s since the epoch, UTC) of the log lines that contain ``needle``."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        if m and needle in line:
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            out.append(t.replace(tzinfo=dt.UTC).timestamp())
    return out


def taken_over(log: Path, since: float, until: float = float("inf")) -> dict[int, float]:
    """Partition -> when it was taken over, for the take-overs logged from ``since`` to
    before ``until``."""
    out: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        p = re.search(r"partition (\d+) taken over", line)
        if m and p:
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            t_s = t.replace(tzinfo=dt.UTC).timestamp()
            if since <= t_s < until:
                out[int(p.group(1))] = t_s
    return out


def split(kill: dict, log: Path, want: int) -> dict:
    """The restart's parts from the new worker's log (module docstring)."""
    t0 = kill["t_kill"]
    joining = stamped(log, "(Re-)joining group")
    # the last assignment before the first judged rank-step (not the one when the bench
    # stops the workers)
    every = stamped(log, "Executing _on_partitions_assigned")
    assigned = [t for t in every if t <= kill["t_judged"]]
    final = assigned[-1] if assigned else None
    later = [t for t in every if final is not None and t > final]
    taken = taken_over(log, final, later[0] if later else float("inf")) if final else {}
    done = max(taken.values()) if len(taken) >= want else None
    return {"restart_s": kill["t_judged"] - t0,
            "start_s": joining[0] - t0 if joining else None,
            "assignments": len(assigned),
            "settled_s": final - t0 if final else None,
            "first_judged_after_final_assignment_s": kill["t_judged"] - final if final else None,
            "partitions_taken_over": len(taken),
            "take_over_s": done - final if done and final else None,
            "all_taken_over_s": done - t0 if done else None,
            # the new worker judged as many rank-steps as its shards have ranks
            "step_judged_s": kill["t_step"] - t0 if "t_step" in kill else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--shard-ranks", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--session-timeout", type=float, default=2.0)
    ap.add_argument("--settle", type=float, default=15.0)
    ap.add_argument("--kill-after", type=float, default=120.0,
                    help="longest wait after the first step is judged for every "
                         "partition's snapshot before the kill")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after (s)")
    ap.add_argument("--code", default=None, help="run the workers from this checkout")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    os.environ["FAILSLOW_SHARD_RANKS"] = str(args.shard_ranks)   # the workers'
    trace = Path(tempfile.gettempdir()) / f"failslow-{args.ranks}-{args.steps}steps.jsonl"
    res: dict = {"label": args.label, "code": args.code or "this checkout",
                 "ranks": args.ranks, "shard_ranks": args.shard_ranks,
                 "shards": -(-args.ranks // args.shard_ranks), "partitions": args.partitions,
                 "session_timeout_s": args.session_timeout, "load_before": machine_load(),
                 "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}

    def say(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.1f}: "
              f"{msg}", flush=True)

    if not trace.exists() or trace.stat().st_size == 0:
        say(f"writing {trace}")
        res["trace"] = write_trace(args.ranks, args.steps, trace)
    say(f"trace {trace} ({trace.stat().st_size / 2**20:.0f} MiB)")
    broker = start_broker()
    if args.code:
        os.environ["PYTHONPATH"] = str(Path(args.code).resolve())
        os.chdir(args.code)     # python -m puts the cwd first on the path
    topics = Topics(f"r{uuid.uuid4().hex[:8]}.")
    create_topics(broker.bootstrap, topics, partitions=args.partitions)
    group = f"restart-{uuid.uuid4().hex[:6]}"
    extra = ["--session-timeout", str(args.session_timeout), "--log-level", "info"]
    logs = [Path(tempfile.gettempdir()) / f"{group}-w{i}.log" for i in range(3)]
    ports = [free_port() for _ in range(3)]
    workers = [WorkerProcess(broker.bootstrap, topics, group=group, metrics_port=ports[i],
                             log_path=logs[i], extra=extra) for i in range(2)]
    pub: dict = {"published": 0}
    deadline = time.monotonic() + args.timeout
    kill: dict = {}
    longest: list[dict[str, float]] = [{} for _ in range(3)]  # per worker, loop (issue 16)
    try:
        time.sleep(args.settle)
        threading.Thread(target=publish_file, daemon=True,
                         args=(broker.bootstrap, topics, trace, pub)).start()
        t_step0 = None
        snaps0: dict[int, float] = {}
        while time.monotonic() < deadline:
            time.sleep(0.5 if kill else 2.0)
            longest = [blocked(p, b) for b, p in zip(longest, ports, strict=True)]
            if not kill:
                ms = [scrape(p) for p in ports[:2]]
                judged = sum(m["judged"] for m in ms)
                snaps: dict[int, float] = {}
                for m in ms:
                    snaps.update(m["snapshots"])
                if t_step0 is None and judged >= args.ranks:
                    t_step0, snaps0 = time.monotonic(), dict(snaps)
                    say(f"first step judged ({judged:,.0f} rank-steps)")
                fresh = t_step0 is not None and len(snaps) >= args.partitions and all(
                    snaps0.get(p) != b for p, b in snaps.items())
                if t_step0 is not None and (fresh or time.monotonic() - t_step0 > args.kill_after):
                    victim = workers[1]
                    kill.update(judged_before=judged, fresh_snapshots=fresh,
                                published_at_kill=pub.get("published"))
                    victim.kill()
                    kill["t_kill"] = time.time()
                    workers.append(WorkerProcess(broker.bootstrap, topics, group=group,
                                                 metrics_port=ports[2], log_path=logs[2],
                                                 extra=extra))
                    say(f"killed worker 1 after {judged:,.0f} rank-steps judged; new worker "
                        f"{workers[2].proc.pid}")
                continue
            judged = scrape(ports[2])["judged"]
            if "t_judged" not in kill and judged > 0:
                kill["t_judged"] = time.time()
            if "t_step" not in kill and judged >= args.ranks // 2:
                kill["t_step"] = time.time()   # a step's worth of its half of the job
            if "t_judged" in kill:
                # then until every partition assigned to it is taken over and it judged a
                # step's worth of rank-steps (120 s at most)
                assigned = stamped(logs[2], "Executing _on_partitions_assigned")
                if ((assigned and len(taken_over(logs[2], assigned[-1])) >= args.partitions // 2
                     and "t_step" in kill) or time.time() - kill["t_judged"] > 120):
                    break
    finally:
        for w in workers:
            w.stop()
        broker.stop(5)
    res["kill"] = kill
    res["loop_blocked_max_s"] = longest
    res["loops"] = [loop_log(log) for log in logs]
    say(f"event loops: longest block per worker {longest} s; "
        f"assignments per worker {[x['assignments'] for x in res['loops']]}")
    res["load_after"] = machine_load()
    if "t_judged" in kill:
        res["split"] = split(kill, logs[2], args.partitions // 2)
        res["take_over_lines"] = [line for line in logs[2].read_text(errors="replace")
                                  .splitlines() if "taken over" in line]
        say("restart (kill -> first rank-step judged) {restart_s:.1f} s; the new worker asked "
            "to join after {start_s:.1f} s, got its final assignment after {settled_s:.1f} s "
            "({assignments} assignments), took over {partitions_taken_over} partitions "
            "{take_over_s:.1f} s after it, all {all_taken_over_s:.1f} s after the kill; a "
            "step's worth of its shards judged {step_judged_s:.1f} s after the kill".format(
                **{k: (v if v is not None else float("nan"))
                   for k, v in res["split"].items()}))
    else:
        say("no restart measured (timeout)")
    say(f"logs: {[str(p) for p in logs]}")
    RESULTS.mkdir(exist_ok=True)
    dest = RESULTS / "streams_restart.json"
    runs = json.loads(dest.read_text()) if dest.exists() else []
    runs.append(res)
    dest.write_text(json.dumps(runs, indent=2))
    say(f"appended to {dest}")


if __name__ == "__main__":
    main()
