"""Issue 31 (flat cost at any size): the shortcuts that keep the cost of a judged step from
growing with the job give the same answers as the full computation.

- ``P2PMonitor._quartile_low`` (``models.p2p``): a bound near the lower quartile of a size
  class lets an observation through without ``lower_half_ref`` only where that reference
  would find it within ``far_rel``, however stale its sorted copy is; and it decides most
  healthy observations (else it saves nothing).
- ``P2PMonitor._reference``: ``lower_half_ref`` of a size class read by position off its
  sorted copy, kept up with the values set since, equals the partitioned one to the bit.
- ``models.rootcause.Peers``: the peers' statistics read from the ``GpuTable``'s columns
  are the ones read from each GPU's view (the scores equal to the last bit).
"""

from __future__ import annotations

import random

import numpy as np

from failslow.models.config import CauseConfig, JobConfig
from failslow.models.p2p import P2PMonitor
from failslow.models.peers import KeyedValues, lower_half_ref, sorted_lower_half_ref
from failslow.models.rootcause import Peers, attribute, gpu_scores
from failslow.models.telemetry import TelemetryStore


def test_quartile_bound_never_passes_a_slow_observation():
    rng = random.Random(7)
    mon = P2PMonitor(JobConfig())
    far = mon.cfg.far_rel
    row = KeyedValues()
    keys = [(k, 0) for k in range(600)]
    for k in keys:
        row.set(k, rng.lognormvariate(0.0, 0.3))
        mon._sets += 1
    passed = healthy = by_min = 0
    value = dict(zip(keys, row.array().tolist(), strict=True))
    for i in range(6000):
        k = keys[rng.randrange(len(keys))]
        if i % 97 == 0:
            if k in value:          # a direction moving to another size class
                row.discard(k)
                mon._note(None, 0.0, (value.pop(k), 0.0))
            continue
        # mostly healthy values, some far above the class, many near the bar
        x = rng.choice((rng.lognormvariate(0.0, 0.3), rng.uniform(1.2, 2.6),
                        rng.uniform(2.0, 6.0)))
        row.set(k, x)               # as ``_window`` sets a value
        mon._sets += 1
        mon._note(0.0, x, (value[k], 0.0) if k in value else None)
        value[k] = x
        assert np.array_equal(mon._sorted(0.0, row), np.sort(row.array()))
        ref, _ = lower_half_ref(row.array().copy())
        ok = mon._quartile_low(0.0, row, x)
        if ok:
            assert x / ref - 1.0 < far, (i, x, ref)
        if x < ref:             # healthy: the bound lets most through, the smallest value few
            healthy += 1
            passed += ok
            by_min += x < (1.0 + far) * float(row.array().min()) * (1.0 - 1e-9)
    assert passed >= 0.8 * healthy > 10 * by_min, (passed, healthy, by_min)


def test_quartile_bound_follows_a_class_that_was_replaced():
    mon = P2PMonitor(JobConfig())
    old = KeyedValues()
    for k in range(64):
        old.set(k, 1.0)
        mon._sets += 1
    assert mon._quartile_low(0.0, old, 1.2)
    new = KeyedValues()             # the same class made again (a restore): a new copy
    for k in range(64):
        new.set(k, 10.0)
        mon._sets += 1
    assert not mon._quartile_low(0.0, new, 12.0 * (1.0 + mon.cfg.far_rel))
    assert mon._quartile_low(0.0, new, 12.0)


def test_a_reference_by_position_in_the_sorted_values_equals_the_partitioned_one():
    # P2PMonitor._reference: lower_half_ref of a class read off its sorted copy, kept up by
    # the values set and taken out since (sorted_update), to the last bit; ties included
    rng = np.random.default_rng(11)
    for i in range(3000):
        n = int(rng.integers(1, 900))
        v = rng.lognormal(size=n, sigma=0.4)
        if i % 3 == 0:
            v = np.round(v, 1)
        assert sorted_lower_half_ref(np.sort(v)) == lower_half_ref(v.copy()), (i, n)
    mon = P2PMonitor(JobConfig())
    row, value = KeyedValues(), {}
    for step in range(4000):
        k = int(rng.integers(0, 700))
        if step % 13 == 0 and k in value:
            row.discard(k)
            mon._note(None, 0.0, (value.pop(k), 0.0))
        else:
            x = float(np.round(rng.lognormal(sigma=0.4), 2))
            row.set(k, x)
            mon._note(0.0, x, (value[k], 0.0) if k in value else None)
            value[k] = x
        if step % 7 == 0 and len(row):
            assert mon._reference(0.0, row) == lower_half_ref(np.array(row.array()))
    assert np.array_equal(mon._sorted(0.0, row), np.sort(np.array(list(value.values()))))
    k = next(iter(value))           # a class holding NaN: as lower_half_ref takes it
    row.set(k, float("nan"))
    mon._note(0.0, float("nan"), (value[k], 0.0))
    got, want = mon._reference(0.0, row), lower_half_ref(np.array(row.array()))
    assert np.array_equal(got, want, equal_nan=True)
    row.set(k, 1.0)
    mon._note(0.0, 1.0, (float("nan"), 0.0))
    assert mon._reference(0.0, row) == lower_half_ref(np.array(row.array()))


