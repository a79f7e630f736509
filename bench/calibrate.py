"""Each rule's false-alarm rate on healthy traces and detection rate on faulty ones.

The traces are regenerated from the repository (the simulator's scenario library, the
quality set and the paging policy's set, ``--seeds`` each), so a threshold can be
re-derived by anyone. For every judged step the arbiter's input is recorded (the
signals, ``models.findings.RULES``) before the paging policy weighs them:

- false alarms: in runs with no injected fault, or on a culprit no fault names, the
  culprits a rule confirmed (per run, and per 1,000 judged job steps);
- detection: of the injected faults, those whose culprit the rule confirmed while the
  fault was active (or within 10 steps after it);
- and what the policy made of it: loud incidents on no fault (must be 0), and faults
  paged, by the rule that confirmed them (``evidence.rule``).

Prints a table; writes bench/results/calibrate.json.

    .venv/bin/python bench/calibrate.py [--seeds 2] [--grain comm] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.models.findings import RULES  # noqa: E402
from failslow.models.pipeline import Detector  # noqa: E402
from failslow.simulator import GRAINS, SCENARIOS, simulate  # noqa: E402

GRACE_STEPS = 10


def names_the(f: Any, fault: dict) -> bool:
    """Whether a finding (signal) is about the injected fault's culprit."""
    if f.fault != fault["fault"]:
        return False
    if fault["fault"] == "slow_rank":
        return f.rank == fault["rank"]
    if fault["fault"] == "slow_host":
        return f.host == fault["host"]
    if fault["rank"] is not None and fault["peer_rank"] is not None:
        return {f.rank, f.peer_rank} == {fault["rank"], fault["peer_rank"]}
    return f.host == fault["host"] and f.rank is None


def run_one(name: str, seed: int, grain: str) -> dict:
    trace = simulate(SCENARIOS[name], seed=seed, grain=grain)
    truth = trace.truth
    step_s = {j["job_id"]: j["step_s"] for j in truth["jobs"]}
    det = Detector()
    signals: list[tuple[float, str, Any]] = []      # (ts, job, finding) confirmed
    judged = 0
    step = det.tracker.step

    def record(job_id: str, ts: float, found: list, sub: bool = False,
               step_s: float = 0.0) -> list:
        nonlocal judged
        judged += 0 if sub else 1
        signals.extend((ts, job_id, item[0]) for item in found if item[0].confirmed)
        return step(job_id, ts, found, sub, step_s)

    det.tracker.step = record      # type: ignore[method-assign]
    incidents = []
    for chunk in trace.batches():
        incidents.extend(det.process_batch(chunk))
    incidents.extend(det.flush())
    faults = []
    matched: set[int] = set()
    for fault in truth["faults"]:
        end = fault["end_ts"] if fault["end_ts"] is not None else truth["end_ts"]
        lo = fault["onset_ts"] - step_s[fault["job_id"]]
        hi = end + GRACE_STEPS * step_s[fault["job_id"]]
        rules = set()
        for i, (ts, job_id, f) in enumerate(signals):
            if job_id == fault["job_id"] and names_the(f, fault):
                matched.add(i)         # about the culprit, whenever: not a false alarm
                if lo <= ts <= hi:
                    rules.add(f.rule or f.fault)
        paged = [e for e in incidents if e["job_id"] == fault["job_id"]
                 and e["severity"] != "info" and _culprit_ok(e, fault)]
        faults.append({"kind": fault["kind"], "rules": sorted(rules),
                       "paged_by": paged[0]["evidence"].get("rule") if paged else None})
    false: dict[str, set[str]] = defaultdict(set)
    for i, (_, job_id, f) in enumerate(signals):
        if i not in matched:
            false[f.rule or f.fault].add(f"{job_id}:{f.key}")
    truth_ids = {(x["job_id"], x["fault"]) for x in truth["faults"]}
    loud_false = {e["incident_id"]: e["evidence"].get("rule") for e in incidents
                  if e["severity"] != "info" and not any(
                      _culprit_ok(e, x) for x in truth["faults"])}
    return {"scenario": name, "seed": seed, "benign_only": not truth_ids,
            "judged_steps": judged, "faults": faults,
            "false": {r: sorted(v) for r, v in false.items()}, "loud_false": loud_false}


