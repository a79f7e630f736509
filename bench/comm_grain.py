"""Collective-timing records and bytes per rank-step on the wire at 1 s steps, ``comm``
vs ``collective`` grain, from the simulator (same job, same seed, same physics).

Counted per rank-step, after the warm-up steps: collective-timing records (``comm`` or ``collective`` events), the
ops they cover, their bytes as JSON (one event, as in a trace file), and the bytes of
the Kafka message values the Publisher would send for them (arrays per topic and key per
1 s of event time, uncompressed and lz4-compressed); then the same for every kind
(steps and device telemetry included).

When the simulator has no ``grain`` argument yet, the ``comm`` trace is built from the
``collective`` one with the producers' own summarizer (``collectors.comm_windows``):
windows closed at every step end and every ``--window`` s inside a step, blocked time =
op duration. The output says which.

    .venv/bin/python bench/comm_grain.py [--scenario large_1024] [--steps 20]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import platform
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from failslow.collectors.comm_windows import comm_record, summarize  # noqa: E402
from failslow.schema.topics import Topics, key_for  # noqa: E402
from failslow.simulator import SCENARIOS, simulate  # noqa: E402

TIMING = ("comm", "collective")


def _lz4(data: bytes) -> int:
    try:
        import cramjam
    except ImportError:  # pragma: no cover - cramjam ships with aiokafka's extras
        return -1
    return len(cramjam.lz4.compress_block(data))


def windowed(events: list[dict], window_s: float) -> list[dict]:
    """A collective-grain trace at comm grain, windows as the producers close them."""
    pending: dict[tuple, list[dict]] = defaultdict(list)
    last_end: dict[tuple, float] = {}
    out: list[dict] = []
    for ev in events:
        if ev["kind"] == "collective":
            pending[(ev["job_id"], ev["rank"])].append(ev)
            continue
        out.append(ev)
        if ev["kind"] != "step":
            continue
        who = (ev["job_id"], ev["rank"])
        ops = sorted(pending.pop(who, []), key=lambda e: e["ts"])
        start = last_end.get(who, ev["ts"] - ev["duration_s"])
        last_end[who] = ev["ts"]
        cuts = [start + k * window_s for k in range(1, math.ceil((ev["ts"] - start) / window_s))]
        for lo, hi in zip([start, *cuts], [*cuts, ev["ts"]], strict=True):
            done = [o for o in ops if lo < o["ts"] <= hi or (o["ts"] <= lo and lo == start)]
            out.append(comm_record(ev["job_id"], ev["rank"], ev["host"], lo, hi,
                                   summarize(done, [o["duration_s"] for o in done]),
                                   step=ev["step"], step_end=hi == ev["ts"],
                                   world_size=ev["world_size"], gpu=ev.get("gpu")))
    out.sort(key=lambda e: e["ts"])
    return out


def trace_events(scenario: str, steps: int, grain: str, window_s: float) -> tuple[list, str]:
    scn = SCENARIOS[scenario]
    if "grain" in inspect.signature(simulate).parameters:
        return list(simulate(scn, seed=0, steps=steps, grain=grain).events()), "simulator"
    events = list(simulate(scn, seed=0, steps=steps).events())
    if grain == "collective":
        return events, "simulator"
    return windowed(events, window_s), "converted (collectors.comm_windows)"


def measure(events: list[dict], warmup: int) -> dict:
    """Per rank-step, over the steps from ``warmup`` on (the job's first steps are long)."""
    topics = Topics()
    events = [e for e in events if e.get("step") is None or e["step"] >= warmup]
    rank_steps = sum(e["kind"] == "step" for e in events)
    records = ops = json_bytes = 0
    messages: dict[tuple, list[dict]] = defaultdict(list)  # (slice, topic, key) -> events
    for ev in events:
        messages[(int(ev["ts"]), topics.for_kind(ev["kind"]), key_for(ev))].append(ev)
        if ev["kind"] in TIMING:
            records += 1
            json_bytes += len(orjson.dumps(ev)) + 1
            ops += sum(o["n"] for o in ev["ops"]) if ev["kind"] == "comm" else 1
    wire = {"timing": [0, 0, 0], "all": [0, 0, 0]}  # messages, bytes, lz4 bytes
    for (_, topic, _), evs in messages.items():
        value = orjson.dumps(evs)
        size, packed = len(value), _lz4(value)
        for part in ("all", "timing") if topic == topics.for_kind("comm") else ("all",):
            wire[part][0] += 1
            wire[part][1] += size
            wire[part][2] += packed
    per = 1.0 / rank_steps
    return {"rank_steps": rank_steps,
            "ops_per_rank_step": round(ops * per, 2),
            "records_per_rank_step": round(records * per, 2),
            "json_bytes_per_rank_step": round(json_bytes * per),
            "wire_messages_per_rank_step": round(wire["timing"][0] * per, 3),
            "wire_bytes_per_rank_step": round(wire["timing"][1] * per),
            "wire_lz4_bytes_per_rank_step": round(wire["timing"][2] * per),
            "all_kinds_events_per_rank_step": round(len(events) * per, 2),
            "all_kinds_wire_bytes_per_rank_step": round(wire["all"][1] * per),
            "all_kinds_wire_lz4_bytes_per_rank_step": round(wire["all"][2] * per)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="large_1024")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--window", type=float, default=1.0, help="window_s of the comm grain")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "comm_grain.json"))
    args = ap.parse_args()
    job = SCENARIOS[args.scenario].jobs[0]
    result: dict = {"machine": f"{platform.machine()} {platform.node()}",
                    "scenario": args.scenario, "steps": args.steps, "step_s": job.step_s,
                    "window_s": args.window, "warmup_steps": args.warmup}
    for grain in ("collective", "comm"):
        events, source = trace_events(args.scenario, args.steps, grain, args.window)
        result[grain] = {"source": source, **measure(events, args.warmup)}
        del events
    print(f"{args.scenario}: {args.steps} steps of ~{job.step_s:g} s (the first {args.warmup} "
          f"left out), window {args.window:g} s")
    print(f"{'per rank-step':<36} {'collective':>12} {'comm':>12}")
    for name in result["comm"]:
        if name != "source":
            print(f"{name:<36} {result['collective'][name]:>12} {result['comm'][name]:>12}")
    print(f"comm trace: {result['comm']['source']}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
