"""A slow pipeline point-to-point link: how fast the pair is named, and what else is
called a link (issue 15, ``models/p2p.py``).

Cases, each at both grains (``comm`` windows, ``collective`` events) and over seeds:

- ``p2p_link_pp`` (simulator library): the link rank 22 (h2) <-> 38 (h4) at 5x transfer
  time, no data-parallel group spanning the pair, the job ~9 % slower; as simulated
  (a two-member ``pp{a}-{b}`` channel per pair) and with the sends on Megatron-style
  pipeline groups (``simulator.p2p.megatron_groups``: 4 members, the other end only in
  ``peer``);
- the same link at 2x (a weaker fault) and the pair slow from the job's first step;
- never a link: ``healthy_hybrid_64``, ``pipeline_stage_slow`` (a slow GPU in stage 1),
  a last stage 30 % heavier from the first step (every rank of it), ``long8_stalls``.

Per fault case: named (an incident of fault slow_link whose rank pair is the truth's),
steps and event-time seconds from the onset to its ``detected_ts`` and to its first page,
root cause, mitigation, ``slowdown_pct`` against the truth's measured job slowdown,
``gpu_hours_lost``. Per benign case: slow_link incidents of any severity.

    .venv/bin/python bench/p2p_link.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.models.pipeline import Detector  # noqa: E402
from failslow.simulator import SCENARIOS, FaultSpec, JobSpec, Scenario, simulate  # noqa: E402
from failslow.simulator.p2p import megatron_groups  # noqa: E402

BASE = SCENARIOS["p2p_link_pp"]
LINK = BASE.faults[0]
FAULTS = {
    "p2p_link_pp": BASE,
    "p2p_link_pp_2x": replace(BASE, name="p2p_link_pp_2x",
                              faults=(replace(LINK, intensity=1.0),)),
    "p2p_link_pp_first_step": replace(BASE, name="p2p_link_pp_first_step",
                                      faults=(replace(LINK, start_s=0.0),), steps=30),
}
_HEAVY = JobSpec(hosts=4, tp=4, pp=4, micro_batches=8)
BENIGN = {
    "healthy_hybrid_64": SCENARIOS["healthy_hybrid_64"],
    "pipeline_stage_slow": SCENARIOS["pipeline_stage_slow"],
    "last_stage_heavy": Scenario("last_stage_heavy", "tp4 pp4 dp2: the last stage computes "
                                 "30 % more from the first step", (_HEAVY,), steps=60,
                                 faults=tuple(FaultSpec("gpu_clock", 0, None, 0.3, rank=r)
                                              for r in range(24, 32))),
    "long8_stalls": SCENARIOS["long8_stalls"],
}


def detect(trace, megatron: bool) -> tuple[list[dict], dict[int, float]]:
    det = Detector()
    out: list[dict] = []
    ends: dict[int, float] = {}
    for batch in (megatron_groups(trace) if megatron else trace.batches()):
        for ev in batch:
            if ev["kind"] == "step":
                ends[ev["step"]] = max(ends.get(ev["step"], 0.0), ev["ts"])
        out.extend(det.process_batch(batch))
    out.extend(det.flush())
    return out, ends


def fault_case(sc: Scenario, seed: int, grain: str, megatron: bool) -> dict:
    trace = simulate(sc, seed=seed, grain=grain)
    incs, ends = detect(trace, megatron)
    f = trace.truth["faults"][0]
    pair = {f["rank"], f["peer_rank"]}
    named = [i for i in incs if i["fault"] == "slow_link"
             and {i.get("rank"), i.get("peer_rank")} == pair]
    res: dict = {"named": bool(named), "true_slowdown_pct": f["expected_job_slowdown_pct"]}
    if named:
        first, last = named[0], named[-1]
        onset = f["onset_ts"]
        res["steps"] = sum(1 for ts in ends.values() if onset < ts <= first["detected_ts"])
        res["seconds"] = round(first["detected_ts"] - onset, 2)
        page = next((i["ts"] for i in named if i["severity"] != "info"), None)
        if page is not None:
            res["page_steps"] = sum(1 for ts in ends.values() if onset < ts <= page)
            res["page_seconds"] = round(page - onset, 2)
        res.update(hosts=sorted({first.get("host"), first.get("peer_host")}),
                   root_cause=last.get("root_cause"), mitigation=last.get("mitigation"),
                   slowdown_pct=last["slowdown_pct"], gpu_hours_lost=last.get("gpu_hours_lost"))
    others = {i["incident_id"] for i in incs if i["severity"] != "info"} \
        - {i["incident_id"] for i in named}
    res["other_paged"] = sorted(others)
    return res


def benign_case(sc: Scenario, seed: int, grain: str) -> dict:
    incs, _ = detect(simulate(sc, seed=seed, grain=grain), False)
    links = {i["incident_id"]: i["severity"] for i in incs if i["fault"] == "slow_link"}
    return {"slow_link_incidents": len(links),
            "slow_link_paged": sum(s != "info" for s in links.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for grain in ("comm", "collective"):
        for name, sc in FAULTS.items():
            for megatron in (False, True):
                for seed in range(args.seeds):
                    r = fault_case(sc, seed, grain, megatron)
                    r.update(case=name, grain=grain, seed=seed,
                             naming="pipeline group" if megatron else "pair channel")
                    rows.append(r)
                    print(f"{name:24s} {grain:10s} {r['naming']:14s} seed {seed}: "
                          f"named {r['named']!s:5s} steps {r.get('steps', '-')!s:>3s} "
                          f"s {r.get('seconds', '-')!s:>6s} page {r.get('page_steps', '-')!s:>3s} "
                          f"cause {r.get('root_cause', '-')} {r.get('mitigation', '-')} "
                          f"slowdown {r.get('slowdown_pct', '-')}/{r['true_slowdown_pct']} "
                          f"gpu_h {r.get('gpu_hours_lost', '-')} others {r['other_paged'] or '-'}",
                          flush=True)
        for name, sc in BENIGN.items():
            for seed in range(args.seeds):
                r = benign_case(sc, seed, grain)
                r.update(case=name, grain=grain, seed=seed)
                rows.append(r)
                print(f"{name:24s} {grain:10s} benign         seed {seed}: slow_link incidents "
                      f"{r['slow_link_incidents']} (paged {r['slow_link_paged']})", flush=True)
    summary = {}
    for name in FAULTS:
        rs = [r for r in rows if r["case"] == name]
        steps = [r["steps"] for r in rs if r["named"]]
        secs = [r["seconds"] for r in rs if r["named"]]
        summary[name] = {"runs": len(rs), "named": sum(r["named"] for r in rs),
                         "steps_median": statistics.median(steps) if steps else None,
                         "steps_max": max(steps) if steps else None,
                         "seconds_median": statistics.median(secs) if secs else None,
                         "root_cause_ok": sum(r.get("root_cause") == "nic_congestion"
                                              for r in rs),
                         "other_paged": sum(len(r["other_paged"]) for r in rs)}
    for name in BENIGN:
        rs = [r for r in rows if r["case"] == name]
        summary[name] = {"runs": len(rs),
                         "slow_link_incidents": sum(r["slow_link_incidents"] for r in rs),
                         "slow_link_paged": sum(r["slow_link_paged"] for r in rs)}
    print()
    for name, s in summary.items():
        print(f"{name:24s} {s}")
    out = ROOT / "bench" / "results" / "p2p_link.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"seeds": args.seeds, "summary": summary, "runs": rows},
                                 option=orjson.OPT_INDENT_2))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
