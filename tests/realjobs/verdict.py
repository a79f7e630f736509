"""What `failslow detect` said about one real job, against the job's truth
(``harness.run_jobs``): shared by tests/test_real_jobs.py and bench/real_ddp.py."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

LOUD = ("warning", "critical")


@dataclass
class Verdict:
    named: bool                  # a slow_rank incident (not an imbalance record) on the culprit
    open_at_end: bool            # ... still open when the trace ends (not resolved before)
    steps_to_page: int | None    # job steps from the onset to its first warning/critical
    loud_healthy: int            # loud incidents on anything but the culprit (slow_host, links too)
    root_cause: str | None       # the culprit's incident, last state
    slowdown_pct: float | None   # the culprit's incident, last state


def judge(truth: dict, incidents: list[dict]) -> Verdict:
    culprit = truth["culprit"]

    def on_culprit(i: dict) -> bool:
        return (culprit is not None and i["fault"] == "slow_rank" and i.get("rank") == culprit
                and not (i.get("evidence") or {}).get("imbalance"))

    mine = [i for i in incidents if on_culprit(i)]
    loud_healthy = {i["incident_id"] for i in incidents
                    if i["severity"] in LOUD and not on_culprit(i)}
    first_loud = next((i for i in mine if i["severity"] in LOUD), None)
    steps_to_page = None
    if first_loud is not None and truth["onset_step"] is not None:
        step = bisect_left(truth["step_end_ts"], first_loud["detected_ts"])
        steps_to_page = step - truth["onset_step"]
    last = mine[-1] if mine else None
    # `failslow detect` ends every job at the end of its input: an incident still open
    # then is resolved with resolved_reason "job ended"
    open_at_end = last is not None and (last["status"] == "open"
                                        or last.get("resolved_reason") == "job ended")
    return Verdict(named=bool(mine), open_at_end=open_at_end,
                   steps_to_page=steps_to_page, loud_healthy=len(loud_healthy),
                   root_cause=last.get("root_cause") if last else None,
                   slowdown_pct=last["slowdown_pct"] if last else None)
