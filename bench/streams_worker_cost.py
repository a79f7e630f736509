"""The worker's CPU per judged rank-step against `failslow detect`'s, on the same batched
trace, offline, broken down by stage (issue 31, part 3: "the worker stays close to detect").

For each size (ranks, tp8 pp8, 2 s steps or ``--step-s``, comm grain, 1 Hz GPU/NIC/host
telemetry: bench/streams_scale.py's scenario) the simulator's events are batched as the host agents
publish them (``schema.batches.batch_trace``: one ``comm_batch`` / ``gpu_batch`` per host
and window) and written as a JSON Lines trace. Then, each in a child process (CPU = user +
sys from wait4, nothing else in the child):

- ``failslow detect TRACE``;
- the worker's path with no broker: the trace cut into Kafka messages as ``Publisher``
  cuts them (0.1 s slices of event time, grouped per topic and key, at most 500 objects and
  ``MESSAGE_MAX_BYTES`` a message), the real ``RouteStage.route_batch`` (its packs kept, not sent), then the real
  ``JobStage.judge_message`` on each pack of the partitions, ``tick_one`` after each
  slice, and one ``take_snapshot`` at the end (shown apart, not in the ratio: the worker
  spends at most ``SNAPSHOT_SHARE`` of its time on them). The worker's clock follows
  the trace's event time. The trace is read a slice at a time and its reading (the
  publisher's decode and cut) is left out of the CPU counted: only the route, the judging
  and the ticks are.

The worker child times its stages with ``time.process_time`` (inclusive times; the
wrappers add ~1 us a call) and prints them. Ratio = worker CPU per judged rank-step /
detect's. A second pass with no wrappers gives the worker's total.

    .venv/bin/python bench/streams_worker_cost.py [--ranks 1024 4096 16384] [--steps 6] [--step-s 2]
        [--cprofile 25]   # and the worker path's 25 costliest functions (cProfile, own time)
    # 131,072 ranks without simulating them (an hour, ~10 GB): cut 4 steps out of the trace
    # bench/detect_flat.py keeps, then run both on it (detect ~4 CPU min, the worker ~6 a pass)
    .venv/bin/python bench/streams_worker_cost.py --ranks 131072 --steps 4 --partitions 32 \
        --trace-dir DIR --cut-from DIR/flat_131072_pp8_2s_12.jsonl

Prints numbers and writes bench/results/streams_worker_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import orjson

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))


def scenario(ranks: int, steps: int, step_s: float = 2.0):
    """bench/streams_scale.py's job (tp8 pp8, ranks / 8 hosts) at ``step_s`` steps."""
    from failslow.simulator import JobSpec, Scenario

    return Scenario(f"one_{ranks}_{step_s:g}s", f"one {ranks:,}-rank job tp8 pp8, {step_s:g} s "
                    "steps", (JobSpec(job_id="big", hosts=ranks // 8, tp=8, pp=8,
                                      micro_batches=8, step_s=step_s),), steps=steps, large=True)


def write_batched(ranks: int, steps: int, path: Path, step_s: float = 2.0) -> dict:
    from failslow.schema.batches import batch_trace
    from failslow.simulator import simulate

    n = 0
    events = simulate(scenario(ranks, steps, step_s), seed=0, steps=steps).events()
    with path.open("wb") as f:
        for obj in batch_trace(events):
            f.write(orjson.dumps(obj) + b"\n")
            n += 1
    return {"objects": n, "trace_bytes": path.stat().st_size}


def _step_of(obj: dict) -> int | None:
    s = obj.get("step")
    return max(s) if isinstance(s, list) else s


def _first_ts(obj: dict) -> float:
    t = obj["ts"]
    return t[0] if isinstance(t, list) else t