def _culprit_ok(e: dict, fault: dict) -> bool:
    if e["fault"] != fault["fault"] or e["job_id"] != fault["job_id"]:
        return False
    if fault["fault"] == "slow_rank":
        return e.get("rank") == fault["rank"]
    if fault["fault"] == "slow_host":
        return e.get("host") == fault["host"]
    if fault["rank"] is not None and fault["peer_rank"] is not None:
        return {e.get("rank"), e.get("peer_rank")} == {fault["rank"], fault["peer_rank"]}
    return e.get("host") == fault["host"]


def table(runs: list[dict]) -> dict[str, dict]:
    benign = [r for r in runs if r["benign_only"]]
    steps = sum(r["judged_steps"] for r in runs)
    faults = [f for r in runs for f in r["faults"]]
    out = {}
    for rule in (*RULES, "slow_link", "slow_rank", "slow_host", "job_slowdown"):
        false_runs = sum(1 for r in benign if r["false"].get(rule))
        false_n = sum(len(r["false"].get(rule, [])) for r in runs)
        hit = sum(1 for f in faults if rule in f["rules"])
        paged = sum(1 for f in faults if f["paged_by"] == rule)
        loud = sum(1 for r in runs for v in r["loud_false"].values() if v == rule)
        if false_n or hit or paged or loud:
            out[rule] = {"false_runs": false_runs, "benign_runs": len(benign),
                         "false_culprits": false_n,
                         "false_per_1k_steps": round(1000.0 * false_n / steps, 3) if steps
                         else None,
                         "detected": hit, "faults": len(faults), "paged_by": paged,
                         "loud_false": loud}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--grain", choices=GRAINS, default="comm")
    ap.add_argument("--only", nargs="*", help="scenario names (default: every non-large one)")
    ap.add_argument("--out", help="results file (default bench/results/calibrate.json)")
    args = ap.parse_args()
    names = args.only or [n for n, s in SCENARIOS.items() if not s.large]
    runs = []
    t0 = time.perf_counter()
    for name in names:
        for seed in range(args.seeds):
            r = run_one(name, seed, args.grain)
            runs.append(r)
            print(f"{name:28s} seed {seed}: {r['judged_steps']:5d} judged steps, signals off "
                  f"truth {sum(len(v) for v in r['false'].values()):3d}, loud off truth "
                  f"{len(r['loud_false'])}", flush=True)
    rows = table(runs)
    print(f"\n{'rule':16s} {'false runs':>11s} {'false culprits':>14s} {'/1k steps':>9s} "
          f"{'detected':>10s} {'paged by':>8s} {'loud false':>10s}")
    for rule, t in rows.items():
        print(f"{rule:16s} {t['false_runs']:>4d} / {t['benign_runs']:<4d} "
              f"{t['false_culprits']:>14d} {t['false_per_1k_steps']:>9} "
              f"{t['detected']:>4d} / {t['faults']:<3d} {t['paged_by']:>8d} "
              f"{t['loud_false']:>10d}")
    print(f"\n{len(runs)} runs ({sum(r['benign_only'] for r in runs)} with no fault), "
          f"{sum(len(r['faults']) for r in runs)} faults, grain {args.grain}, "
          f"{time.perf_counter() - t0:.0f} s. false: a culprit the rule confirmed that no "
          "injected fault names; detected: faults whose culprit it confirmed in time")
    out = Path(args.out).resolve() if args.out else ROOT / "bench" / "results" / "calibrate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"seeds": args.seeds, "grain": args.grain, "rules": rows,
                                  "runs": runs}, option=orjson.OPT_INDENT_2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
