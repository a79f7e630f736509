"""Detection latency through `failslow worker` on the real Tansu broker, in wall time:
from the first faulty event produced to its incident on the incidents topic.

"The first faulty event" is the faulty rank's first event of the first step the fault
slows (the simulator applies a fault from the first step that starts after its onset
time; events between the onset time and that step carry nothing of it). The latency from
the onset time itself is printed too.

Workload: one job paced in real time (1 step = ``step_s`` = 1 s of wall time, ~1.15 s
with its collectives) sized to about half the sustained rate of
bench/streams_throughput.py (``--hosts`` x 8 GPUs, tp8 pp8, ~55 events per rank per step;
the default 104 hosts give ~32k events/s against ~65k sustained; at ``--step-s 0.5`` use
``--hosts 48``), with ``--faults`` GPU fail-slows on different ranks one after the other.
Each fault gives one latency sample. The Detector needs two steps of evidence (one-step
spikes never confirm), so about 2 step times of the latency are the decision itself;
the pipeline's own share is printed apart (the worker's processing-latency histogram:
produce -> processed).

    .venv/bin/python bench/streams_latency.py [--hosts 104] [--faults 6] [--step-s 1]

With ``--step-s 2`` or more (issue 15) the faults come after the warm-up, one every 3
steps for 2 steps, and the job has a TP all-reduce per layer, so the Detector confirms a
culprit from the ``comm`` windows inside the step (``models.substep``); use fewer hosts
(``--hosts 8 --faults 3 --step-s 8``: 64 ranks, ~4 min of wall time).

Prints numbers and writes bench/results/streams_latency.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request
import uuid
from bisect import bisect_left
from pathlib import Path

import numpy as np
import orjson
from confluent_kafka import Consumer

from failslow.collectors.publisher import Publisher
from failslow.schema import Topics
from failslow.simulator import FaultSpec, JobSpec, Scenario, simulate
from failslow.stack import create_topics, free_port, start_broker
from failslow.worker_process import WorkerProcess

RESULTS = Path(__file__).parent / "results"


def scenario(hosts: int, faults: int, step_s: float) -> Scenario:
    if step_s >= 2.0:
        # Long steps (issue 15): after the warm-up (~8 step times), one fault every 3 steps,
        # 2 steps long; a TP all-reduce per layer (4), so windows inside a step carry them.
        specs = tuple(FaultSpec(kind="gpu_thermal", start_s=(9 + 3 * i) * step_s,
                                end_s=(11 + 3 * i) * step_s, intensity=0.3,
                                rank=(37 * i + 5) % (hosts * 8), job="lat")
                      for i in range(faults))
        return Scenario(name="latency", description="sequential GPU fail-slows, long steps",
                        jobs=(JobSpec(job_id="lat", hosts=hosts, tp=8, pp=8, micro_batches=8,
                                      step_s=step_s, tp_ops=4),),
                        faults=specs, steps=12 + 3 * faults)
    specs = tuple(FaultSpec(kind="gpu_thermal", start_s=20 + 15 * i, end_s=30 + 15 * i,
                            intensity=0.3, rank=(37 * i + 5) % (hosts * 8), job="lat")
                  for i in range(faults))
    return Scenario(name="latency", description="sequential GPU fail-slows",
                    jobs=(JobSpec(job_id="lat", hosts=hosts, tp=8, pp=8, micro_batches=8, step_s=step_s),),
                    faults=specs,
                    steps=int((35 + 15 * faults) / step_s))


def watch_incidents(bootstrap: str, topic: str, seen: dict, stop: threading.Event) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 20,
                  "session.timeout.ms": 6000})
    c.subscribe([topic])
    while not stop.is_set():
        m = c.poll(0.05)
        if m is None or m.error():
            continue
        inc = orjson.loads(m.value())
        if inc["status"] == "open" and inc.get("rank") is not None:
            seen.setdefault(inc["rank"], (time.time(), inc))
    c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=104)
    ap.add_argument("--faults", type=int, default=6)
    ap.add_argument("--step-s", type=float, default=1.0, help="healthy step time, s")
    ap.add_argument("--batch-s", type=float, default=0.1,
                    help="event time per publish call (a collector's batching), s")
    ap.add_argument("--worker-args", default="",
                    help="extra `failslow worker` flags, e.g. '--jitter 0.2'")
    args = ap.parse_args()
    trace = simulate(scenario(args.hosts, args.faults, args.step_s), seed=0)
    # A live job publishes as things happen: in ts order (the trace is only roughly so).
    events = sorted(trace.events(), key=lambda e: e["ts"])
    truth = trace.truth
    span = events[-1]["ts"] - events[0]["ts"]
    print(f"{len(events):,} events over {span:.0f} s of event time = "
          f"{len(events) / span:,.0f} events/s, {args.hosts * 8} ranks")
    broker = start_broker()
    topics = Topics(f"l{uuid.uuid4().hex[:8]}.")
    create_topics(broker.bootstrap, topics)
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"failslow-latency-worker-{port}.log"
    print(f"worker log: {log}")
    worker = WorkerProcess(broker.bootstrap, topics, group="lat", metrics_port=port,
                           extra=args.worker_args.split(), log_path=log)
    seen: dict[int, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_incidents, daemon=True,
                               args=(broker.bootstrap, topics.for_kind("incident"), seen, stop))
    watcher.start()
    pub = Publisher(broker.bootstrap, topics, linger_ms=5)
    first_faulty: dict[int, tuple[float, float]] = {}  # rank -> (wall, ts) of its first faulty event
    first_onset: dict[int, float] = {}  # rank -> wall time of its first event after the onset time
    published: list[tuple[float, float]] = []  # (newest ts, wall time) per published chunk
    try:
        time.sleep(6.0)  # group join
        # Live timestamps, as collectors stamp them: the trace starts now.
        shift = time.time() - events[0]["ts"]
        # Every time field moves (ts, a step's start_ts, a comm window's window_start_ts;
        # a window left in the trace's time would look hours long to the Detector).
        for e in events:
            for f in ("ts", "start_ts", "window_start_ts"):
                if e.get(f) is not None:
                    e[f] += shift
        # The simulator applies a fault from the first step that starts after its onset
        # time: the first event it affects is the rank's first event of that step.
        onsets = {f["rank"]: f["onset_ts"] + shift for f in truth["faults"]}
        onset_step = {f["rank"]: f["onset_step"] for f in truth["faults"]}
        t0, ts0 = time.time(), events[0]["ts"]
        start = 0
        for n in range(1, len(events) + 1):
            if n < len(events) and events[n]["ts"] - events[start]["ts"] < args.batch_s:
                continue
            chunk = events[start:n]
            start = n
            delay = (chunk[-1]["ts"] - ts0) - (time.time() - t0)
            if delay > 0:
                time.sleep(delay)
            pub.publish(chunk)
            now = time.time()
            published.append((chunk[-1]["ts"], now))
            for e in chunk:
                r = e.get("rank")
                if r in onsets and r not in first_faulty and (e.get("step") or -1) >= onset_step[r]:
                    first_faulty[r] = (now, e["ts"])
                if r in onsets and r not in first_onset and e["ts"] >= onsets[r]:
                    first_onset[r] = now
        pub.flush(10)
        time.sleep(5.0)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        pub.close()
        stop.set()
        worker.stop()
        broker.stop(2)
    found = [r for r in onsets if r in seen and r in first_faulty]
    lat = [seen[r][0] - first_faulty[r][0] for r in found]
    lat_onset = [seen[r][0] - first_onset[r] for r in found]
    # How far behind its pace the publisher was (wall s) when it sent each chunk: a lag at
    # the first faulty event but not at the confirming step would shorten the latency.
    behind = [w - t0 - (ts - ts0) for ts, w in published]
    print(f"publisher behind its pace: p50 {np.percentile(behind, 50):.3f} s, max "
          f"{max(behind):.3f} s; at the first faulty events: "
          f"{[round(first_faulty[r][0] - t0 - (first_faulty[r][1] - ts0), 3) for r in found]}")
    # The decision's share: event time from the first faulty event to the step that
    # confirmed it; the pipeline's: from publishing that step to the incident on the topic.
    decide = [seen[r][1]["detected_ts"] - first_faulty[r][1] for r in found]
    pub_ts = [p[0] for p in published]
    pipe = [seen[r][0] - published[min(bisect_left(pub_ts, seen[r][1]["detected_ts"]),
                                       len(published) - 1)][1] for r in found]
    missed = [r for r in onsets if r not in seen]
    buckets = {}
    for line in body.decode().splitlines():
        if line.startswith("failslow_stream_processing_latency_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
    total = buckets.get("+Inf", 0.0)
    pipe_p50 = next((le for le, c in buckets.items() if total and c / total >= 0.5), None)
    pipe_p99 = next((le for le, c in buckets.items() if total and c / total >= 0.99), None)
    res = {"ranks": args.hosts * 8, "events_per_s": len(events) / span, "samples": len(lat),
           "missed_faults": missed, "latency_s": sorted(lat),
           "p50_s": float(np.percentile(lat, 50)) if lat else None,
           "p99_s": float(np.percentile(lat, 99)) if lat else None,
           "from_onset_time_p50_s": float(np.percentile(lat_onset, 50)) if lat else None,
           "from_onset_time_p99_s": float(np.percentile(lat_onset, 99)) if lat else None,
           "decision_event_time_s": sorted(decide), "pipeline_s": sorted(pipe),
           "step_s": args.step_s,
           "pipeline_latency_p50_le_s": pipe_p50, "pipeline_latency_p99_le_s": pipe_p99}
    print(f"detection latency over {len(lat)} faults: p50 {res['p50_s']:.2f} s, "
          f"p99 {res['p99_s']:.2f} s (missed: {missed or 'none'})")
    print(f"from the injected onset time instead (up to a step before the fault shows): p50 "
          f"{res['from_onset_time_p50_s']:.2f} s, p99 {res['from_onset_time_p99_s']:.2f} s")
    print(f"decision (event time, first faulty event -> confirming step): p50 "
          f"{np.percentile(decide, 50):.2f} s; pipeline (confirming step published -> incident "
          f"on the topic): p50 {np.percentile(pipe, 50):.2f} s, max {max(pipe):.2f} s")
    print(f"pipeline share (produce -> processed): p50 <= {pipe_p50} s, p99 <= {pipe_p99} s")
    RESULTS.mkdir(exist_ok=True)
    res["worker_args"] = args.worker_args
    name = "streams_latency" if args.step_s == 1.0 else f"streams_latency_step{args.step_s:g}s"
    if args.worker_args:
        name += "_tuned"
    (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
