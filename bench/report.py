"""`failslow report --job` on a large simulated job: render time and page size.

Loads the simulator's ``large_1024`` scenario (1,024 ranks, tp8 pp4 dp32, one rank
throttled) with the incidents `failslow detect` finds into a fresh chdb folder, then
renders the job page and the incident page, each timed ``--repeat`` times.
Targets (issue 19): the job page in < 3 s and < 2 MB.

``--long-steps N`` adds a longer run of the same 1,024 ranks as step rows only (numpy,
no simulator: N steps of 1 s, rank 517 30 % slower in the middle third) and one incident,
and times that job's page too: the SQL then reads N x 1,024 step rows.

    .venv/bin/python bench/report.py [--scenario large_1024] [--repeat 3] [--long-steps 3000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate
from failslow.storage.client import connect
from failslow.storage.migrations import migrate
from failslow.storage.report import incident_page, job_page
from failslow.storage.writer import Writer


def load(client, scenario: str, seed: int) -> list[dict]:
    det, writer, incidents = Detector(), Writer(client), []
    for batch in simulate(SCENARIOS[scenario], seed=seed).batches():
        incidents += det.process_batch(batch)
        writer.write(batch)
    incidents += det.flush()
    writer.write(incidents)
    return incidents


def load_long(client, steps: int, ranks: int = 1024, culprit: int = 517) -> str:
    """``steps`` x ``ranks`` step rows of job ``long`` and one incident; returns its id."""
    rng = np.random.default_rng(0)
    t0 = 1_767_300_000.0
    step = np.repeat(np.arange(steps), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int32), steps)
    own = 0.6 * (1 + 0.02 * rng.standard_normal(step.size))
    slow = (rank == culprit) & (step >= steps // 3) & (step < 2 * steps // 3)
    own[slow] *= 1.3
    per_step = np.maximum.reduceat(own, np.arange(0, step.size, ranks)) + 0.4
    duration = np.repeat(per_step, ranks)
    for lo in range(0, step.size, 1_000_000):
        sl = slice(lo, lo + 1_000_000)
        client.insert("steps", pa.table({
            "ts": pa.array(((t0 + step[sl] + duration[sl]) * 1000).astype(np.int64),
                           pa.timestamp("ms", tz="UTC")),
            "job_id": ["long"] * len(step[sl]), "rank": rank[sl], "world_size":
            np.full(len(step[sl]), ranks, np.int32), "host": [f"h{r // 8}" for r in rank[sl]],
            "step": step[sl], "duration_s": duration[sl], "gpu": rank[sl] % 8,
            "compute_s": own[sl], "comm_s": duration[sl] - own[sl]}))
    iid = f"long:slow_rank:r{culprit}:{steps // 3}"
    onset = t0 + steps // 3
    Writer(client).write([{
        "v": 1, "kind": "incident", "ts": onset + 3 + k, "incident_id": iid, "job_id": "long",
        "status": "open", "fault": "slow_rank", "severity": "critical", "onset_ts": onset,
        "detected_ts": onset + 3, "slowdown_pct": 25.0, "rank": culprit, "host":
        f"h{culprit // 8}", "gpu": culprit % 8, "root_cause": "gpu_thermal"} for k in range(3)])
    return iid


def timed(fn, repeat: int) -> tuple[float, str]:
    best, page = float("inf"), ""
    for _ in range(repeat):
        t = time.perf_counter()
        page = fn()
        best = min(best, time.perf_counter() - t)
    return best, page


def run_scenario(client, args) -> dict:
    t = time.perf_counter()
    incidents = load(client, args.scenario, args.seed)
    load_s = time.perf_counter() - t
    steps = client.query(f"SELECT count(), max(world_size) FROM {client.database}.steps")[1][0]
    job = incidents[0]["job_id"] if incidents else "job0"
    job_s, page = timed(lambda: job_page(client, job), args.repeat)
    result = {"scenario": args.scenario, "ranks": int(steps[1]), "step_rows": int(steps[0]),
              "incidents": len({i["incident_id"] for i in incidents}), "load_s": round(load_s, 1),
              "job_page_s": round(job_s, 3), "job_page_bytes": len(page.encode())}
    if incidents:
        inc_s, ipage = timed(lambda: incident_page(client, incidents[0]["incident_id"]),
                             args.repeat)
        result |= {"incident_page_s": round(inc_s, 3),
                   "incident_page_bytes": len(ipage.encode())}
        if args.html_dir:
            args.html_dir.mkdir(parents=True, exist_ok=True)
            (args.html_dir / "job.html").write_text(page)
            (args.html_dir / "incident.html").write_text(ipage)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="large_1024", help="a simulator scenario, or none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--html-dir", type=Path, help="also write the pages here")
    ap.add_argument("--long-steps", type=int, default=0,
                    help="also a job of this many steps x 1,024 ranks (step rows only)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="failslow-bench-report-"))
    try:
        client = connect(f"chdb://{root / 'chdb'}", own=True)
        migrate(client)
        result: dict = {}
        if args.scenario != "none":
            result = run_scenario(client, args)
        if args.long_steps:
            t = time.perf_counter()
            long_id = load_long(client, args.long_steps)
            result["long_step_rows"] = args.long_steps * 1024
            result["long_load_s"] = round(time.perf_counter() - t, 1)
            long_s, lpage = timed(lambda: job_page(client, "long"), args.repeat)
            result |= {"long_job_page_s": round(long_s, 3),
                       "long_job_page_bytes": len(lpage.encode())}
            inc_s, ipage = timed(lambda: incident_page(client, long_id), args.repeat)
            result |= {"long_incident_page_s": round(inc_s, 3),
                       "long_incident_page_bytes": len(ipage.encode())}
            if args.html_dir:
                args.html_dir.mkdir(parents=True, exist_ok=True)
                (args.html_dir / "long_job.html").write_text(lpage)
                (args.html_dir / "long_incident.html").write_text(ipage)
        client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for k, v in result.items():
        print(f"{k:22s} {v}")
    for key in ("job_page", "long_job_page"):
        if f"{key}_s" in result:
            print(f"targets {key}: < 3 s ({'met' if result[f'{key}_s'] < 3 else 'MISSED'}), "
                  f"< 2 MB ({'met' if result[f'{key}_bytes'] < 2e6 else 'MISSED'})")
    out = Path(__file__).parent / "results" / "report.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
