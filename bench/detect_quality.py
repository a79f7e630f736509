"""Detection quality over the simulator's scenario library.

For every (non-large) scenario and seed: simulate, run ``models.pipeline.Detector``
over the events, and score its incidents against the ground truth:

- localization: an incident of the right fault on the right culprit (rank for
  slow_rank, host for slow_host, the unordered rank pair or the host for
  slow_link) opened while the fault was active (or within 10 steps after a
  short one ended);
- root cause: that incident's final ``root_cause`` equals the truth's;
- latency: job steps that ended between the fault's onset and the incident's
  ``detected_ts`` (the faulty steps the job ran before we knew), and the same
  in seconds / the healthy step time; page latency: the same up to the
  incident's first event above ``info`` (incidents open as info and page
  once they persist);
- false incidents: incidents that match no injected fault and went above ``info`` (on
  any of their events: one that opens as info and pages later counts); info incidents:
  those that never did.

``--grain`` picks how the traces carry collective timing: ``comm`` windows (default, as
the producers publish) or one ``collective`` event per op; same physics, same truth.

Prints a table per fault kind and overall; writes bench/results/detect_quality.json
(``detect_quality_collective.json`` for the collective grain).

    .venv/bin/python bench/detect_quality.py [--seeds 3] [--only NAME ...] [--grain comm]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.models.pipeline import Detector  # noqa: E402
from failslow.simulator import GRAINS, SCENARIOS, simulate  # noqa: E402

GRACE_STEPS = 10


def culprit_ok(inc: dict, f: dict) -> bool:
    if inc["fault"] != f["fault"] or inc["job_id"] != f["job_id"]:
        return False
    if f["fault"] == "slow_rank":
        return inc.get("rank") == f["rank"]
    if f["fault"] == "slow_host":
        return inc.get("host") == f["host"]
    if f["rank"] is not None and f["peer_rank"] is not None:
        return {inc.get("rank"), inc.get("peer_rank")} == {f["rank"], f["peer_rank"]}
    return inc.get("host") == f["host"] and inc.get("rank") is None


def run_one(name: str, seed: int, grain: str = "comm") -> dict:
    trace = simulate(SCENARIOS[name], seed=seed, grain=grain)
    det = Detector()
    incidents: list[dict] = []
    step_end: dict[tuple[str, int], float] = {}
    # (job, step) -> rank -> start of the rank's step (its first op of the step)
    step_start: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    n = 0
    t0 = time.perf_counter()
    for chunk in trace.batches():
        n += len(chunk)
        for ev in chunk:
            if ev["kind"] == "step":
                k = (ev["job_id"], ev["step"])
                if ev["ts"] > step_end.get(k, 0.0):
                    step_end[k] = ev["ts"]
                step_start[k][ev["rank"]] = ev["ts"] - ev["duration_s"]
        incidents.extend(det.process_batch(chunk))
    incidents.extend(det.flush())
    elapsed = time.perf_counter() - t0
    truth = trace.truth
    first: dict[str, dict] = {}
    last: dict[str, dict] = {}
    for inc in incidents:
        first.setdefault(inc["incident_id"], inc)
        last[inc["incident_id"]] = inc
    step_s = {j["job_id"]: j["step_s"] for j in truth["jobs"]}
    results = []
    used = set()
    for f in truth["faults"]:
        end = f["end_ts"] if f["end_ts"] is not None else truth["end_ts"]
        limit = end + GRACE_STEPS * step_s[f["job_id"]]
        hits = [i for i in first.values() if culprit_ok(i, f)
                and f["onset_ts"] - step_s[f["job_id"]] <= i["detected_ts"] <= limit]
        hits.sort(key=lambda i: i["detected_ts"])
        used.update(i["incident_id"] for i in hits)
        res = {"kind": f["kind"], "fault": f["fault"], "intensity": f["intensity"],
               "localized": bool(hits), "root_cause_expected": f["root_cause"]}
        if hits:
            inc = hits[0]
            res["root_cause"] = last[inc["incident_id"]].get("root_cause")
            res["latency_steps"] = sum(1 for (j, _), ts in step_end.items()
                                       if j == f["job_id"] and f["onset_ts"] < ts
                                       <= inc["detected_ts"])
            res["latency_s_over_step"] = round((inc["detected_ts"] - f["onset_ts"])
                                               / step_s[f["job_id"]], 2)
            page_ev = next((e for e in incidents if e["incident_id"] == inc["incident_id"]
                            and e["severity"] != "info"), None)
            page = page_ev["ts"] if page_ev is not None else None
            res["rule"] = _rule(first[inc["incident_id"]])
            res["both_ends"] = bool(inc.get("host") and inc.get("peer_host"))
            if page_ev is not None:
                res["page_rule"] = _rule(page_ev)
            first_op = _first_slowed_op(f, step_start)
            res["step_s"] = step_s[f["job_id"]]
            res["from_first_step"] = f["onset_step"] == 0
            if first_op is not None:
                res["detect_s"] = round(inc["detected_ts"] - first_op, 3)
            if page is not None:
                res["page_latency_steps"] = sum(1 for (j, _), ts in step_end.items()
                                                if j == f["job_id"] and f["onset_ts"] < ts <= page)
                if first_op is not None:
                    res["page_s"] = round(page - first_op, 3)
        if hits:
            _after(res, f, [e for e in incidents if e["incident_id"] == hits[0]["incident_id"]],
                   step_end, step_start)
            res["incidents"] = len({i["incident_id"] for i in hits})
        results.append(res)
    # Loud: any of its events above info (one that opens as info and pages later too).
    loud = {i["incident_id"] for i in incidents if i["severity"] != "info"}
    false = [i for iid, i in first.items() if iid not in used and iid in loud]
    return {"scenario": name, "seed": seed, "events": n, "seconds": round(elapsed, 3),
            "benign_only": not truth["faults"], "faults": results,
            "false_incidents": [{"incident_id": i["incident_id"], "severity": i["severity"],
                                 "root_cause": last[i["incident_id"]].get("root_cause")}
                                for i in false],
            "info_incidents": sum(1 for iid in first if iid not in loud)}


def _rule(ev: dict) -> str:
    """The signal an incident event names (CONTRACT.md ``evidence.rule``)."""
    return str((ev.get("evidence") or {}).get("rule") or "?")


def _after(res: dict, f: dict, events: list[dict], step_end: dict,
           step_start: dict) -> None:
    """Once the fault ended: job steps until its incident resolved, and whether a
    severity rose after the culprit's first step at full speed (a page about a culprit
    already back; the step under way at the end still carries the fault)."""
    if f["end_ts"] is None:
        return
    end = f["end_ts"]
    clean = min((step_end[k] for k, starts in step_start.items() if k[0] == f["job_id"]
                 and k in step_end and starts and min(starts.values()) >= end),
                default=math.inf)
    resolved = next((e["ts"] for e in events if e["status"] == "resolved"
                     and e.get("resolved_reason") != "job ended"), None)
    if resolved is not None:
        res["resolve_steps"] = sum(1 for (j, _), ts in step_end.items()
                                   if j == f["job_id"] and end < ts <= resolved)
    rank = {"info": 0, "warning": 1, "critical": 2}
    sev = [(e["ts"], rank[e["severity"]]) for e in events]
    res["louder_after_end"] = any(t > clean and s > p
                                  for (_, p), (t, s) in zip(sev, sev[1:], strict=False))


def explain(runs: list[dict]) -> None:
    """Per fault with a first slowed op: when its first incident and its first page came
    (seconds and nominal steps after that op) and from which evidence."""
    rows = []
    for r in runs:
        for f in r["faults"]:
            if "step_s" not in f:
                continue
            band = "first" if f["from_first_step"] else (">=2s" if f["step_s"] >= 2.0 else "<2s")
            rows.append((band, f["step_s"], r["scenario"], r["seed"], f))
    rows.sort(key=lambda x: (x[0], x[1], x[2], x[3]))
    print(f"\n{'band':5s} {'scenario':28s} {'sd':>2s} {'step_s':>6s} {'detect':>7s} {'steps':>5s}"
          f" {'rule':24s} {'page':>7s} {'steps':>5s} page rule")
    for band, step, name, seed, f in rows:
        d, p = f.get("detect_s"), f.get("page_s")
        print(f"{band:5s} {name:28s} {seed:2d} {step:6.2f} {d if d is not None else '-':>7} "
              f"{round(d / step, 2) if d is not None else '-':>5} {f.get('rule', '-'):24s} "
              f"{p if p is not None else '-':>7} {round(p / step, 2) if p is not None else '-':>5}"
              f" {f.get('page_rule', '-')}")


def _first_slowed_op(f: dict, step_start: dict[tuple[str, int], dict[int, float]]
                     ) -> float | None:
    """Event time of the culprit's first slowed op: the start of its first step under the
    fault (the simulator applies a fault from the first step that starts after its onset);
    for a host or a link, the earliest rank's."""
    k = f.get("onset_step")
    starts = step_start.get((f["job_id"], k)) if k is not None else None
    if not starts:
        return None
    if f["rank"] is not None and f["rank"] in starts:
        return starts[f["rank"]]
    return min(starts.values())


