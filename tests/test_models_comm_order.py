"""A step's ``comm`` windows judged alike whatever order they arrive in (issue 31): per-rank
input arrives in ts order, a host's ``comm_batch`` holds that host's windows together. The
groups of a step are taken in the order their windows closed (ts, then rank), so a tie
between equal culprits (``models.links``) and the op a link is named by do not follow
which host's batch came first."""

from __future__ import annotations

import orjson
import pytest

from failslow.commands.detect import detect_lines
from failslow.models.comm import CommWindows
from failslow.models.pipeline import Detector
from failslow.schema.batches import batch_trace
from failslow.simulator import SCENARIOS, simulate


def _detect(events: list[dict]) -> list[bytes]:
    out: list[bytes] = []
    bad: list = []
    detect_lines([orjson.dumps(e) for e in events], Detector(),
                 lambda inc: out.append(orjson.dumps(inc, option=orjson.OPT_SORT_KEYS)),
                 lambda no, why: bad.append((no, why)))
    assert not bad
    return out


@pytest.mark.parametrize("name", [
    "slow_link_nic_2x",         # two pipeline pairs tie as culprits: the first group decided
    "slow_link_pair_3x",
    "pipeline_stage_slow",
])
def test_per_rank_and_batched_input_give_byte_identical_incidents(name):
    events = list(simulate(SCENARIOS[name], seed=0).events())
    want = _detect(events)
    assert any(b'"fault":"slow_link"' in x or b'"fault":"slow_rank"' in x for x in want)
    batched = list(batch_trace(events))
    assert sum(e["kind"] == "comm_batch" for e in batched) > 0
    assert _detect(batched) == want


def _win(r: int, ts: float, group: str, op: str, blocked: float) -> dict:
    return {"v": 1, "kind": "comm", "job_id": "j", "rank": r, "host": f"h{r // 2}",
            "step": 0, "window_start_ts": ts - 1.0, "ts": ts, "step_end": False,
            "world_size": 4,
            "ops": [{"group": group, "group_size": 2, "op": op, "n": 2, "bytes": 1 << 20,
                     "min_s": 0.01, "blocked_s": blocked, "max_s": 0.02}]}


def test_a_steps_groups_come_in_the_order_their_windows_closed():
    """The same windows, in ts order and host by host (ts ties by rank), give the same
    collectives: the same groups in the same order, each link named by its first op."""
    wins = [_win(0, 10.0, "pp0-2", "send", 0.03), _win(1, 10.0, "pp1-3", "send", 0.02),
            _win(2, 10.5, "pp0-2", "recv", 0.01), _win(3, 10.2, "pp1-3", "recv", 0.04),
            _win(0, 11.0, "pp0-2", "send", 0.05), _win(2, 11.1, "pp0-2", "recv", 0.02),
            _win(1, 11.3, "pp1-3", "send", 0.01), _win(3, 11.2, "pp1-3", "recv", 0.03)]
    in_ts = sorted(wins, key=lambda w: (w["ts"], w["rank"]))
    by_host = sorted(wins, key=lambda w: (w["host"], w["ts"]))
    by_host_late_first = sorted(wins, key=lambda w: (w["host"] != "h1", w["ts"]))
    got = []
    for order in (in_ts, by_host, by_host_late_first):
        cw = CommWindows()
        for w in order:
            cw.add(w, 0)
        times = [cw.take_time(r, 0) for r in range(4)]
        got.append((cw.take_step(0), times))
    colls = got[0][0]
    assert [(c[1], c[2]) for c in colls] == [("pp0-2", "send"), ("pp1-3", "send")]
    assert got[1] == got[0] and got[2] == got[0]
