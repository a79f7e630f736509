"""Agent CPU for relaying one host's 8 ranks (issue 31): the ranks hand their windows to
the agent over its Unix socket (``collectors.relay``), the agent gathers each window into
one ``comm_batch`` and publishes it through the real Publisher to a Tansu broker started
here.

The 8 ranks run in a child process (their cost is the training process's, not the
agent's); this process is the agent, and its CPU time (every thread: the relay's and
librdkafka's) is what is reported, as CPU seconds, not wall time, since the machine is
shared. Two measurements:

- ``fast``: ``--windows`` windows back to back: agent CPU per host-window (8 ranks' comm
  and step records), and that as a share of one core at one window a second;
- ``paced``: ``--seconds`` of real 1 s windows: agent CPU seconds over wall seconds,
  idle wake-ups and librdkafka's threads included.

Target: < 1 % of a core. Also printed: the load average and the busiest processes at the
start (what else was running).

``--replay`` measures `failslow replay` instead (issue 31): a per-rank trace slice
(``--replay-scenario large_1024``, ``--replay-steps``) published once per rank as before
(``--per-rank``) and once as the host agents publish it (a batch message per host and
window); per way: messages and value bytes on the topics (read back from the broker),
per second of the replay's wall time, and the replay process's CPU seconds (best of
``--replay-repeat``, start and imports included). Written to
bench/results/replay_batched.json.

    .venv/bin/python bench/agent_relay.py [--windows 2000] [--seconds 30]
    .venv/bin/python bench/agent_relay.py --replay [--replay-scenario large_1024] [--replay-steps 10] [--replay-repeat 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from failslow.collectors.publisher import Publisher  # noqa: E402
from failslow.collectors.relay import AgentPublisher, Relay  # noqa: E402
from failslow.schema import Topics  # noqa: E402
from failslow.stack import create_topics, start_broker  # noqa: E402

RANKS = 8
T0 = 1_767_225_600.0


def window(rank: int, w: int) -> list[dict]:
    """One tp8 pp8 rank's records of one 1 s window: its comm summary (tensor-parallel
    all-reduces, the data-parallel reduce-scatter/all-gather, pipeline send and recv) and
    its step end."""
    ts = T0 + w + rank * 1e-4
    ops = [("tp0", 8, "allreduce", 24), ("dp3", 16, "reducescatter", 1),
           ("dp3", 16, "allgather", 1), ("pp1-2", 2, "send", 4), ("pp0-1", 2, "recv", 4)]
    entries = [{"group": g, "group_size": size, "op": op, "n": n, "blocked_s": 0.01 * n + rank
                * 1e-4, "min_s": 0.004, "max_s": 0.02, "bytes": n << 24, "first_seq": w * n,
                "last_seq": w * n + n - 1} for g, size, op, n in ops]
    for e, (_, _, op, _) in zip(entries, ops, strict=True):
        if op in ("send", "recv"):
            e["peer"] = rank + 8
    comm = {"v": 1, "kind": "comm", "ts": ts, "job_id": "bench", "rank": rank, "host": "h0",
            "window_start_ts": ts - 1.0, "ops": entries, "step": w, "step_end": True,
            "world_size": 512, "gpu": rank}
    step = {"v": 1, "kind": "step", "ts": ts, "job_id": "bench", "rank": rank,
            "world_size": 512, "host": "h0", "step": w, "duration_s": 1.0, "gpu": rank}
    return [comm, step]


def ranks(sock: str, windows: int, period_s: float, ready: object) -> None:
    """The host's 8 training processes (one process here): a window each per period."""
    pubs = [AgentPublisher(sock, retry_s=0.05) for _ in range(RANKS)]
    records = [[window(r, w) for r in range(RANKS)] for w in range(windows)]
    ready.wait()  # type: ignore[attr-defined]
    start = time.monotonic()
    for w in range(windows):
        for pub, recs in zip(pubs, records[w], strict=True):
            pub.publish(recs)
        if period_s:
            time.sleep(max(0.0, start + (w + 1) * period_s - time.monotonic()))
    for pub in pubs:
        pub.close(30)


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(bootstrap: str, topics: Topics, windows: int, period_s: float) -> dict:
    tmp = tempfile.mkdtemp(prefix="agent-relay-")
    sock = os.path.join(tmp, "agent.sock")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=ranks, args=(sock, windows, period_s, ready))
    child.start()
    pub = Publisher(bootstrap, topics, spool_dir=os.path.join(tmp, "spool"), linger_ms=100)
    relay = Relay(sock, pub, linger_s=0.5).start()
    time.sleep(1.0)   # the child builds its records first
    c0, t0 = cpu_s(), time.monotonic()
    ready.set()
    child.join()
    while relay.batcher.pending:
        time.sleep(0.05)
    left = pub.flush(30)
    wall, cpu = time.monotonic() - t0, cpu_s() - c0
    relay.stop()
    pub.close(10)
    st = pub.stats
    return {"windows": windows, "ranks": RANKS, "wall_s": round(wall, 2),
            "agent_cpu_s": round(cpu, 3),
            "cpu_ms_per_host_window": round(1e3 * cpu / windows, 3),
            "relay_events": relay.counts["events"], "messages_delivered":
            st["messages_delivered"], "events_delivered": st["delivered"], "undelivered": left}