def cut_batched(src: Path, steps: int, path: Path) -> dict:
    """The first ``steps`` steps of a batched trace (bench/detect_flat.py keeps one per size;
    the same tp8 pp8 job shape, with its one injected slow GPU): the comm and step batches
    of steps below ``steps``, the device samples up to the last kept step's end. At 131,072
    ranks this takes minutes where simulating takes about an hour and ~10 GB."""
    end = 0.0
    late = None
    with src.open("rb") as f:   # the last kept step's end: its step batches' newest ts
        for line in f:
            if b'"step_batch"' not in line[:40]:
                continue
            obj = orjson.loads(line)
            if (_step_of(obj) or 0) < steps:
                ts = obj["ts"]
                end = max(end, max(ts) if isinstance(ts, list) else ts)
            elif late is None:
                late = _first_ts(obj)
            elif _first_ts(obj) > late + 60.0:   # well past the cut: stop reading
                break
    n = 0
    with src.open("rb") as f, path.open("wb") as out:
        for line in f:
            obj = orjson.loads(line)
            t0 = _first_ts(obj)
            if t0 > end + 30.0:
                break
            if obj["kind"] in ("comm_batch", "step_batch", "comm", "step"):
                step = _step_of(obj)
                if step is None or step >= steps:
                    continue
            elif t0 > end:
                continue
            out.write(line)
            n += 1
    return {"objects": n, "trace_bytes": path.stat().st_size, "cut_from": str(src)}


class _Topic:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send(self, **kwargs) -> None:
        self.sent.append(kwargs)


class _Msg:
    __slots__ = ("topic", "key", "value", "timestamp", "partition", "offset")

    def __init__(self, topic: str, key: bytes | None, value: bytes, ts: float) -> None:
        self.topic, self.key, self.value, self.timestamp = topic, key, value, ts


STAGES: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])


def timed(owner, name: str, label: str) -> None:
    """Wrap ``owner.name`` to add its CPU time (inclusive) to ``STAGES[label]``."""
    fn = getattr(owner, name)
    clock = time.process_time

    if asyncio.iscoroutinefunction(fn):
        async def wrap_async(*a, **k):
            t0 = clock()
            try:
                return await fn(*a, **k)
            finally:
                s = STAGES[label]
                s[0] += clock() - t0
                s[1] += 1
        setattr(owner, name, wrap_async)
        return

    def wrap(*a, **k):
        t0 = clock()
        try:
            return fn(*a, **k)
        finally:
            s = STAGES[label]
            s[0] += clock() - t0
            s[1] += 1
    setattr(owner, name, wrap)


def instrument() -> None:
    from failslow.models.shard import ShardedDetector
    from failslow.streams import job_stage, outputs, route_stage, sharding
    from failslow.streams.clocks import ClockGuard
    from failslow.streams.limits import InputLimits
    from failslow.streams.ordering import EventOrder
    from failslow.streams.partition import JobPartition

    timed(route_stage.RouteStage, "route_batch", "route: all")
    timed(route_stage.RouteStage, "learn_hosts", "route: learn hosts (steps)")
    timed(route_stage.RouteStage, "learn_gpu_host", "route: learn hosts (gpu)")
    timed(route_stage, "shard_parts", "route: shard split (decode/re-encode)")
    timed(route_stage, "split_value", "route: split_value")
    timed(outputs, "pack", "route: pack")
    timed(sharding, "split_batch", "route: split_batch")
    timed(job_stage.JobStage, "judge_message", "job: all")
    timed(job_stage, "unpack", "job: unpack")
    timed(job_stage, "decode_value", "job: decode")
    timed(JobPartition, "ingest", "job: ingest")
    timed(ClockGuard, "screen", "job: ingest: clock screen")
    timed(InputLimits, "admit", "job: ingest: input limits")
    timed(EventOrder, "add", "job: ingest: order add")
    timed(EventOrder, "advance", "job: ingest: order advance")
    timed(JobPartition, "_feed", "job: feed (dedupe + detector)")
    timed(ShardedDetector, "process_batch", "job: feed: detector")
    timed(job_stage.JobStage, "tick_one", "tick")


