"""A job's setup collectives (parameter broadcasts before its first step ends, no ``step``)
make derived steps of milliseconds until the first step event comes; those give way with
all they taught: the job's later steps are judged and priced against its real steps."""

from __future__ import annotations

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate


def trace(setup: int) -> list[dict]:
    events = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0, grain="collective").events())
    first = min(e["ts"] - e["duration_s"] for e in events if e["kind"] == "step")
    ranks = {e["rank"]: e for e in events if e["kind"] == "step"}
    world = len(ranks)
    out = []
    for k in range(setup):           # one broadcast every 10 ms on every rank, no step
        end = first + 0.01 * (k + 1)
        for r, s in sorted(ranks.items()):
            out.append({"v": 1, "kind": "collective", "ts": end, "job_id": s["job_id"],
                        "rank": r, "host": s["host"], "group": "world", "group_size": world,
                        "op": "broadcast", "seq": k, "start_ts": end - 0.005,
                        "duration_s": 0.005, "bytes": 1 << 20, "step": None})
    return out + events


def loud(events: list[dict]) -> list[dict]:
    det = Detector()
    incs = det.process_batch(events) + det.flush()
    return [i for i in incs if i["severity"] != "info"]


def test_setup_collectives_before_the_first_step_change_no_verdict_nor_its_price():
    base = loud(trace(0))
    got = loud(trace(20))
    assert base and [(i["fault"], i.get("rank"), i["severity"], i["status"]) for i in got] \
        == [(i["fault"], i.get("rank"), i["severity"], i["status"]) for i in base]
    for a, b in zip(got, base, strict=True):
        assert abs(a["slowdown_pct"] - b["slowdown_pct"]) <= 0.1 * b["slowdown_pct"], (a, b)
