"""Is `failslow detect`'s CPU per rank-step flat in the job's size? (issue 31: within 1.3x
from 1,024 to 131,072 ranks.)

One job shape at every size: tp8 pp8 (``--pp``), ``--step-s`` steps, comm grain, 1 Hz
GPU / NIC / host telemetry, one GPU throttled 40 % from a quarter of the run on (so judging,
localization and the incident's evidence all run: the incident events are counted), ``--steps`` steps at every size. The
trace is what the host agents publish (``schema.batches.batch_trace``), streamed to a file
as it is simulated (a 131,072-rank trace never sits in memory), then read by a child
process running the CLI's own ``detect_lines``: process CPU time, best of ``--repeat``, and
the child's own peak RSS (VmHWM). Rank-steps are the trace's judged steps (``step`` rows, batched or
not).

    .venv/bin/python bench/detect_flat.py [--ranks 1024 4096 16384 131072] [--steps 12]
        [--pp 8] [--step-s 2.0] [--repeat 1] [--out bench/results/detect_flat.json]

Prints one line per size and the ratio of each size's CPU per rank-step to the smallest's.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.schema.batches import BATCH_KINDS  # noqa: E402
from failslow.simulator import simulate  # noqa: E402
from failslow.simulator.batching import batch_events  # noqa: E402
from failslow.simulator.spec import FaultSpec, JobSpec, Scenario  # noqa: E402

CHILD = """
import os, sys, threading, time
import orjson
from failslow.commands.detect import detect_lines
from failslow.models.pipeline import Detector
limit_kb = int(float(sys.argv[3]) * 2**20)
f = open(sys.argv[1], "rb")

def watch():   # past the RSS limit: say how far it got, and stop
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    while True:
        time.sleep(0.5)
        with open("/proc/self/statm") as m:
            rss_kb = int(m.read().split()[1]) * page_kb
        if rss_kb > limit_kb:
            print("rss_limit", time.process_time(), f.tell(), rss_kb, flush=True)
            os._exit(0)

threading.Thread(target=watch, daemon=True).start()
best, n = None, 0
for _ in range(int(sys.argv[2])):
    out = []
    f.seek(0)
    c0 = time.process_time()
    detect_lines(f, Detector(), out.append, lambda no, why: None,
                 **({"window": int(sys.argv[5])} if int(sys.argv[5]) else {}))
    t = time.process_time() - c0
    best, n = (t if best is None else min(best, t)), len(out)
if sys.argv[4]:
    with open(sys.argv[4], "wb") as o:
        o.writelines(orjson.dumps(x, option=orjson.OPT_SORT_KEYS) + b"\\n" for x in out)
# the child's own peak (VmHWM): getrusage's ru_maxrss also counts the parent's peak before
# the exec (the parent that simulated a 131,072-rank trace: 10.4 GB read as detect's)
with open("/proc/self/status") as st:
    hwm_kb = next(int(x.split()[1]) for x in st if x.startswith("VmHWM:"))