def policy_table(runs: list[dict]) -> dict:
    """The paging policy's targets (issue 30) over the runs."""
    fs = [f for r in runs for f in r["faults"]]
    ended = [f for f in fs if "louder_after_end" in f]
    steps = sorted(f["resolve_steps"] for f in ended if "resolve_steps" in f)
    links = [f for f in fs if f["fault"] == "slow_link" and f["localized"]]
    return {"benign_loud": sum(len(r["false_incidents"]) for r in runs if r["benign_only"]),
            "ended": len(ended), "resolved": len(steps),
            "resolved_within_10": sum(1 for x in steps if x <= 10),
            "resolve_p50": statistics.median(steps) if steps else None,
            "resolve_max": steps[-1] if steps else None,
            "louder_after_end": sum(1 for f in ended if f["louder_after_end"]),
            "split": sum(1 for f in fs if f.get("incidents", 1) > 1),
            "links": len(links),
            "links_both_ends": sum(1 for f in links if f.get("both_ends"))}


def pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:5.1f}%" if b else "   - "


def _p95(xs: list[int]) -> int | None:
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))] if xs else None


def summarize(runs: list[dict]) -> dict:
    rows: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        for f in r["faults"]:
            rows[f["kind"]].append(f)
    table = {}
    for kind, fs in sorted(rows.items()) + [("OVERALL", [f for v in rows.values() for f in v])]:
        big = [f for f in fs if f["intensity"] >= 0.1]
        rc = [f for f in fs if f["localized"] and f["root_cause_expected"] != "unknown"]
        lat = sorted(f["latency_steps"] for f in fs if f["localized"])
        lat10 = sorted(f["latency_steps"] for f in big if f["localized"])
        page = sorted(f["page_latency_steps"] for f in fs if "page_latency_steps" in f)
        table[kind] = {
            "faults": len(fs), "localized": sum(f["localized"] for f in fs),
            "faults_ge10": len(big), "localized_ge10": sum(f["localized"] for f in big),
            "root_cause_n": len(rc),
            "root_cause_ok": sum(f["root_cause"] == f["root_cause_expected"] for f in rc),
            "latency_median": statistics.median(lat) if lat else None,
            "latency_p95": _p95(lat),
            "latency_median_ge10": statistics.median(lat10) if lat10 else None,
            "latency_p95_ge10": _p95(lat10),
            "paged": len(page),
            "page_latency_median": statistics.median(page) if page else None,
            "page_latency_p95": _p95(page),
        }
    benign = [r for r in runs if r["benign_only"]]
    table["_benign"] = {"runs": len(benign),
                        "false_incidents": sum(len(r["false_incidents"]) for r in benign),
                        "info_incidents": sum(r["info_incidents"] for r in benign)}
    table["_all_false"] = sum(len(r["false_incidents"]) for r in runs)
    return table