def topic_totals(bootstrap: str, topics: Topics) -> dict[str, dict[str, int]]:
    """Per event topic: messages and value bytes on it (read back from the broker)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    out = {}
    for topic in topics.inputs():
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-count",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        high = 0
        parts = []
        for p in range(4):
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if hi > lo:
                parts.append(TopicPartition(topic, p, OFFSET_BEGINNING))
                high += hi - lo
        consumer.assign(parts)
        msgs = size = 0
        deadline = time.monotonic() + 120
        while msgs < high and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=1.0):
                if not msg.error():
                    msgs += 1
                    size += len(msg.value())
        consumer.close()
        if msgs:
            out[topic[len(topics.prefix):]] = {"messages": msgs, "bytes": size}
    return out


def replay(bootstrap: str, path: str, per_rank: bool, events: int, repeat: int) -> dict:
    """`failslow replay` of ``path`` to fresh topics, ``repeat`` times: the least wall and
    CPU seconds (the process's, start and imports included), and what the last one put on
    its topics."""
    wall = cpu = float("inf")
    for i in range(repeat):
        topics = Topics(prefix=f"replay{int(per_rank)}{i}{int(time.time())}.")
        create_topics(bootstrap, topics)
        cmd = [sys.executable, "-m", "failslow.cli", "replay", path, "--bootstrap", bootstrap,
               "--topic-prefix", topics.prefix, *(["--per-rank"] if per_rank else [])]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        wall = min(wall, time.monotonic() - t0)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = min(cpu, ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime)
    totals = topic_totals(bootstrap, topics)
    msgs = sum(t["messages"] for t in totals.values())
    size = sum(t["bytes"] for t in totals.values())
    return {"way": "per-rank" if per_rank else "batched (host agents)",
            "summary": done.stdout.strip(), "wall_s": round(wall, 2),
            "replay_cpu_s": round(cpu, 2), "messages": msgs, "bytes": size,
            "messages_per_s": round(msgs / wall, 1), "bytes_per_s": round(size / wall),
            "bytes_per_message": round(size / max(msgs, 1)),
            "events_per_cpu_s": round(events / cpu) if cpu else None, "per_topic": totals}


def replay_main(scenario: str, steps: int, repeat: int) -> None:
    from failslow.simulator import SCENARIOS, simulate

    load, others = os.getloadavg(), busiest()
    tmp = tempfile.mkdtemp(prefix="replay-bench-")
    path = os.path.join(tmp, "trace.jsonl")
    lines = simulate(SCENARIOS[scenario], seed=0, steps=steps).write_jsonl(path)
    broker = start_broker()
    try:
        ways = [replay(broker.bootstrap, path, per_rank, lines, repeat)
                for per_rank in (True, False)]
    finally:
        broker.stop(timeout=1)
    result = {"scenario": scenario, "steps": steps, "repeat": repeat, "per_rank_events": lines,
              "trace_bytes": os.path.getsize(path), "ways": ways,
              "loadavg_at_start": [round(x, 2) for x in load], "busiest_at_start": others,
              "cpus": os.cpu_count()}
    print(json.dumps(result, indent=2))
    out = ROOT / "bench/results/replay_batched.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


def busiest() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"],
                         capture_output=True, text=True, check=False).stdout
    return [" ".join(line.split()) for line in out.splitlines()[:6]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--replay", action="store_true",
                        help="measure `failslow replay` per-rank vs batched instead")
    parser.add_argument("--replay-scenario", default="large_1024")
    parser.add_argument("--replay-steps", type=int, default=10)
    parser.add_argument("--replay-repeat", type=int, default=3, help="best of")
    args = parser.parse_args()
    if args.replay:
        replay_main(args.replay_scenario, args.replay_steps, args.replay_repeat)
        return
    load, others = os.getloadavg(), busiest()
    broker = start_broker()
    try:
        topics = Topics(prefix="bench.")
        create_topics(broker.bootstrap, topics)
        fast = measure(broker.bootstrap, topics, args.windows, 0.0)
        fast["core_pct_at_1s_windows"] = round(fast["cpu_ms_per_host_window"] / 10, 3)
        paced = measure(broker.bootstrap, topics, args.seconds, 1.0)
        paced["core_pct"] = round(100 * paced["agent_cpu_s"] / paced["wall_s"], 3)
    finally:
        broker.stop(timeout=1)
    result = {"fast": fast, "paced": paced, "target_core_pct": 1.0,
              "loadavg_at_start": [round(x, 2) for x in load], "busiest_at_start": others,
              "cpus": os.cpu_count()}
    print(json.dumps(result, indent=2))
    out = ROOT / "bench/results/agent_relay.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
