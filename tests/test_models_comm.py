"""``comm`` windows as evidence (models/comm.py): the same lags, transfers and time in
collectives as the per-op ``collective`` events they sum, without any clock."""

from __future__ import annotations

import pickle

import pytest

from failslow.models.alignment import lags, transfer
from failslow.models.comm import CommWindows
from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate


def ops_of(rank: int, arrive: dict[int, float], n: int, xfer: float, group: str = "dp0",
           size: int = 4, op: str = "allreduce", peer: int | None = None) -> list[dict]:
    """n ops where each member arrives ``arrive[rank]`` s after the first; every op ends
    ``xfer`` s after the last arrival."""
    last = max(arrive.values())
    durs = [last - arrive[rank] + xfer] * n
    entry = {"group": group, "group_size": size, "op": op, "n": n, "blocked_s": sum(durs),
             "min_s": min(durs), "max_s": max(durs), "bytes": n * 1000}
    if peer is not None:
        entry["peer"] = peer
    return [entry]


def record(rank: int, ops: list[dict], step: int | None = 0, ts: float = 10.0) -> dict:
    return {"v": 1, "kind": "comm", "ts": ts, "job_id": "j", "rank": rank, "host": f"h{rank}",
            "window_start_ts": ts - 1.0, "ops": ops, "step": step, "step_end": True}


def test_least_blocked_member_is_waited_for_and_transfer_is_the_shortest_op():
    arrive = {0: 0.0, 1: 0.01, 2: 0.1, 3: 0.02}     # rank 2 is last, 0.08 s after rank 3
    cw = CommWindows()
    for r in arrive:
        # the step's ops split over two windows: the sums are the same
        cw.add(record(r, ops_of(r, arrive, 3, 0.05)), 0)
        cw.add(record(r, ops_of(r, arrive, 2, 0.05)), 0)
    assert cw.take_time(1, 0) == pytest.approx(5 * (0.1 - 0.01 + 0.05))
    (c,) = cw.take_step(0)
    assert c[:4] == [0, "dp0", "allreduce", 5000]
    late = lags([c])
    assert list(late) == [2]
    assert late[2] == pytest.approx(5 * 0.08)      # the per-op lag, summed over the ops
    assert transfer(c) == pytest.approx(5 * 0.05)  # the op once everybody was in
    assert cw.take_step(0) == []


def test_send_and_recv_of_a_pair_are_one_link():
    cw = CommWindows()
    arrive = {4: 0.0, 9: 0.2}
    cw.add(record(4, ops_of(4, arrive, 2, 0.03, "pp4-9", 2, "send", 9)), 7)
    cw.add(record(9, ops_of(9, arrive, 2, 0.03, "pp4-9", 2, "recv", 4)), 7)
    (c,) = cw.take_step(7)
    assert c[1] == "pp4-9" and c[2] in ("send", "recv")
    assert sorted(m[0] for m in c[4:]) == [4, 9]
    assert transfer(c) == pytest.approx(2 * 0.03)


def test_a_lone_member_or_an_empty_window_is_no_collective():
    cw = CommWindows()
    cw.add(record(0, ops_of(0, {0: 0.0, 1: 0.0}, 1, 0.01)), 3)
    cw.add(record(1, []), 3)
    assert cw.take_time(1, 3) is None
    assert cw.take_step(3) == []


def test_windows_of_old_steps_expire():
    cw = CommWindows(max_age=2)
    cw.add(record(0, ops_of(0, {0: 0.0}, 1, 0.01)), 1)
    cw.expire(4)
    assert cw.steps == {}


def test_detector_takes_comm_without_step_as_the_next_step_and_pickles():
    det = Detector()
    det.process(record(0, ops_of(0, {0: 0.0, 1: 0.0}, 1, 0.01), step=None))
    job = det.jobs["j"]
    assert list(job.comm.steps) == [0]
    back = Detector.from_state(det.state_dict())
    assert pickle.dumps(back.jobs["j"].comm.steps) == pickle.dumps(job.comm.steps)


@pytest.mark.parametrize("name", ["gpu_thermal_30", "slow_link_pair_3x"])
def test_both_grains_find_the_same_culprit(name):
    found = {}
    for grain in ("comm", "collective"):
        det = Detector()
        incs = []
        for chunk in simulate(SCENARIOS[name], seed=1, grain=grain).batches():
            incs += det.process_batch(chunk)
        incs += det.flush()
        found[grain] = {(i["fault"], i.get("rank"), i.get("peer_rank"), i.get("root_cause"))
                        for i in incs if i["severity"] != "info"}
        assert found[grain]
    assert found["comm"] == found["collective"]
