"""One large job at 2 s steps, offline: what `failslow detect` and a worker's partition
cost per judged step and per 1,000 ranks, how large the partition's snapshot is and how
long a restart from it takes.

For each size (ranks, tp8 pp8, ranks / 8 hosts with 1 Hz GPU/NIC/host telemetry, comm
grain, 2 s steps) the simulator writes the trace (JSON Lines, as `failslow simulate
--out` writes it), then

- `failslow detect TRACE` runs as a child process: its CPU (user + sys) and peak RSS
  (wait4). CPU per judged step is CPU / steps; per rank-step, CPU / (ranks x steps).
- a child process feeds the same events to a ``JobPartition`` (the worker's per-partition
  state: de-duplication marks + the Detector), takes its snapshot, encodes it as the
  worker does (``SnapshotStore.encode``: JSON, zlib 1), writes it to a Tansu broker and
  reads it back (``read_latest``), and restores a partition from it: the restart's cost
  without the group join.

Memory per 1,000 ranks is the slope of detect's peak RSS between the sizes; a size that
cannot run here is extrapolated from the slope (said so in the output).

    .venv/bin/python bench/streams_scale.py [--ranks 1024 4096 16384] [--steps 10]

Prints numbers and writes bench/results/streams_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def scenario(ranks: int, steps: int):
    from failslow.simulator import JobSpec, Scenario

    return Scenario(f"one_{ranks}_2s", f"one {ranks:,}-rank job tp8 pp8, 2 s steps",
                    (JobSpec(job_id="big", hosts=ranks // 8, tp=8, pp=8, micro_batches=8,
                             step_s=2.0),), steps=steps, large=True)


def write_trace(ranks: int, steps: int, path: Path) -> dict:
    from failslow.simulator import simulate

    t0 = time.process_time()
    n = 0
    with path.open("wb") as f:
        for ev in simulate(scenario(ranks, steps), seed=0, steps=steps).events():
            f.write(orjson.dumps(ev) + b"\n")
            n += 1
    return {"events": n, "simulate_cpu_s": time.process_time() - t0,
            "trace_bytes": path.stat().st_size}


def child(cmd: list[str]) -> tuple[float, int, str]:
    """Run ``cmd``; (CPU s, peak RSS bytes, stdout)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    out = proc.stdout.read().decode() if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd} failed ({status})")
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, out