print(best, n, hwm_kb)
"""


def scenario(ranks: int, steps: int, pp: int, step_s: float) -> Scenario:
    hosts = ranks // 8
    onset_s = (steps // 4) * step_s
    return Scenario(f"flat_{ranks}", f"{ranks:,} ranks tp8 pp{pp}: one GPU 40 % slower",
                    (JobSpec(hosts=hosts, tp=8, pp=pp, micro_batches=8, step_s=step_s),),
                    steps=steps, large=True,
                    faults=(FaultSpec("gpu_thermal", onset_s, None, 0.4, rank=ranks // 2 + 5),))


def rank_steps_of(obj: dict) -> int:
    kind = obj.get("kind")
    if kind == "step":
        return 1
    bk = BATCH_KINDS.get(kind) if isinstance(kind, str) else None
    if bk is not None and bk.row_kind == "step":
        return len(obj[bk.row_key])
    return 0


def write_trace(sc: Scenario, path: Path) -> tuple[int, int, float]:
    t0 = time.process_time()
    lines = rank_steps = 0
    with path.open("wb") as f:
        for obj in batch_events(simulate(sc, seed=0).events()):
            f.write(orjson.dumps(obj) + b"\n")
            lines += 1
            rank_steps += rank_steps_of(obj)
    return lines, rank_steps, time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", nargs="*", type=int, default=[1024, 4096, 16384, 131072])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rss-limit-gib", type=float, default=12.0,
                    help="stop detect past this resident size and record how far it got")
    ap.add_argument("--trace-dir", default="",
                    help="keep the traces here (and reuse one already there) instead of a temporary folder")
    ap.add_argument("--root", default=str(ROOT),
                    help="the source tree whose detect runs (e.g. an older commit's export, for a before/after)")
    ap.add_argument("--incidents-dir", default="",
                    help="write each size's incident events here (flat_RANKS.incidents.jsonl, "
                    "keys sorted): a before/after of a change compares them")
    ap.add_argument("--window", type=int, default=0,
                    help="detect's reorder window in events (0: the CLI's, 100,000): a trace "
                    "shorter than it is decoded whole before its first event is judged (the "
                    "12-step 1,024-rank trace's 23,056 lines), larger traces are judged as they are "
                    "read; --window 5600 holds the same share of that trace as the CLI's holds of "
                    "the 16,384-rank one. Same decisions; cachegrind: +0.2%% instructions, -15%% "
                    "last-level misses; CPU time at load 8 did not tell them apart (Nov 29)")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "detect_flat.json"))
    args = ap.parse_args()
    rows = []
    load0 = [round(x, 1) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            sc = scenario(ranks, args.steps, args.pp, args.step_s)
            keep = Path(args.trace_dir) if args.trace_dir else None
            path = (keep or Path(tmp)) / f"{sc.name}_pp{args.pp}_{args.step_s:g}s_{args.steps}.jsonl"
            counts = path.with_suffix(".counts.json")
            if keep is not None and path.exists() and counts.exists():
                lines, rank_steps, sim_cpu = json.loads(counts.read_text())
            else:
                lines, rank_steps, sim_cpu = write_trace(sc, path)
                if keep is not None:
                    counts.write_text(json.dumps([lines, rank_steps, sim_cpu]))
            load = [round(x, 1) for x in os.getloadavg()]
            incs = str(Path(args.incidents_dir) / f"{sc.name}.incidents.jsonl") \
                if args.incidents_dir else ""
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.repeat),
                                  str(args.rss_limit_gib), incs, str(args.window)],
                                 env={**os.environ, "PYTHONPATH": args.root}, cwd=args.root,
                                 check=True, capture_output=True, text=True).stdout
            size = path.stat().st_size
            if out.startswith("rss_limit"):
                _, cpu_s, at, rss_kb = out.split()
                rows.append({"ranks": ranks, "steps": args.steps, "rank_steps": rank_steps,
                             "lines": lines, "bytes": size,
                             "simulate_cpu_s": round(sim_cpu, 1),
                             "stopped": f"detect's RSS passed {args.rss_limit_gib:g} GiB "
                             f"after {float(cpu_s):.0f} CPU s, {int(at) / size:.0%} of the "
                             "trace read", "peak_rss_mib": round(int(rss_kb) / 1024),
                             "load_before": load})
                if keep is None:
                    path.unlink()
                write(Path(args.out), args, load0, rows)
                print(f"{ranks:>7,} ranks: {rows[-1]['stopped']}", flush=True)
                break
            cpu_s, incidents, rss_kb = out.split()
            cpu = float(cpu_s)
            row = {"ranks": ranks, "steps": args.steps, "rank_steps": rank_steps,
                   "lines": lines, "bytes": size, "load_before": load,
                   "simulate_cpu_s": round(sim_cpu, 1), "cpu_s": round(cpu, 2),
                   "us_per_rank_step": round(1e6 * cpu / rank_steps, 1),
                   "rank_steps_per_cpu_s": round(rank_steps / cpu),
                   "incident_events": int(incidents), "peak_rss_mib": round(int(rss_kb) / 1024)}
            row["vs_smallest"] = round(row["us_per_rank_step"] / rows[0]["us_per_rank_step"], 2) \
                if rows else 1.0
            rows.append(row)
            if keep is None:
                path.unlink()
            write(Path(args.out), args, load0, rows)   # after each size: a long run killed keeps what it measured
            print(f"{ranks:>7,} ranks {lines:>9,} lines {row['us_per_rank_step']:7.1f} us/rank-step "
                  f"{row['rank_steps_per_cpu_s']:>7,}/CPU s  x{row['vs_smallest']:.2f}  "
                  f"peak RSS {row['peak_rss_mib']:,} MiB  incidents {incidents}", flush=True)
    print(f"wrote {args.out}")
    return 0


def write(path: Path, args: argparse.Namespace, load0: list[float], rows: list[dict]) -> None:
    path.write_text(json.dumps({
        "note": args.note, "clock": f"process CPU time of detect_lines, best of {args.repeat}",
        "load_before": load0, "load_after": [round(x, 1) for x in os.getloadavg()],
        "pp": args.pp, "step_s": args.step_s, "window": args.window or "CLI default",
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