def _store(hosts: int, seed: int) -> TelemetryStore:
    """GPU samples of ``hosts`` hosts x 8 GPUs, 6 rounds: noisy gauges, a few counters and
    reason bits; GPU 3 of host h1 hot and throttled, GPU 5 of h2 missing some gauges."""
    rng = random.Random(seed)
    store = TelemetryStore()
    for t in range(6):
        for h in range(hosts):
            for g in range(8):
                hot = (h, g) == (1, 3)
                ev = {"kind": "gpu", "ts": float(t), "host": f"h{h}", "gpu": g,
                      "sm_clock_mhz": rng.gauss(1400.0 if hot else 1980.0, 5.0),
                      "temp_c": rng.gauss(92.0 if hot else 65.0, 1.5),
                      "power_limit_w": 700.0, "pcie_gen": 5, "pcie_width": 16,
                      "pcie_max_gen": 5, "pcie_max_width": 16,
                      "pcie_replay_total": t * rng.randrange(0, 3),
                      "ecc_sbe_total": t * (5 if hot else rng.randrange(0, 2)),
                      "clocks_event_reasons": 0x20 if hot else rng.choice((0, 0, 0, 0x04))}
                if (h, g) == (2, 5):
                    del ev["temp_c"], ev["power_limit_w"]
                store.observe_gpu(ev)
    return store


def test_peer_statistics_from_the_table_equal_those_from_the_views():
    store = _store(hosts=6, seed=3)
    c = CauseConfig()
    job = {f"h{h}" for h in range(5)}          # h5 runs another job
    for culprit in [("h1", 3), ("h0", 0), ("h2", 5)]:
        views = [d for k, d in store.gpus.items() if k[0] in job and k != culprit]
        t = store.table
        rows = [r for k, r in t.rows.items() if k[0] in job and k != culprit]
        table = Peers.of_table(t, np.array(rows, dtype=np.int64))
        dev = store.gpus[culprit]
        assert gpu_scores(dev, views, c) == gpu_scores(dev, table, c)
    # the culprit's cause, as the pipeline asks for it
    cause, ev = attribute("slow_rank", store, ["h1"], [("h1", 3)], job, 0.0, None, c)
    assert cause == "gpu_thermal"
    assert ev["gpu_thermal"]["gpu"] == "h1:3"


def _nic_store(bad: set[tuple[int, int]]) -> TelemetryStore:
    """4 hosts x 8 NICs (mlx5_k serves GPU k), 4 samples a second apart; the ports in
    ``bad`` (host, nic) grow their pause and CNP counters 1,000x faster than the others."""
    store = TelemetryStore()
    for t in range(4):
        for h in range(4):
            for k in range(8):
                fast = 1000 if (h, k) in bad else 1
                store.observe_nic({"kind": "nic", "ts": float(t), "host": f"h{h}",
                                   "nic": f"mlx5_{k}", "port": 1,
                                   "tx_bytes_total": 10**9 * t, "rx_bytes_total": 10**9 * t,
                                   "rx_pause_total": 50 * t * fast,
                                   "cnp_sent_total": 40 * t * fast,
                                   "ecn_marked_total": 30 * t * fast})
    return store


def test_nic_refinement_found_once_a_step_aims_each_finding_as_alone():
    # refine_with_nics keeps the job's hosts, ports, outliers and GPU slots in the step's
    # memo (each a pass over every rank or port of the job): a finding judged with the
    # memo other findings filled is aimed as one judged alone.
    from failslow.models.incidents import Finding
    from failslow.models.links import refine_with_nics

    rank_host = {r: f"h{r // 8}" for r in range(32)}
    rank_gpu = {r: r % 8 for r in range(32)}
    for bad in ({(2, k) for k in range(6)}, {(1, 3), (3, 3)}, {(0, 5)}, set()):
        store = _nic_store(bad)
        cases = [(Finding(key=f"slow_link:g{i}", fault="slow_link", confirmed=True,
                          onset_ts=0.0, onset_step=0, slowdown_pct=10.0, host=f"h{i}",
                          hosts=[f"h{i}"]), members)
                 for i, members in enumerate([[(16, 17)], [(11, 27)], [(5, 13), (11, 27)],
                                              [(21, 29)], [(5, 13)]])]
        alone = [refine_with_nics(f, m, store, rank_host, rank_gpu) for f, m in cases]
        memo: dict = {}
        shared = [refine_with_nics(f, m, store, rank_host, rank_gpu, memo) for f, m in cases]
        assert [(g.key, g.host, g.peer_rank, d) for g, d in shared] == \
            [(g.key, g.host, g.peer_rank, d) for g, d in alone]
        if bad:
            assert any(d for _, d in alone)      # the NICs decided some finding
