"""Throughput of `failslow detect`: JSON decode + validation + detection, one core.

Writes simulated traces to a temporary folder, then runs the very code the CLI
runs (``failslow.commands.detect.detect_lines``) over the open file, streaming
as the CLI does, best of ``--repeat`` runs. A second pass decodes the file in
the CLI's chunks and times only ``Detector.process_batch`` (the detector
alone). Times are CPU seconds of this (single-threaded) process, so other
work on a shared machine does not count against it; wall-clock rates are
printed beside them.
Prints events/s and rank-steps (step events) per CPU second, the unit that grows with
GPUs; traces at ``--grain comm`` (default: windows, as the producers publish) or
``collective`` (one event per op). Writes bench/results/detect_throughput.json
(``detect_throughput_collective.json`` for the collective grain).

With ``--batched`` the trace is what ``failslow simulate`` writes by default (what the host
agents publish): a ``comm_batch`` per host and window, a ``gpu_batch`` and a ``nic_batch``
per host and sample (``schema.batches.batch_trace``), the detector taking them whole. ``--phases``
also runs the first scenario once more, timing where its CPU goes: decode (JSON, validation, ordering), device telemetry, comm windows,
step judging.
With ``--on-change`` the trace's device samples are those host agents publish by default
(``collectors.samplers.filter_trace``: on change plus a heartbeat), not every sample.
With ``--baseline REV`` the input path of git revision REV (its
``failslow/commands/detect.py``, ``schema/fast.py`` and ``schema/batches.py``'s batch
validation; the detector is this tree's in both) runs in the same process, alternating with this tree's run by run, so a loaded
machine slows both alike: before/after and their ratio are printed and written.

    .venv/bin/python bench/detect_throughput.py [--scenario NAME ...] [--repeat 2] [--grain comm]
        [--baseline REV] [--on-change] [--batched] [--phases]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import types
from itertools import islice
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.collectors.samplers import filter_trace  # noqa: E402
from failslow.commands.detect import BATCH, detect_lines  # noqa: E402
from failslow.models.pipeline import Detector  # noqa: E402
from failslow.schema.batches import BATCH_KINDS, batch_trace  # noqa: E402
from failslow.simulator import GRAINS, SCENARIOS, simulate  # noqa: E402


def full_run(path: Path, detect=detect_lines) -> tuple[float, float, int]:
    """(CPU s, wall s, events) of the CLI path over the file."""
    c0, w0 = time.process_time(), time.perf_counter()
    with path.open("rb") as f:
        n, _, _ = detect(f, Detector(), lambda inc: None, lambda no, why: None)
    return time.process_time() - c0, time.perf_counter() - w0, n


def baseline_detect(rev: str):
    """``detect_lines`` of git revision ``rev``, with that revision's ``schema.fast`` and
    batch validation (``schema.batches.valid``, ``expand_checked``)."""
    def module(name: str, path: str) -> types.ModuleType:
        src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        mod = types.ModuleType(name)
        mod.__file__ = f"{rev}:{path}"
        sys.modules[name] = mod       # dataclasses and the like look modules up by name
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)  # noqa: S102 - our own history
        return mod
    fast = module("baseline_schema_fast", "schema/fast.py")
    batches = module("baseline_schema_batches", "schema/batches.py")
    batches.all_valid, batches.columns_ok = fast.all_valid, fast.columns_ok
    detect = module("baseline_detect", "failslow/commands/detect.py")
    detect.all_valid = fast.all_valid
    detect.valid, detect.expand_checked = batches.valid, batches.expand_checked
    if hasattr(batches, "valid_many"):      # REV's chunk-wide batch validation (5e385fb on)
        detect.valid_many = batches.valid_many
    return detect.detect_lines


def detector_run(path: Path) -> tuple[float, dict[str, int]]:
    """(CPU s inside the detector, events per kind) over the file, chunk by chunk."""
    det = Detector()
    spent = 0.0
    kinds: dict[str, int] = {}
    with path.open("rb") as f:
        while chunk := list(islice(f, BATCH)):
            events = [orjson.loads(line) for line in chunk]
            for e in events:
                kind = e["kind"]
                n = len(e[BATCH_KINDS[kind].row_key]) if kind in BATCH_KINDS else 1
                kinds[kind] = kinds.get(kind, 0) + n
            c0 = time.process_time()
            det.process_batch(events)
            spent += time.process_time() - c0
    c0 = time.process_time()
    det.flush()
    return spent + time.process_time() - c0, kinds


# Detector methods whose CPU is a phase's (what they call of another phase is that one's)
PHASE_METHODS = {"device telemetry": ("_apply", "_observe"),
                 "comm windows": ("_comm_batch", "_comm_windows", "_comm_nostep")}


def phases(path: Path) -> dict[str, float]:
    """CPU seconds per phase of the CLI path over the file, unprofiled: decode (reading,
    JSON, validation, ts order) timed alone; in the detector, the time inside
    ``PHASE_METHODS`` (the judgements a comm window triggers count as comm windows, the
    device samples a judgement releases as telemetry); steps and judging the rest."""
    from failslow.commands import detect as cli

    c0 = time.process_time()
    with path.open("rb") as f, cli._fewer_collections():   # as detect_sources runs it
        counts = cli.Counts()
        for _ in cli._rebatch(cli.ordered_chunks(cli._frozen(cli._chunks(f, 0, None, counts)),
                                                 cli.REORDER_WINDOW), BATCH):
            pass
    decode = time.process_time() - c0
    spent = dict.fromkeys(PHASE_METHODS, 0.0)
    stack: list[list] = []

    def timed(phase: str, fn):
        def run(*a, **k):
            frame = [phase, time.process_time(), 0.0]   # phase, start, inner phases' time
            stack.append(frame)
            try:
                return fn(*a, **k)
            finally:
                stack.pop()
                took = time.process_time() - frame[1]
                spent[phase] += took - frame[2]
                if stack:
                    stack[-1][2] += took
        return run

    det = Detector()
    for phase, names in PHASE_METHODS.items():
        for name in names:
            if hasattr(det, name):
                setattr(det, name, timed(phase, getattr(det, name)))
    c0 = time.process_time()
    with path.open("rb") as f:
        detect_lines(f, det, lambda inc: None, lambda no, why: None)
    total = time.process_time() - c0
    return {"decode (JSON, validation, ts order)": decode, **spent,
            "steps and judging": total - decode - sum(spent.values()), "total": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", nargs="*",
                    default=["gpu_thermal_30", "gpu_power_20", "pipeline_stage_slow",
                             "slow_link_host_50", "large_1024"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--grain", choices=GRAINS, default="comm")
    ap.add_argument("--steps", type=int, help="steps per trace (default: the scenario's)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also run REV's input path (detect.py, schema/fast.py), alternating")
    ap.add_argument("--on-change", action="store_true",
                    help="device samples as the agents publish them (on change + heartbeat)")
    ap.add_argument("--batched", action="store_true",
                    help="the trace as failslow simulate writes it by default: comm_batch, "
                         "gpu_batch and nic_batch per host (the detector takes them whole)")
    ap.add_argument("--phases", action="store_true",
                    help="profile the first scenario once and print CPU per phase")
    args = ap.parse_args()
    if args.baseline:       # the commit itself, not a name that moves
        args.baseline = subprocess.run(["git", "rev-parse", "--short", args.baseline], cwd=ROOT,
                                       check=True, capture_output=True,
                                       text=True).stdout.strip()
    base = baseline_detect(args.baseline) if args.baseline else None
    results = {}
    phase_cpu: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenario:
            path = Path(tmp) / f"{name}.jsonl"
            sim = simulate(SCENARIOS[name], seed=0, steps=args.steps, grain=args.grain)
            if args.on_change or args.batched:
                kept = list(sim.events())
                if args.on_change:
                    kept = filter_trace(kept)
                if args.batched:
                    kept = list(batch_trace(kept))
                path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in kept))
                n = sum(len(e[BATCH_KINDS[e["kind"]].row_key]) if e["kind"] in BATCH_KINDS
                        else 1 for e in kept)
                del kept            # not held (and walked by the collector) while timed
            else:
                n = sim.write_jsonl(path)
            runs, before = [], []
            for _ in range(args.repeat):
                if base is not None:
                    before.append(full_run(path, base))
                runs.append(full_run(path))
            cpu, wall = min(r[0] for r in runs), min(r[1] for r in runs)
            assert all(r[2] == n for r in runs + before)
            core, kinds = detector_run(path)
            if args.phases and not results:
                ph = phases(path)
                tot = ph.pop("total")
                phase_cpu[name] = {k: round(v, 3) for k, v in ph.items()}
                print(f"{name}: CPU per phase ({tot:.2f} s in all): " + ", ".join(
                    f"{k} {v:.2f} s ({100 * v / tot:.0f}%)" for k, v in ph.items()), flush=True)
            path.unlink()
            rs = kinds.get("step", 0) + kinds.get("step_batch", 0)   # a step_batch: its rows
            extra = {}
            if before:
                b_cpu = min(r[0] for r in before)
                extra = {"baseline": args.baseline,
                         "baseline_rank_steps_per_s": round(rs / b_cpu),
                         "speedup": round(b_cpu / cpu, 3)}
                print(f"{name:22s} baseline {args.baseline}: {rs / b_cpu:8,.0f} rank-steps/s, "
                      f"this tree: {rs / cpu:8,.0f} rank-steps/s ({b_cpu / cpu:.2f}x; "
                      f"CPU s {b_cpu:.3f} -> {cpu:.3f}, best of {args.repeat} each)", flush=True)
            results[name] = {"events": n, "kinds": kinds, "rank_steps": rs, **extra,
                             "events_per_rank_step": round(n / max(rs, 1), 2),
                             "detect_events_per_s": round(n / cpu),
                             "detect_rank_steps_per_s": round(rs / cpu),
                             "detect_events_per_wall_s": round(n / wall),
                             "detector_only_events_per_s": round(n / core),
                             "detector_only_rank_steps_per_s": round(rs / core)}
            print(f"{name:22s} {n:8d} events ({n / max(rs, 1):.1f} per rank-step)  failslow "
                  f"detect (decode+validate+detect): {n / cpu:9,.0f} ev/s = {rs / cpu:8,.0f} "
                  f"rank-steps/s (wall {n / wall:9,.0f} ev/s)   detector alone: "
                  f"{n / core:9,.0f} ev/s = {rs / core:8,.0f} rank-steps/s", flush=True)
    total = sum(r["events"] for r in results.values())
    full_s = sum(r["events"] / r["detect_events_per_s"] for r in results.values())
    print(f"{'overall':22s} {total:8d} events  {total / full_s:9,.0f} ev/s (one core, CPU time)")
    suffix = ("" if args.grain == "comm" else f"_{args.grain}") + \
        ("_onchange" if args.on_change else "") + ("_batched" if args.batched else "")
    out = ROOT / "bench" / "results" / f"detect_throughput{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"scenarios": results, "clock": "process CPU time",
                                  "grain": args.grain, "steps": args.steps,
                                  "batched": args.batched, "phases_cpu_s": phase_cpu,
                                  "device_samples": "on change + heartbeat (agent default)"
                                  if args.on_change else "every sample",
                                  "overall_events_per_s": round(total / full_s)},
                                 option=orjson.OPT_INDENT_2))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
