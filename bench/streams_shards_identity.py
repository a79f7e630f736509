"""A sharded job larger than the tests' through 2 workers, byte for byte against detect
(issue 16): ``--ranks`` ranks (tp8 pp8, comm grain, 2 s steps, 1 Hz telemetry) with
culprits from the first step on hosts of two shards, ``FAILSLOW_SHARD_RANKS=--shard-ranks``
and the unplaced-host pool cut below a shard's hosts (``FAILSLOW_MAX_UNKNOWN_HOSTS``), so
a shard's own hosts' early samples would be dropped if the partitions did not admit them.
The trace is published as a backlog once both workers joined; the incidents on the
incidents topic are compared with ``ShardedDetector.process_batch`` over the same events
(what ``failslow detect`` emits before its end-of-file flush).

    .venv/bin/python bench/streams_shards_identity.py [--ranks 4096] [--shard-ranks 512]

Prints the comparison and writes bench/results/streams_shards_identity_<ranks>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from streams_shards_large import publish_file, scrape  # noqa: E402
from streams_throughput import machine_load  # noqa: E402

from failslow.schema import Topics  # noqa: E402
from failslow.stack import create_topics, free_port, start_broker  # noqa: E402
from failslow.worker_process import WorkerProcess, read_incidents  # noqa: E402


def canon(incidents: list[dict]) -> Counter:
    return Counter(orjson.dumps(i, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
                   for i in incidents)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--shard-ranks", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--max-unknown-hosts", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--code", default=None, help="run the workers from this checkout")
    ap.add_argument("--label", default="", help="suffix of the results file")
    args = ap.parse_args()
    os.environ["FAILSLOW_SHARD_RANKS"] = str(args.shard_ranks)
    os.environ["FAILSLOW_MAX_UNKNOWN_HOSTS"] = str(args.max_unknown_hosts)
    from failslow.models.shard import ShardedDetector
    from failslow.simulator import FaultSpec, JobSpec, Scenario, simulate

    def say(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.1f}: "
              f"{msg}", flush=True)

    n = args.shard_ranks
    culprits = (n + n // 3, args.ranks - n + 5)      # in shard 1 and in the last shard
    scn = Scenario(f"ident_{args.ranks}", "sharded identity", (JobSpec(
        hosts=args.ranks // 8, tp=8, pp=8, micro_batches=8, step_s=2.0),),
        steps=args.steps, large=True,
        faults=(FaultSpec("gpu_thermal", 0, None, 0.4, rank=culprits[0]),
                FaultSpec("gpu_errors", 0, None, 0.3, rank=culprits[1])))
    trace = Path(tempfile.gettempdir()) / f"failslow-ident-{args.ranks}-{uuid.uuid4().hex[:6]}.jsonl"
    det = ShardedDetector(shard_ranks=n)
    ref: list[dict] = []
    events = 0
    t0 = time.process_time()
    with trace.open("wb") as f:
        chunk: list[dict] = []
        for ev in simulate(scn, seed=0).events():
            f.write(orjson.dumps(ev) + b"\n")
            chunk.append(ev)
            events += 1
            if len(chunk) >= 5000:
                ref += det.process_batch(chunk)
                chunk = []
        ref += det.process_batch(chunk)
    say(f"{events:,} events, detect's incidents {len(ref)} "
        f"({time.process_time() - t0:.0f} CPU s with the simulation); culprits {culprits}")
    res: dict = {"ranks": args.ranks, "shard_ranks": n, "steps": args.steps,
                 "partitions": args.partitions, "max_unknown_hosts": args.max_unknown_hosts,
                 "culprits": culprits, "events": events, "detect_incidents": len(ref),
                 "load_before": machine_load()}
    broker = start_broker()
    if args.code:
        os.environ["PYTHONPATH"] = str(Path(args.code).resolve())
        os.chdir(args.code)     # python -m puts the cwd first on the path
        res["code"] = args.code
    topics = Topics(f"i{uuid.uuid4().hex[:8]}.")
    create_topics(broker.bootstrap, topics, partitions=args.partitions)
    group = f"ident-{uuid.uuid4().hex[:6]}"
    ports = [free_port() for _ in range(2)]
    logs = [Path(tempfile.gettempdir()) / f"{group}-w{i}.log" for i in range(2)]
    workers = [WorkerProcess(broker.bootstrap, topics, group=group, metrics_port=ports[i],
                             log_path=logs[i], extra=["--session-timeout", "10",
                                    *(["--log-level", "info"] if os.environ.get(
                                        "FAILSLOW_DEBUG_LATE") else [])])
               for i in range(2)]
    pub: dict = {"published": 0}
    got: list[dict] = []
    try:
        time.sleep(12)
        threading.Thread(target=publish_file, daemon=True,
                         args=(broker.bootstrap, topics, trace, pub)).start()
        deadline = time.monotonic() + args.timeout
        last, still = None, 0
        while time.monotonic() < deadline:
            time.sleep(5)
            ms = [scrape(p) for p in ports]
            state = (sum(m["judged"] for m in ms), sum(m["events"] for m in ms))
            still = still + 1 if state == last and pub.get("publish_s") else 0
            last = state
            say(f"judged {state[0]:,.0f}, events {state[1]:,.0f}, capped "
                f"{sum(m['capped'] for m in ms):,.0f}")
            if still >= 18:      # 90 s without anything new
                break
        res["judged_rank_steps"], res["events_taken"] = last
        final = [scrape(p) for p in ports]
        for name in ("capped", "late", "late_samples", "unmapped", "duplicates"):
            res[name] = sum(m[name] for m in final)
        got = read_incidents(broker.bootstrap, topics, partitions=args.partitions)
    finally:
        for w in workers:
            w.stop()
        broker.stop(5)
        trace.unlink(missing_ok=True)
    same = canon(got) == canon(ref)
    brief = sorted((i["incident_id"], i["status"], i.get("root_cause")) for i in ref)
    if not same:        # which fields differ, incident by incident (by id and status, in order)
        def key(i: dict) -> tuple:
            return (i["incident_id"], i["status"], i.get("ts", 0))
        res["differences"] = [
            {"incident_id": a["incident_id"], "status": a["status"],
             "fields": {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
                        if a.get(k) != b.get(k)}}
            for a, b in zip(sorted(ref, key=key), sorted(got, key=key), strict=False)
            if a != b]
    res.update(worker_incidents=len(got), byte_identical=same, detect_brief=brief,
               worker_brief=sorted((i["incident_id"], i["status"], i.get("root_cause"))
                                   for i in got),
               load_after=machine_load())
    say(f"detect {len(ref)} incident events, workers {len(got)}: "
        f"{'byte-identical' if same else 'DIFFERENT'}; detect's: {brief[:6]}")
    out = HERE / "results" / f"streams_shards_identity_{args.ranks}{args.label}.json"
    out.write_text(json.dumps(res, indent=2))
    say(f"wrote {out}")


if __name__ == "__main__":
    main()