def messages(trace: str, topics, slice_s: float = 0.1, batch_events: int = 500):
    """The trace as the Publisher sends it: per slice of event time, [(msg, ...)], ts."""
    from failslow.schema.limits import MESSAGE_MAX_BYTES, pack_messages
    from failslow.schema.topics import key_for

    def cut(chunk: list[dict]) -> list[_Msg]:
        groups: dict[tuple[str, str], list[dict]] = {}
        for ev in chunk:
            groups.setdefault((topics.for_kind(ev["kind"]), key_for(ev)), []).append(ev)
        out = []
        for (topic, key), evs in groups.items():
            for i in range(0, len(evs), batch_events):
                # at most MESSAGE_MAX_BYTES a message too, as the Publisher packs them
                # (``pack_messages``): 500 hosts' comm batches made values of ~1.5 MB that
                # the route cut again (decoded and encoded: 0.5 CPU s at 16,384 ranks)
                packed, alone = pack_messages(evs[i:i + batch_events], MESSAGE_MAX_BYTES)
                for value in [v for v, _ in packed] + alone:
                    out.append(_Msg(topic, key.encode(), value, ts(evs[0])))
        return out

    def ts(ev: dict) -> float:   # a batch's first row's
        t = ev["ts"]
        return t[0] if type(t) is list else t

    chunk: list[dict] = []
    with open(trace, "rb") as f:
        for line in f:
            ev = orjson.loads(line)
            if chunk and ts(ev) - ts(chunk[0]) >= slice_s:
                yield cut(chunk), ts(chunk[-1])
                chunk = []
            chunk.append(ev)
    if chunk:
        yield cut(chunk), ts(chunk[-1])


def worker_child(trace: str, partitions: int, profile: bool) -> None:
    """In a child: the trace through the route and job stages (no broker); prints JSON."""
    if profile:
        instrument()
    from failslow.schema import Topics
    from failslow.streams.config import WorkerConfig
    from failslow.streams.job_stage import JobStage
    from failslow.streams.metrics import Metrics
    from failslow.streams.outputs import Outputs
    from failslow.streams.route_stage import RouteStage
    from failslow.streams.routing import HostMap
    from failslow.streams.snapshots import SnapshotStore

    cfg = WorkerConfig(bootstrap="unused:1", topics=Topics())
    sinks = {name: _Topic() for name in ("job", "incidents", "dead", "hostmap")}
    metrics = Metrics()
    out = Outputs(metrics, partitions=partitions, **sinks)
    hostmap = HostMap()
    route = RouteStage(cfg, partitions, out, metrics, hostmap)
    jobs = JobStage(cfg, partitions, out, metrics, hostmap, SnapshotStore.__new__(SnapshotStore))
    # the trace read a slice at a time, its reading left out of the CPU counted (it is the
    # publisher's cost): held whole, a 131,072-rank trace's messages took ~13 GB
    slices = messages(trace, cfg.topics)
    if os.environ.get("WCOST_GC", "worker") == "worker":
        # the collector as `failslow worker` sets it (what lives now, the messages
        # included, frozen; young collections every 50,000 allocations): at CPython's
        # defaults the path re-walked the growing state, as detect (tuned too) does not
        from failslow.commands.worker import tune_gc

        tune_gc()
    offsets = [0] * partitions
    loop = asyncio.new_event_loop()
    prof = None
    if os.environ.get("WCOST_CPROFILE"):
        import cProfile

        prof = cProfile.Profile(time.process_time)
        prof.enable()
    cpu = 0.0
    last_ts = 0.0
    clock = time.process_time
    while True:
        if prof is not None:
            prof.disable()
        got = next(slices, None)
        if got is None:
            break
        msgs, last_ts = got
        if prof is not None:
            prof.enable()
        c0 = clock()
        now = last_ts + 0.5
        loop.run_until_complete(route.route_batch(msgs, now))
        sent, sinks["job"].sent = sinks["job"].sent, []
        for s in sent:
            p = s["partition"]
            state = jobs.parts.get(p)
            if state is None:
                state = jobs.parts[p] = jobs.new_partition(p)
                jobs.announced[p] = {}
            offsets[p] += 1
            for kind, *args in jobs.judge_message(state, p, s["value"], offsets[p], now,
                                                  jobs.announced[p]):
                if kind == "dead":
                    metrics.deadletters.labels(args[1]).inc()
        sinks["hostmap"].sent.clear()
        for state in jobs.parts.values():
            jobs.tick_one(state, now, True)
        cpu += clock() - c0
        del msgs, got
    # the end of the trace: let the partitions release what they hold
    if prof is not None:
        prof.enable()
    c0 = clock()
    for state in jobs.parts.values():
        jobs.tick_one(state, last_ts + 60.0, False)
    cpu += clock() - c0
    if prof is not None:
        import io
        import pstats

        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(
            int(os.environ["WCOST_CPROFILE"]))
        sys.stderr.write(text.getvalue())
    judged = sum(s.counts["judged_rank_steps"] for s in jobs.parts.values())
    c1 = time.process_time()
    snap_bytes = 0
    for state in jobs.parts.values():
        snap = state.snapshot()
        snap_bytes += len(SnapshotStore.encode(snap))
    snap_cpu = time.process_time() - c1
    print(json.dumps({"worker_cpu_s": cpu, "judged_rank_steps": judged,
                      "partitions_used": sorted(jobs.parts), "snapshot_cpu_s": snap_cpu,
                      "snapshot_bytes": snap_bytes,
                      "peak_rss_mib": peak_rss_mib(),
                      "incidents": sum(s.counts["incidents"] for s in jobs.parts.values()),
                      "deadletters": sum(len(v) for v in [sinks["dead"].sent]),
                      "stages": {k: {"cpu_s": v[0], "calls": v[1]}
                                 for k, v in sorted(STAGES.items())}}))


def peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM, MiB): getrusage's ru_maxrss also counts what
    the parent held before the exec (bench/detect_flat.py)."""
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kb / 1024


def run_child(args: list[str]) -> tuple[float, str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args} failed: {err.decode()[-3000:]}")
    return ru.ru_utime + ru.ru_stime, out.decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--out", default=str(RESULTS / "streams_worker_cost.json"))
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also run the worker path under cProfile and print its N "
                         "functions of most own CPU time")
    ap.add_argument("--shard-ranks", type=int, default=0,
                    help="FAILSLOW_SHARD_RANKS for detect and the worker (default: theirs, "
                         "4,096): 1,024 gives a 4,096-rank job a 16,384-rank one's 4 shards")
    ap.add_argument("--trace-dir", default=None,
                    help="keep the batched traces here and reuse them when present")
    ap.add_argument("--cut-from", default=None, metavar="TRACE",
                    help="make a missing trace by cutting the first --steps steps out of this "
                         "batched trace of the same size (bench/detect_flat.py --trace-dir "
                         "keeps one; it carries one slow GPU) instead of simulating")
    ap.add_argument("--worker-child", nargs=3, metavar=("TRACE", "PARTS", "PROFILE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--write-trace", nargs=4, metavar=("RANKS", "STEPS", "STEP_S", "PATH"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_trace:
        n, steps, step_s, path = args.write_trace
        print(json.dumps(write_batched(int(n), int(steps), Path(path), float(step_s))))
        return
    if args.worker_child:
        trace, parts, prof = args.worker_child
        worker_child(trace, int(parts), prof == "1")
        return
    if args.cut_from and len(args.ranks) != 1:
        raise SystemExit("--cut-from: one --ranks, the size of the trace it cuts")
    rows = []
    me = str(Path(__file__).resolve())
    if args.shard_ranks:   # for detect and the worker alike (models/shard.py)
        os.environ["FAILSLOW_SHARD_RANKS"] = str(args.shard_ranks)
    with tempfile.TemporaryDirectory(prefix="failslow-wcost-") as tmp:
        for ranks in args.ranks:
            keep = Path(args.trace_dir) if args.trace_dir else None
            trace = (keep or Path(tmp)) / f"b_{ranks}_{args.steps}_{args.step_s:g}.jsonl"
            row: dict = {"ranks": ranks, "steps": args.steps, "step_s": args.step_s,
                         "partitions": args.partitions, "loadavg_before": os.getloadavg()}
            if args.shard_ranks:
                row["shard_ranks"] = args.shard_ranks
            if keep is not None and trace.exists():
                row.update(objects=sum(1 for _ in trace.open("rb")),
                           trace_bytes=trace.stat().st_size)
            else:
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
            if args.cut_from and not trace.exists():
                row.update(cut_batched(Path(args.cut_from), args.steps, trace))
            elif not trace.exists():
                # in a child: the simulator's memory goes back when it exits, not held
                # by this parent beside the worker child (131,072 ranks: GBs)
                _, out = run_child([sys.executable, me, "--write-trace", str(ranks),
                                    str(args.steps), str(args.step_s), str(trace)])
                row.update(orjson.loads(out.strip().splitlines()[-1]))
            det_cpu, det_out = run_child([sys.executable, "-m", "failslow.cli", "detect",
                                          str(trace), "--out", os.devnull])
            # the same child on the trace's first line: the start (imports), which the
            # worker pays once, not per step
            one = Path(tmp) / "one.jsonl"
            with trace.open("rb") as f:
                one.write_bytes(f.readline())
            start_cpu, _ = run_child([sys.executable, "-m", "failslow.cli", "detect", str(one),
                                      "--out", os.devnull])
            # detect judges every step of the trace: ranks x steps rank-steps
            det_rs = ranks * args.steps
            row.update(detect_start_cpu_s=start_cpu,
                       detect_judging_us_per_rank_step=(det_cpu - start_cpu) / det_rs * 1e6)
            w_cpu, w_out = run_child([sys.executable, me, "--worker-child", str(trace),
                                      str(args.partitions), "0"])
            plain = orjson.loads(w_out.strip().splitlines()[-1])
            _, p_out = run_child([sys.executable, me, "--worker-child", str(trace),
                                  str(args.partitions), "1"])
            prof = orjson.loads(p_out.strip().splitlines()[-1])
            if args.cprofile:
                env = dict(os.environ, WCOST_CPROFILE=str(args.cprofile))
                proc = subprocess.run([sys.executable, me, "--worker-child", str(trace),
                                       str(args.partitions), "0"], cwd=ROOT, env=env,
                                      capture_output=True, text=True, check=True)
                print(proc.stderr, flush=True)
            judged = plain["judged_rank_steps"] or 1
            row.update(detect_cpu_s=det_cpu, detect_us_per_rank_step=det_cpu / det_rs * 1e6,
                       worker_child_cpu_s=w_cpu, worker_path_cpu_s=plain["worker_cpu_s"],
                       worker_judged_rank_steps=plain["judged_rank_steps"],
                       worker_us_per_rank_step=plain["worker_cpu_s"] / judged * 1e6,
                       snapshot_cpu_s=plain["snapshot_cpu_s"],
                       snapshot_bytes=plain["snapshot_bytes"],
                       worker_peak_rss_mib=plain.get("peak_rss_mib"),
                       worker_incidents=plain["incidents"],
                       partitions_used=plain["partitions_used"],
                       profiled_cpu_s=prof["worker_cpu_s"], stages=prof["stages"],
                       loadavg_after=os.getloadavg())
            row["ratio"] = row["worker_us_per_rank_step"] / row["detect_us_per_rank_step"]
            row["ratio_judging"] = (row["worker_us_per_rank_step"]
                                    / row["detect_judging_us_per_rank_step"])
            rows.append(row)
            print(f"{ranks:>6,} ranks x {args.steps} steps ({row['objects']:,} objects): detect "
                  f"{row['detect_us_per_rank_step']:.1f} us/rank-step ({det_cpu:.1f} CPU s, "
                  f"child incl. start); worker path {row['worker_us_per_rank_step']:.1f} "
                  f"us/judged rank-step ({plain['worker_cpu_s']:.1f} CPU s, "
                  f"{judged:,} judged, partitions {plain['partitions_used']}) -> "
                  f"{row['ratio']:.2f}x ({row['ratio_judging']:.2f}x of detect less its "
                  f"{start_cpu:.1f} CPU s start); snapshot {plain['snapshot_cpu_s']:.2f} CPU s "
                  f"({plain['snapshot_bytes'] / 2**20:.1f} MiB); load "
                  f"{row['loadavg_before'][0]:.1f}->{row['loadavg_after'][0]:.1f}", flush=True)
            for name, s in prof["stages"].items():
                print(f"    {name:<42} {s['cpu_s']:8.2f} CPU s {s['calls']:>8,} calls "
                      f"{s['cpu_s'] / judged * 1e6:8.1f} us/rank-step")
            if keep is None:
                trace.unlink()
    RESULTS.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": rows}, indent=2))


if __name__ == "__main__":
    main()
