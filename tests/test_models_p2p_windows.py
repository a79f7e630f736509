"""A slow pipeline link is confirmed from the ``comm`` windows inside a long step
(``models.p2p``: per-window evidence of a rank pair), sustained for ``sustain_s``; a rank
that pauses (its neighbour's ops wait, its own do not) and a one-window spike are not;
short steps keep the step rule."""

from __future__ import annotations

import pickle

from failslow.models.config import JobConfig
from failslow.models.p2p import P2PMonitor

MB = 1 << 27          # bytes per op
PAIRS = [(i, 8 + i) for i in range(8)]      # rank i on h0 <-> rank 8 + i on h1


def windows(step: int, t0: float, k: int, cost: dict[tuple[int, int], tuple[float, float]],
            end: bool = False) -> list[dict]:
    """Window ``k`` of ``step`` (started at ``t0``) of every rank: 4 sends and 4 recvs per
    pair; ``cost[pair]`` = (shortest op of the lower rank's side, of the higher's)."""
    out = []
    w0 = t0 + k
    for a, b in PAIRS:
        ca, cb = cost.get((a, b), (0.01, 0.01))
        for r, peer, c in ((a, b, ca), (b, a, cb)):
            op = "send" if r == a else "recv"
            out.append({"kind": "comm", "job_id": "j", "rank": r, "host": f"h{r // 8}",
                        "step": step, "window_start_ts": w0, "ts": w0 + (0.4 if end else 1.0),
                        "step_end": end, "world_size": 16,
                        "ops": [{"group": f"pp{a}-{b}", "group_size": 2, "op": op,
                                 "peer": peer, "n": 4, "bytes": 4 * MB, "min_s": c,
                                 "blocked_s": 4 * c}]})
    return out


def run(steps: int, step_windows: int, cost_at) -> tuple[P2PMonitor, list[tuple[float, list]]]:
    mon = P2PMonitor(JobConfig())
    confirmed = []
    t = 0.0
    for s in range(steps):
        for k in range(step_windows):
            for ev in windows(s, t, k, cost_at(s, k), end=k == step_windows - 1):
                if mon.add_comm(ev, s):
                    confirmed.append((ev["ts"], list(mon.last)))
        job_s = step_windows - 0.6
        mon.last = mon.evaluate(s, {}, t + job_s, job_s, 16)
        t += job_s
    return mon, confirmed


def test_slow_pair_confirmed_from_windows_inside_a_long_step():
    slow = (2, 10)

    def cost(s, k):
        return {slow: (0.05, 0.05)} if (s, k) >= (5, 2) else {}
    mon, confirmed = run(8, 8, cost)
    assert confirmed, "never confirmed from windows"
    ts, found = confirmed[0]
    onset = 5 * 7.4 + 2
    assert ts - onset <= 3.0          # two windows after the first slow one, not a step
    f = next(f for f in found if f.key == "slow_link:r2-r10")
    assert f.confirmed and f.rank == 2 and f.peer_rank == 10
    assert {f.host, f.peer_host} == {"h0", "h1"}
    assert f.evidence["p2p_windows"] and f.evidence["sustained_s"] >= 2.0
    assert f.evidence["transfer_rel_slowdown"] > 1.0
    assert f.slowdown_pct > 5.0
    # only the slow pair
    assert [g.key for g in found if g.evidence.get("p2p_windows")] == ["slow_link:r2-r10"]
    # a restored monitor goes on alike
    again = pickle.loads(pickle.dumps(mon))
    assert again.wrun.keys() == mon.wrun.keys()


def test_a_paused_rank_and_a_one_window_spike_are_no_link():
    def cost(s, k):
        if s == 5 and k in (2, 3, 4):
            return {(2, 10): (0.01, 0.4)}      # rank 10 paused: only its recvs waited
        if s == 6 and k == 3:
            return {(3, 11): (0.08, 0.08)}     # one slow window
        return {}
    _, confirmed = run(8, 8, cost)
    assert confirmed == []


def test_short_steps_keep_the_step_rule():
    def cost(s, k):
        return {(2, 10): (0.05, 0.05)} if s >= 5 else {}
    _, confirmed = run(12, 1, cost)
    assert confirmed == []
