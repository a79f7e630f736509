"""`failslow report --job` on a large simulated job: render time and page size.

Loads the simulator's ``large_1024`` scenario (1,024 ranks, tp8 pp4 dp32, one rank
throttled) with the incidents `failslow detect` finds into a fresh chdb folder, then
renders the job page and the incident page, each timed ``--repeat`` times.
Targets (issue 19): the job page in < 3 s and < 2 MB.

    .venv/bin/python bench/report.py [--scenario large_1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from models.pipeline import Detector
from simulator import SCENARIOS, simulate
from storage.client import connect
from storage.migrations import migrate
from storage.report import incident_page, job_page
from storage.writer import Writer


def load(client, scenario: str, seed: int) -> list[dict]:
    det, writer, incidents = Detector(), Writer(client), []
    for batch in simulate(SCENARIOS[scenario], seed=seed).batches():
        incidents += det.process_batch(batch)
        writer.write(batch)
    incidents += det.flush()
    writer.write(incidents)
    return incidents


def timed(fn, repeat: int) -> tuple[float, str]:
    best, page = float("inf"), ""
    for _ in range(repeat):
        t = time.perf_counter()
        page = fn()
        best = min(best, time.perf_counter() - t)
    return best, page


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="large_1024")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--html-dir", type=Path, help="also write the two pages here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="failslow-bench-report-"))
    try:
        client = connect(f"chdb://{root / 'chdb'}", own=True)
        migrate(client)
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
        client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for k, v in result.items():
        print(f"{k:22s} {v}")
    print(f"targets: job page < 3 s ({'met' if result['job_page_s'] < 3 else 'MISSED'}), "
          f"< 2 MB ({'met' if result['job_page_bytes'] < 2e6 else 'MISSED'})")
    out = Path(__file__).parent / "results" / "report.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
