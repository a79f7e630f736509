"""Honest accounting under DDP overlap, in a real 4-rank job (gloo on CPU, ~8 MB of
gradients in several buckets, so all-reduces overlap each other and backward).

From step 10 on, rank 2 does 2x the compute (real extra matmuls in forward and
backward). The healthy ranks' ``compute_s`` must not collapse into ``comm_s`` while they
wait for it (summing op durations made it ~0), and the slow rank's must grow. The job
publishes both grains: each rank-step's ``comm`` windows must hold exactly its raw
``collective`` events, and in them the slow rank is the one that blocks least. Margins
are generous: 4 ranks share 2 cores with other work, so no timing is asserted tight."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")

from collections import defaultdict  # noqa: E402
from statistics import median  # noqa: E402

from hook_jobs import med, read_events, run_ddp, spread  # noqa: E402

from failslow.schema import validate  # noqa: E402

pytestmark = pytest.mark.integration

SLOW, FROM, STEPS = 2, 10, 20


def test_ddp_healthy_ranks_keep_their_compute_when_a_peer_is_2x(tmp_path):
    by_rank = run_ddp(tmp_path, world=4, steps=STEPS, slow_rank=SLOW, slow_from=FROM,
                      factor=2.0, batch=256)
    for steps in by_rank.values():
        assert [s["step"] for s in steps] == list(range(STEPS))
        for s in steps:
            validate({k: v for k, v in s.items() if not k.endswith("_sum_s")})
            assert abs(s["compute_s"] + s["comm_s"] + s["data_s"] - s["duration_s"]) < 1e-6
            assert s["comm_s"] > 0 and s["dp_rank"] == s["rank"]
    # before the slow phase, ranks' own work looks alike: far closer than when op
    # durations were summed (measured p50 26 % against 107 %)
    assert median(spread(by_rank, "compute_s", 2, FROM)) < 0.8 * median(
        spread(by_rank, "compute_sum_s", 2, FROM))
    healthy = [r for r in by_rank if r != SLOW]
    for r in healthy:
        before, after = med(by_rank[r], "compute_s", 2, FROM), med(by_rank[r], "compute_s", FROM, STEPS)
        assert after > 0.6 * before, (r, before, after)
    slow_before = med(by_rank[SLOW], "compute_s", 2, FROM)
    slow_after = med(by_rank[SLOW], "compute_s", FROM, STEPS)
    # Against its own past the growth reads smaller than 2x on a shared VM: once slow, the
    # rank gets the cores its waiting peers leave (a clean-clone CI measured 1.20x with
    # 4 ranks and 2 other test workers on 2 cores). Against its peers in the same steps,
    # the contention is shared.
    assert slow_after > 1.1 * slow_before, (slow_before, slow_after)
    assert slow_after > 1.2 * max(med(by_rank[r], "compute_s", FROM, STEPS) for r in healthy)


def _by_step(evs: list[dict]) -> tuple[dict, dict, dict]:
    raw: dict[int, list[dict]] = defaultdict(list)
    comm: dict[int, list[dict]] = defaultdict(list)
    for ev in evs:
        if ev["kind"] == "collective" and ev["step"] is not None:
            raw[ev["step"]].append(ev)
        elif ev["kind"] == "comm" and ev["step"] is not None:
            comm[ev["step"]].append(ev)
    return raw, comm, {ev["step"]: ev for ev in evs if ev["kind"] == "step"}


def test_ddp_comm_windows_hold_the_raw_ops_and_show_who_is_waited_for(tmp_path):
    run_ddp(tmp_path, world=4, steps=STEPS, slow_rank=SLOW, slow_from=FROM, factor=2.0,
            batch=256)
    seqs: dict[tuple, set] = defaultdict(set)
    per_op_blocked: dict[int, list[float]] = {}
    for rank, evs in read_events(tmp_path, 4).items():
        raw, comm, steps = _by_step(evs)
        assert sorted(comm) == list(range(STEPS))
        blocked = []
        for step, recs in comm.items():
            # ~0.1-0.3 s steps, 1 s windows: at most one close inside the step, and only the
            # last record of a step closes it
            assert len(recs) <= 2
            assert [bool(r.get("step_end")) for r in recs] == [False] * (len(recs) - 1) + [True]
            entries = [o for r in recs for o in r["ops"]]
            for r in recs:
                validate(r)
            assert sum(o["n"] for o in entries) == len(raw[step])
            assert sum(o["bytes"] for o in entries) == sum(e["bytes"] for e in raw[step])
            assert min(o["min_s"] for o in entries) == min(e["duration_s"] for e in raw[step])
            assert max(o["max_s"] for o in entries) == max(e["duration_s"] for e in raw[step])
            total = sum(o["blocked_s"] for o in entries)
            assert total <= steps[step]["comm_s"] + 1e-6
            if step >= FROM:
                blocked.append(total / sum(o["n"] for o in entries))
        per_op_blocked[rank] = blocked
        for e in (e for es in raw.values() for e in es):
            seqs[(e["group"], e["seq"])].add((e["op"], e["bytes"], e["step"]))
    assert all(len(v) == 1 for v in seqs.values())  # one seq, one collective on all ranks
    # the straggler arrives last: it blocks least per all-reduce; its peers wait for it
    slow = median(per_op_blocked[SLOW])
    assert all(slow < 0.7 * median(b) for r, b in per_op_blocked.items() if r != SLOW), {
        r: round(median(b), 4) for r, b in per_op_blocked.items()}
