"""Step-level paging at once (``IncidentTracker.steady``, issue 15): a confirmation whose
evidence spans two or more of the job's steps, with its latest step far outside the
noise and not fading, pages on open; a stall's remainder, a single step of evidence,
weak or noise-less evidence keep ``page_after_steps``."""

from __future__ import annotations

import math

from failslow.models.findings import Finding
from failslow.models.incidents import STEADY_Z, IncidentTracker

ACT = "rebalance_microbatches"


def rank_finding(rel: float, window: list[float], onset_ts: float, z: float = 20.0,
                 confirmed: bool = True) -> Finding:
    """A rank's finding as ``models.localize`` builds it: this step's excess over its peers
    (``rel``, z-scored) and the windowed mean of the log excess of its last steps."""
    logs = [math.log1p(x) for x in window]
    return Finding(key="slow_rank:r5", fault="slow_rank", confirmed=confirmed,
                   onset_ts=onset_ts, onset_step=10, slowdown_pct=100.0 * rel,
                   own_pct=100.0 * rel, rank=5, host="h0", gpu=5,
                   evidence={"rel_to_peers": rel, "z_to_peers": z, "rel_to_own_past": rel,
                             "mean_excess": round(sum(logs) / len(logs), 3),
                             "mean_excess_steps": len(logs), "evidence": "change",
                             "evidence_z": 8.0})


def warm(tr: IncidentTracker, steps: int = 8, period: float = 1.0) -> float:
    """Healthy steps of job j every ``period`` s; returns the ts of the last."""
    ts = 0.0
    for k in range(steps):
        ts = 100.0 + period * k
        assert tr.step("j", ts, []) == []
    return ts


def test_a_rate_slowdown_pages_on_its_confirmation():
    # 30 % slower from inside step 1 (partial: 15 %), in full on step 2: the step that
    # confirms it is as slow as the evidence before it.
    tr = IncidentTracker()
    ts = warm(tr)
    onset = ts
    ts += 1.15
    assert tr.step("j", ts, []) == []
    ts += 1.3
    f = rank_finding(0.3, [0.0, 0.01, -0.01, 0.0, 0.15, 0.3], onset)
    out = tr.step("j", ts, [(f, "gpu_thermal", ACT, "why", {})])
    assert [(e["status"], e["severity"]) for e in out] == [("open", "critical")]


def test_a_stall_that_straddles_two_steps_keeps_todays_rule():
    # A pause of 0.4 s split over a step boundary: 40 % then a 17 % remainder, z far
    # above the noise on both: it confirms (two steps of evidence) but fades, so it opens
    # as info and, gone on the next step, never pages.
    tr = IncidentTracker()
    ts = warm(tr)
    onset = ts
    ts += 1.4
    assert tr.step("j", ts, []) == []
    ts += 1.17
    f = rank_finding(0.17, [0.0, 0.01, -0.01, 0.0, 0.4, 0.17], onset, z=12.0)
    out = tr.step("j", ts, [(f, "unknown", ACT, "why", {})])
    assert [(e["status"], e["severity"]) for e in out] == [("open", "info")]
    for _ in range(8):
        ts += 1.0
        out += tr.step("j", ts, [])
    assert {e["severity"] for e in out} == {"info"}
    assert out[-1]["status"] == "resolved"


def test_single_step_evidence_never_pages_at_once():
    # Everything in one step (the onset one period ago): never one step.
    tr = IncidentTracker()
    ts = warm(tr)
    onset = ts
    ts += 1.0
    f = rank_finding(0.5, [0.0, 0.0, 0.0, 0.0, 0.0, 0.5], onset)
    out = tr.step("j", ts, [(f, "gpu_thermal", ACT, "why", {})])
    assert [e["severity"] for e in out] == ["info"]


def test_evidence_inside_the_noise_waits_for_more_confirmations():
    # Steady but only a few sigmas from its peers: paged page_after_steps later.
    tr = IncidentTracker()
    ts = warm(tr)
    onset = ts
    sev = []
    for k in range(4):
        ts += 1.0
        if k == 0:
            assert tr.step("j", ts, []) == []
            continue
        f = rank_finding(0.3, [0.0, 0.0, 0.0] + [0.3] * (k + 1) + [0.3] * 0, onset,
                         z=STEADY_Z - 1.0)
        sev += [e["severity"] for e in tr.step("j", ts, [(f, "gpu_thermal", ACT, "", {})])]
    assert sev == ["info", "critical"]
    assert tr.open[("j", "slow_rank:r5")].age == 2


def test_a_host_pages_on_a_second_confirmation_as_slow_as_the_first():
    tr = IncidentTracker()
    ts = warm(tr)

    def host(rel: float) -> Finding:
        return Finding(key="slow_host:h3", fault="slow_host", confirmed=True, onset_ts=ts - 2,
                       onset_step=10, slowdown_pct=25.0, own_pct=100.0 * rel, host="h3",
                       hosts=["h3"], evidence={"ranks": [24, 25], "rel_to_peers": rel,
                                                "rel_to_own_past": rel})

    ts += 1.0
    out = tr.step("j", ts, [(host(0.26), "cpu_contention", ACT, "", {})])
    ts += 1.0
    out += tr.step("j", ts, [(host(0.25), "cpu_contention", ACT, "", {})])
    assert [e["severity"] for e in out] == ["info", "critical"]
    # One that fades on its second confirmation waits: today's rule.
    tr2 = IncidentTracker()
    ts = warm(tr2)
    ts += 1.0
    out = tr2.step("j", ts, [(host(0.4), "cpu_contention", ACT, "", {})])
    ts += 1.0
    out += tr2.step("j", ts, [(host(0.1), "cpu_contention", ACT, "", {})])
    assert [e["severity"] for e in out] == ["info"]