def snapshot_child(trace: str, bootstrap: str) -> None:
    """In a child: a partition fed the trace; snapshot, broker round trip, restore."""
    import zlib

    from failslow.models.shard import SHARD_RANKS, ShardedDetector
    from failslow.streams.partition import JobPartition
    from failslow.streams.snapshots import SnapshotStore

    # issue 16: a partition holds one shard of a large job (its ranks and their hosts'
    # telemetry), as the route stage sends it; a job of one shard is all of it
    part = JobPartition(0, lateness=10.0, detector_factory=ShardedDetector,
                        detector_restore=ShardedDetector.from_state)
    batch: list[dict] = []
    hosts: set[str] = set()
    placed: set[str] = set()
    job_kinds = ("step", "comm", "collective")
    with open(trace, "rb") as f:
        for line in f:
            ev = orjson.loads(line)
            if ev["kind"] in job_kinds:
                placed.add(ev["host"])
                if ev["rank"] >= SHARD_RANKS:
                    continue
                hosts.add(ev["host"])
            elif ev["host"] in placed and ev["host"] not in hosts:
                continue     # another shard's host (a host not placed yet goes everywhere)
            batch.append(ev)
            if len(batch) == 5_000:
                # through the partition's input limits, as the worker's ingest: samples of
                # a host no job here names wait there (bounded, never in a snapshot); fed
                # past them, every host not placed yet reached the detector and made the
                # snapshot 4x a lone job's (18.7 MiB at 131,072 ranks)
                part._feed(part.limits.admit(batch))
                batch = []
    part._feed(part.limits.admit(batch))
    t0, c0 = time.perf_counter(), time.process_time()
    snap = part.snapshot()
    blob = SnapshotStore.encode(snap)
    encode_s, encode_cpu = time.perf_counter() - t0, time.process_time() - c0
    store = SnapshotStore(bootstrap, "scale.internal.snapshots")
    t0 = time.perf_counter()
    store.write_blob(0, blob)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = store.read_latest(0)
    read_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    fresh = JobPartition(0, lateness=10.0, detector_factory=ShardedDetector,
                         detector_restore=ShardedDetector.from_state)
    fresh.restore(back if back is not None else orjson.loads(zlib.decompress(blob)))
    restore_s, restore_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"snapshot_bytes": len(blob), "snapshot_encode_s": encode_s,
                      "snapshot_write_s": write_s, "snapshot_read_s": read_s,
                      "restore_s": restore_s, "read_from_broker": back is not None,
                      "snapshot_encode_cpu_s": encode_cpu, "restore_cpu_s": restore_cpu,
                      "judged_rank_steps": part.counts["judged_rank_steps"],
                      "snapshot_scope": f"shard 0: ranks below {SHARD_RANKS:,} and their hosts"}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--target-ranks", type=int, default=131_072)
    ap.add_argument("--snapshot-child", nargs=2, metavar=("TRACE", "BOOTSTRAP"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.snapshot_child:
        snapshot_child(*args.snapshot_child)
        return
    from confluent_kafka.admin import AdminClient, NewTopic

    from failslow.stack import start_broker

    broker = start_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("scale.internal.snapshots", 1, 1)]
                        )["scale.internal.snapshots"].result()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="failslow-scale-") as tmp:
            for ranks in sorted(args.ranks):
                trace = Path(tmp) / f"job_{ranks}.jsonl"
                row: dict = {"ranks": ranks, "steps": args.steps, "step_s": 2.0,
                             "loadavg_before": os.getloadavg()}
                row.update(write_trace(ranks, args.steps, trace))
                cpu, rss, _ = child([sys.executable, "-m", "failslow.cli", "detect",
                                     str(trace), "--out", os.devnull])
                row.update(detect_cpu_s=cpu, detect_peak_rss_bytes=rss,
                           detect_cpu_per_step_s=cpu / args.steps,
                           detect_cpu_per_rank_step_us=cpu / (ranks * args.steps) * 1e6)
                _, prss, out = child([sys.executable, str(Path(__file__).resolve()),
                                      "--snapshot-child", str(trace), broker.bootstrap])
                row.update(orjson.loads(out.strip().splitlines()[-1]))
                row["partition_peak_rss_bytes"] = prss
                row["loadavg_after"] = os.getloadavg()
                trace.unlink()
                rows.append(row)
                print(f"{ranks:>7,} ranks: {row['events']:,} events, detect {cpu:.1f} CPU s = "
                      f"{row['detect_cpu_per_step_s']:.2f} s per judged step, "
                      f"{row['detect_cpu_per_rank_step_us']:.0f} us per rank-step; peak RSS "
                      f"{rss / 2**20:,.0f} MiB (partition {prss / 2**20:,.0f}); snapshot "
                      f"{row['snapshot_bytes'] / 2**20:.1f} MiB, encode "
                      f"{row['snapshot_encode_s']:.2f} s, broker write {row['snapshot_write_s']:.2f} "
                      f"s, read {row['snapshot_read_s']:.2f} s, restore {row['restore_s']:.2f} s; "
                      f"load {row['loadavg_before']}", flush=True)
    finally:
        broker.stop(2)
    out: dict = {"runs": rows}
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        per_k = (b["detect_peak_rss_bytes"] - a["detect_peak_rss_bytes"]) / (
            (b["ranks"] - a["ranks"]) / 1000)
        fixed = a["detect_peak_rss_bytes"] - per_k * a["ranks"] / 1000
        snap_per_k = (b["snapshot_bytes"] - a["snapshot_bytes"]) / ((b["ranks"] - a["ranks"]) / 1000)
        scale = args.target_ranks / b["ranks"]
        out["per_1000_ranks"] = {"detect_rss_bytes": per_k, "fixed_rss_bytes": fixed,
                                 "snapshot_bytes": snap_per_k}
        out["extrapolated"] = {
            "ranks": args.target_ranks, "how": f"linear from {b['ranks']:,} ranks (x{scale:g})",
            "detect_rss_bytes": fixed + per_k * args.target_ranks / 1000,
            "cpu_per_judged_step_s": b["detect_cpu_per_step_s"] * scale,
            "snapshot_bytes": b["snapshot_bytes"] * scale,
            "restart_s": (b["snapshot_read_s"] + b["restore_s"]) * scale}
        print(f"per 1,000 ranks: detect RSS {per_k / 2**20:.0f} MiB (+{fixed / 2**20:.0f} MiB "
              f"fixed), snapshot {snap_per_k / 2**20:.2f} MiB")
        e = out["extrapolated"]
        print(f"{args.target_ranks:,} ranks, EXTRAPOLATED {e['how']}: detect RSS "
              f"{e['detect_rss_bytes'] / 2**30:.1f} GiB, {e['cpu_per_judged_step_s']:.0f} CPU s "
              f"per judged step, snapshot {e['snapshot_bytes'] / 2**20:.0f} MiB, restart "
              f"(read + restore) {e['restart_s']:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "streams_scale.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