def _q(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2) if xs else None


def seconds_table(runs: list[dict]) -> dict:
    """Event-time latency from the culprit's first slowed op, by the job's step time: to
    the first incident event (detect) and to the first page (warning or critical);
    faults present from the job's first step separately, against their bar (paged
    within the job's first 5 steps or 10 s, whichever is longer)."""
    bands: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        for f in r["faults"]:
            if "step_s" not in f:
                continue
            if f["from_first_step"]:
                bands["first_step"].append(f)
            elif f["step_s"] >= 2.0:
                bands["steps>=2s"].append(f)
            else:
                bands["steps<2s"].append(f)
    out = {}
    for band, fs in sorted(bands.items()):
        det = [f["detect_s"] for f in fs if "detect_s" in f]
        page = [f["page_s"] for f in fs if "page_s" in f]
        row = {"faults": len(fs), "detect_p50_s": _q(det, 0.5), "detect_p95_s": _q(det, 0.95),
               "paged": len(page), "page_p50_s": _q(page, 0.5), "page_p95_s": _q(page, 0.95),
               "page_p50_steps": _q([f["page_s"] / f["step_s"] for f in fs if "page_s" in f], 0.5),
               "page_p95_steps": _q([f["page_s"] / f["step_s"] for f in fs if "page_s" in f],
                                    0.95)}
        if band == "first_step":
            # within the job's first 5 steps (as it ran them: warm-up steps and the
            # fault make them longer than the nominal step) or 10 s, whichever is longer
            row["paged_in_bar"] = sum(1 for f in fs if "page_s" in f
                                      and (f["page_latency_steps"] <= 5 or f["page_s"] <= 10.0))
        out[band] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="scenario names (default: every non-large one)")
    ap.add_argument("--grain", choices=GRAINS, default="comm",
                    help="collective timing in the traces: comm windows (default) or per-op "
                    "collective events")
    ap.add_argument("--explain", action="store_true",
                    help="print, per fault, when its first incident and page came and from "
                    "which evidence")
    ap.add_argument("--out", help="results file (default bench/results/detect_quality"
                    "[_grain].json)")
    ap.add_argument("--policy", action="store_true",
                    help="the paging policy's scenarios (simulator/scenarios_policy.py: "
                    "transients, the layout, ramps, flaps) instead of the quality set")
    args = ap.parse_args()
    names = args.only or [n for n, s in SCENARIOS.items() if not s.large
                          and ("policy" in s.tags) == args.policy]
    runs = []
    for name in names:
        for seed in range(args.seeds):
            r = run_one(name, seed, args.grain)
            runs.append(r)
            bad = [f["kind"] for f in r["faults"] if not f["localized"]]
            print(f"{name:28s} seed {seed}: {r['events']:7d} events {r['seconds']:6.2f} s"
                  f"  missed {bad or '-'}  false {[i['incident_id'] for i in r['false_incidents']] or '-'}",
                  flush=True)
    table = summarize(runs)
    print(f"\n{'fault kind':18s} {'n':>4s} {'localized':>9s} {'loc>=10%':>9s} {'root cause':>10s}"
          f" {'lat med':>7s} {'lat p95':>7s} {'med>=10%':>8s} {'p95>=10%':>8s}"
          f" {'page med':>8s} {'page p95':>8s}   (latency in job steps)")
    for kind, t in table.items():
        if kind.startswith("_"):
            continue
        print(f"{kind:18s} {t['faults']:4d} {pct(t['localized'], t['faults']):>9s} "
              f"{pct(t['localized_ge10'], t['faults_ge10']):>9s} "
              f"{pct(t['root_cause_ok'], t['root_cause_n']):>10s} "
              f"{t['latency_median'] if t['latency_median'] is not None else '-':>7} "
              f"{t['latency_p95'] if t['latency_p95'] is not None else '-':>7} "
              f"{t['latency_median_ge10'] if t['latency_median_ge10'] is not None else '-':>8} "
              f"{t['latency_p95_ge10'] if t['latency_p95_ge10'] is not None else '-':>8} "
              f"{t['page_latency_median'] if t['page_latency_median'] is not None else '-':>8} "
              f"{t['page_latency_p95'] if t['page_latency_p95'] is not None else '-':>8}")
    b = table["_benign"]
    print(f"\nbenign runs: {b['runs']}, incidents above info: {b['false_incidents']}, "
          f"info incidents: {b['info_incidents']}; false incidents in all runs: "
          f"{table['_all_false']}")
    secs = seconds_table(runs)
    print("\nlatency from the culprit's first slowed op (event time, seconds):")
    for band, t in secs.items():
        extra = f"  paged within max(5 steps, 10 s): {t['paged_in_bar']}/{t['faults']}" \
            if "paged_in_bar" in t else ""
        print(f"  {band:10s} faults {t['faults']:3d}  detect p50 {t['detect_p50_s']} "
              f"p95 {t['detect_p95_s']}  page p50 {t['page_p50_s']} p95 {t['page_p95_s']} "
              f"({t['page_p50_steps']} / {t['page_p95_steps']} steps){extra}")
    if args.explain:
        explain(runs)
    policy = policy_table(runs)
    print(f"\npolicy: loud incidents in benign-only runs {policy['benign_loud']}; faults "
          f"resolved {policy['resolved']}/{policy['ended']} of those that ended, within 10 "
          f"steps {policy['resolved_within_10']}, resolve steps p50 {policy['resolve_p50']} "
          f"max {policy['resolve_max']}; louder after the end {policy['louder_after_end']}; "
          f"faults with more than one incident {policy['split']}; slow_link incidents "
          f"naming both ends {policy['links_both_ends']}/{policy['links']}")
    print(f"grain: {args.grain}")
    suffix = ("" if args.grain == "comm" else f"_{args.grain}") + (
        "_policy" if args.policy else "")
    out = Path(args.out).resolve() if args.out else \
        ROOT / "bench" / "results" / f"detect_quality{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"seeds": args.seeds, "grain": args.grain, "table": table,
                                  "seconds": secs, "policy": policy, "runs": runs},
                                 option=orjson.OPT_INDENT_2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
