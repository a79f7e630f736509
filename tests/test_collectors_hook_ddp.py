"""Honest accounting under DDP overlap, in a real 4-rank job (gloo on CPU, ~8 MB of
gradients in several buckets, so all-reduces overlap each other and backward).

From step 10 on, rank 2 does 2x the compute (real extra matmuls in forward and
backward). The healthy ranks' ``compute_s`` must not collapse into ``comm_s`` while they
wait for it (summing op durations made it ~0), and the slow rank's must grow. Margins
are generous: 4 ranks share 2 cores with other work, so no timing is asserted tight."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")

from statistics import median  # noqa: E402

from hook_jobs import med, run_ddp, spread  # noqa: E402

from schema import validate  # noqa: E402

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
    assert slow_after > 1.3 * slow_before, (slow_before, slow_after)
    assert slow_after > 1.2 * max(med(by_rank[r], "compute_s", FROM, STEPS) for r in healthy)