def test_the_step_period_is_the_jobs_own():
    # The same finding at 0.25 s and at 1 s steps: the evidence span is counted in steps
    # of the job at hand, so the 2.5 s of evidence is 10 steps at 0.25 s and 2.5 at 1 s
    # (both at least two), and 0.3 s of evidence at 1 s steps is one step (never pages).
    for period, span, paged in ((0.25, 2.5, True), (1.0, 2.5, True), (1.0, 0.3, False)):
        tr = IncidentTracker()
        ts = warm(tr, period=period) + period
        tr.step("j", ts, [])
        f = rank_finding(0.3, [0.0] * 3 + [0.3] * 3, ts - span)
        out = tr.step("j", ts, [(f, "gpu_thermal", ACT, "", {})])
        assert (out[0]["severity"] != "info") is paged, (period, span)
        assert tr.period("k", 1.0) == (0.0, [1.0])   # another job: no period yet


def _incidents(name: str, seed: int) -> list[dict]:
    from failslow.models.pipeline import Detector
    from failslow.simulator import SCENARIOS, simulate

    det = Detector()
    out: list[dict] = []
    for chunk in simulate(SCENARIOS[name], seed=seed).batches():
        out.extend(det.process_batch(chunk))
    return out + det.flush()


def test_end_to_end_a_throttled_gpu_pages_on_open_a_straddling_stall_never():
    # 1 s steps: rank 5 throttled 30 % pages with the event that opens it; rank 43's
    # pause that spills over a step boundary (40 % then 17 %) opens info and never pages.
    incs = _incidents("gpu_thermal_30", 0)
    first = next(i for i in incs if i.get("rank") == 5)
    assert first["status"] == "open" and first["severity"] != "info"
    benign = _incidents("healthy_hybrid_64", 2)
    assert {i["severity"] for i in benign} <= {"info"}



def link_finding(rel: float, run: list[float], onset_ts: float, step_z: float = 20.0
                 ) -> Finding:
    """A link as ``models.links`` builds it: this step's transfer excess of its worst group,
    the mean log excess of that group's evidence run and this step's z."""
    logs = [math.log1p(x) for x in run]
    return Finding(key="slow_link:h1", fault="slow_link", confirmed=True, onset_ts=onset_ts,
                   onset_step=10, slowdown_pct=12.0, own_pct=100.0 * rel, host="h1",
                   hosts=["h1"], evidence={"slow_groups": ["dp0", "dp1"],
                                           "transfer_rel_slowdown": rel,
                                           "mean_excess": round(sum(logs) / len(logs), 3),
                                           "mean_excess_steps": len(logs), "step_z": step_z})


def test_a_link_as_slow_on_its_confirming_step_pages_on_open():
    # Two steps of evidence (50 % then 48 %) at z far above the noise: a rate, paged with
    # the event that opens it; fading (50 % then 20 %) or a step inside the noise waits
    # for a second confirmation (today's rule for links).
    for second, z, loud in ((0.48, 20.0, True), (0.2, 20.0, False), (0.48, 3.0, False)):
        tr = IncidentTracker()
        ts = warm(tr)
        onset = ts
        ts += 1.2
        assert tr.step("j", ts, []) == []
        ts += 1.2
        f = link_finding(second, [0.5, second], onset, step_z=z)
        out = tr.step("j", ts, [(f, "nic_congestion", "adjust_pipeline", "", {})])
        assert out[0]["status"] == "open"
        assert (out[0]["severity"] != "info") is loud, (second, z)


def test_a_link_confirmed_from_one_step_never_pages_on_open():
    tr = IncidentTracker()
    ts = warm(tr)
    onset = ts
    ts += 1.0
    f = link_finding(0.5, [0.5], onset)
    out = tr.step("j", ts, [(f, "nic_congestion", "adjust_pipeline", "", {})])
    assert [e["severity"] for e in out] == ["info"]


def test_a_host_with_its_ranks_window_pages_on_open():
    tr = IncidentTracker()
    ts = warm(tr)
    onset = ts
    ts += 1.3
    assert tr.step("j", ts, []) == []
    ts += 1.3
    logs = [0.0, 0.0, 0.0, 0.0, math.log1p(0.3), math.log1p(0.3)]
    f = Finding(key="slow_host:h3", fault="slow_host", confirmed=True, onset_ts=onset,
                onset_step=10, slowdown_pct=25.0, own_pct=30.0, host="h3", hosts=["h3"],
                evidence={"ranks": [24, 25], "rel_to_peers": 0.3, "rel_to_own_past": 0.29,
                          "mean_excess": round(sum(logs) / 6, 3), "mean_excess_steps": 6})
    out = tr.step("j", ts, [(f, "cpu_contention", ACT, "", {})])
    assert [(e["status"], e["severity"]) for e in out] == [("open", "critical")]
