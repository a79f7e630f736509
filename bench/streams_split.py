"""Where a worker partition's CPU goes for one large job: the share that is per event and
per rank or host (shardable with no exchange) vs the per-step, job-wide part
(``JobState.evaluate`` less its per-rank and per-group callees, and the decisions after
it less the device samples they apply, per host), which the job stage of the sharded design (docs/streams.md) would keep. Per group
counts as shardable: most groups (tensor and data parallel) sit inside one pipeline stage;
the pipeline's point-to-point links between stages do not, so the share is a lower bound.

One tp8 pp8 job (``--ranks``, comm grain, 1 Hz telemetry, ``--step-s``), its events as
JSON (as they arrive), decoded and validated as the job stage does (``decode_value``),
fed to a ``JobPartition`` (de-duplication marks + the Detector), under cProfile.

    .venv/bin/python bench/streams_split.py [--ranks 4096] [--steps 8] [--step-s 1]

Prints the shares and writes bench/results/streams_split.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path

import orjson

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=1.0)
    args = ap.parse_args()
    from failslow.simulator import JobSpec, Scenario, simulate
    from failslow.streams.job_stage import decode_value
    from failslow.streams.partition import JobPartition

    sc = Scenario("split", "split", (JobSpec(job_id="big", hosts=args.ranks // 8, tp=8, pp=8,
                                             micro_batches=8, step_s=args.step_s),),
                  steps=args.steps, large=True)
    events = sorted(simulate(sc, seed=0, steps=args.steps).events(), key=lambda e: e["ts"])
    raw = [orjson.dumps(events[i:i + 200]) for i in range(0, len(events), 200)]
    del events
    part = JobPartition(0)
    prof = cProfile.Profile()
    c0 = time.process_time()
    prof.enable()
    for value in raw:
        evs, _ = decode_value(value)
        part._feed(evs)
    prof.disable()
    total = time.process_time() - c0
    stats = pstats.Stats(prof)
    cum = {f"{Path(k[0]).parent.name}/{Path(k[0]).name}:{k[2]}": v[3]
           for k, v in stats.stats.items()}  # type: ignore[attr-defined]

    def find(suffix: str) -> float:
        return sum(t for name, t in cum.items() if name.endswith(suffix))

    raw_stats = stats.stats  # type: ignore[attr-defined]
    evaluate = next(k for k in raw_stats if k[0].endswith("models/job.py") and k[2] == "evaluate")
    # evaluate's callees that work per rank or per collective group (a shard can run them
    # on its own ranks): their time inside evaluate is shardable
    per_rank_callees = {"take_time", "evaluate", "judge", "observe", "__init__",
                        "_imbalance", "_self_scores"}
    inside = sum(v[4][evaluate][3] for k, v in raw_stats.items()
                 if evaluate in v[4] and k[2] in per_rank_callees and k != evaluate)
    judge = next(k for k in raw_stats if k[0].endswith("models/pipeline.py") and k[2] == "_judge")
    # _judge first applies the queued device samples of the job's hosts (per host)
    released = sum(v[4][judge][3] for k, v in raw_stats.items()
                   if judge in v[4] and k[2] == "_release")
    parts = {
        "decode_validate": find("job_stage.py:decode_value"),
        "detector": find("pipeline.py:process_batch"),
        "evaluate": find("job.py:evaluate"),
        "evaluate_per_rank_or_group": inside,
        "judge_decisions": find("pipeline.py:_judge"),
        "judge_device_samples_applied": released,
    }
    prof_total = find("partition.py:_feed") + parts["decode_validate"]
    per_step = parts["evaluate"] - inside + parts["judge_decisions"] - released
    res = {"ranks": args.ranks, "steps": args.steps, "step_s": args.step_s,
           "cpu_s": total, "profiled_s": prof_total, "seconds": parts,
           "job_stage_share": per_step / prof_total if prof_total else None,
           "judged_rank_steps": part.counts["judged_rank_steps"]}
    for name, t in parts.items():
        print(f"{name:>20}: {t:7.2f} s  {t / prof_total:6.1%}")
    print(f"job-wide per step (evaluate less its per-rank/per-group callees, + decisions): "
          f"{res['job_stage_share']:.1%} of {prof_total:.1f} profiled s; the rest is per "
          f"event, rank or group (shardable)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "streams_split.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
