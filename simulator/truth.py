"""Ground truth of a simulated run: what was injected, where, when, and what it cost.

``expected_job_slowdown_pct`` is measured, not assumed: the median step time of
the job while the fault was active (steps without benign disturbances) against
the median of its clean steps. ``step_s`` is that clean median.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from failslow.simulator.effects import host_index
from failslow.simulator.spec import FAULT_KINDS

if TYPE_CHECKING:
    from failslow.simulator.job import JobRun
    from failslow.simulator.spec import Scenario


def _job_baseline(job: JobRun) -> float:
    clean = [s for _, s, ok in job.series if ok]
    if not clean:
        return job.spec.step_s
    return float(np.median(clean))


def _slowdown(job: JobRun, start_s: float, end_s: float | None, base: float) -> float | None:
    during = [s for t, s, _ in job.series
              if t >= start_s and (end_s is None or t < end_s)]
    if not during:
        return None
    return round(100.0 * (float(np.median(during)) / base - 1.0), 2)


def make_truth(sc: Scenario, seed: int, t0: float, jobs: list[JobRun], hosts: list[str],
               benign: list[dict], end_ts: float) -> dict:
    by_id = {j.spec.job_id: j for j in jobs}
    faults = []
    for job in jobs:
        base = _job_baseline(job)
        for i, f in enumerate(job.faults):
            if not f.is_fault:
                if f.kind in ("eval", "long_seq"):
                    benign.append({"kind": f.kind, "job_id": f.job, "start_ts": t0 + f.start_s,
                                   "end_ts": None if f.end_s is None else t0 + f.end_s,
                                   "intensity": f.intensity})
                continue
            fault, root, _ = FAULT_KINDS[f.kind]
            lay = job.lay
            rank_host = hosts[int(lay.host_index[f.rank])] if f.rank is not None else None
            peer_host = (hosts[int(lay.host_index[f.peer_rank])]
                         if f.peer_rank is not None else None)
            faults.append({
                "kind": f.kind, "fault": fault, "root_cause": root, "job_id": f.job,
                "rank": f.rank,
                "host": f.host if f.host is not None else rank_host,
                "gpu": (int(lay.gpu[f.rank]) if f.rank is not None and fault == "slow_rank"
                        else None),
                "nic": (f"mlx5_{f.nic}" if f.nic is not None else None),
                "peer_rank": f.peer_rank, "peer_host": peer_host,
                "onset_ts": t0 + f.start_s,
                "end_ts": None if f.end_s is None else t0 + f.end_s,
                "onset_step": job.onset.get(i),
                "intensity": f.intensity,
                "expected_job_slowdown_pct": _slowdown(job, f.start_s, f.end_s, base),
            })
    benign.sort(key=lambda b: b["start_ts"])
    first = jobs[0]
    return {
        "scenario": sc.name, "seed": seed,
        "job_ids": [j.spec.job_id for j in jobs],
        "world_size": first.lay.world,
        "step_s": round(_job_baseline(first), 6),
        "start_ts": t0, "end_ts": end_ts,
        "faults": faults, "benign": benign,
        "jobs": [{"job_id": j.spec.job_id, "world_size": j.lay.world, "tp": j.lay.tp,
                  "pp": j.lay.pp, "dp": j.lay.dp, "step_s": round(_job_baseline(j), 6),
                  "hosts": sorted({hosts[h] for h in j.lay.host_index.tolist()},
                                  key=host_index),
                  "ended_ts": j.ended_ts} for j in by_id.values()],
        "gpus_per_host": sc.gpus_per_host, "hosts": hosts,
    }
