"""Copies of a trace's events moved in time and onto other names, to lay several runs of
one scenario side by side as a cluster whose jobs start at different times on their own
hosts (bench/soak.py's workload, the job-end tests).

>>> ev = {"kind": "step", "ts": 10.0, "job_id": "j", "host": "h0", "rank": 0}
>>> relocate(ev, 5.0, "i1")
{'kind': 'step', 'ts': 15.0, 'job_id': 'i1-j', 'host': 'i1-h0', 'rank': 0}
>>> relocate(ev, 0.0, "i1", job_prefix="i1-healthy")["job_id"]
'i1-healthy-j'
"""

from __future__ import annotations

_TIMES = ("start_ts", "window_start_ts")


def relocate(event: dict, shift_s: float, prefix: str, job_prefix: str | None = None) -> dict:
    """A copy of ``event`` ``shift_s`` seconds later, its job id prefixed with
    ``job_prefix`` (default ``prefix``), its host with ``prefix`` and its GPU uuid suffixed
    with it; every time field moves (``ts``, ``start_ts``, ``window_start_ts``, the ops'
    ``first_start_ts``)."""
    e = dict(event)
    e["ts"] += shift_s
    for f in _TIMES:
        if f in e:
            e[f] += shift_s
    if "ops" in e:
        e["ops"] = [{**o, "first_start_ts": o["first_start_ts"] + shift_s}
                    if "first_start_ts" in o else dict(o) for o in e["ops"]]
    if "job_id" in e:
        e["job_id"] = f"{job_prefix or prefix}-{e['job_id']}"
    if "host" in e:
        e["host"] = f"{prefix}-{e['host']}"
    if "uuid" in e:
        e["uuid"] = f"{e['uuid']}-{prefix}"
    return e
