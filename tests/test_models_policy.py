"""The paging policy (``models.policy``) and the arbiter (``models.incidents``): loud only
once a slowdown persisted, critical only once it cost enough, steady imbalance stays
info, prompt resolve, one incident per culprit, every decision explained."""

from __future__ import annotations

import pytest

from failslow.alerting.router import Policy, Router
from failslow.models.findings import Finding
from failslow.models.incidents import IncidentTracker
from failslow.models.policy import PolicyConfig

ACT = "rebalance_microbatches"


def rank(rel: float = 0.5, confirmed: bool = True, lost_s: float | None = None,
         world: int = 16, rule: str = "step-peers", onset_ts: float = 9.5, **kw) -> Finding:
    return Finding(key="slow_rank:r5", fault="slow_rank", confirmed=confirmed, onset_ts=onset_ts,
                   onset_step=9, slowdown_pct=100.0 * rel, own_pct=100.0 * rel, rank=5,
                   host="h0", lost_s=lost_s, world=world, rule=rule,
                   evidence={"rel_to_peers": rel, **kw})


def imbalance(rel: float) -> Finding:
    return Finding(key="imbalance:r5", fault="slow_rank", confirmed=True, onset_ts=0.5,
                   onset_step=0, slowdown_pct=100.0 * rel, own_pct=100.0 * rel, rank=5,
                   host="h0", imbalance=True, rule="imbalance",
                   evidence={"imbalance": True, "rel_to_peers": rel})


def run(tr: IncidentTracker, steps: list[Finding | None], t0: float = 10.0,
        period: float = 1.0) -> list[dict]:
    out: list[dict] = []
    for k, f in enumerate(steps):
        found = [(f, "gpu_thermal", ACT, "", {})] if f is not None else []
        out += tr.step("j", t0 + period * k, found)
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("rel", [0.5, 1.0, 2.0])
def test_a_transient_of_up_to_three_slowed_steps_never_pages(n, rel):
    tr = IncidentTracker()
    run(tr, [None] * 6)                                    # the job's period: 1 s
    # confirmed on its first slowed step (a rule can be that quick): onset 15.1, step end 16
    out = run(tr, [rank(rel, onset_ts=15.1)] * n + [rank(0.0, confirmed=False)] * 12, t0=16.0)
    assert out and {e["severity"] for e in out} == {"info"}
    assert out[-1]["status"] == "resolved"


def test_a_slowdown_that_persists_pages_with_its_rule_and_policy():
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [rank(0.3)] * 6, t0=16.0)
    loud = [e for e in out if e["severity"] != "info"]
    assert loud and loud[0]["severity"] == "warning"
    assert loud[0]["evidence"]["rule"] == "step-peers"
    assert loud[0]["evidence"]["policy"].startswith("persisted 4 steps")
    assert loud[0]["evidence"]["policy"].endswith("-> warning")


def test_critical_needs_cost_lost_gpu_hours_or_rate_times_duration():
    # a big job loses a GPU-hour in a few steps: critical on its page
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [rank(0.3, lost_s=0.3 * (k + 1), world=4096) for k in range(5)], t0=16.0)
    assert [e["severity"] for e in out if e["severity"] != "info"][0] == "critical"
    assert "GPU-h lost >= 0.5 -> critical" in out[-1]["evidence"]["policy"]
    # a small job 30 % slower: warning, critical once it lasted critical_after_s
    tr = IncidentTracker(critical_after_s=10.0)
    run(tr, [None] * 6)
    out = run(tr, [rank(0.3, lost_s=0.01)] * 14, t0=16.0)
    sev = [e["severity"] for e in out]
    assert sev.index("warning") < sev.index("critical")
    # a 2x slowdown that cost a second or two never is
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [rank(1.0, lost_s=1.7)] * 6, t0=16.0)
    assert "critical" not in {e["severity"] for e in out}


def test_very_short_steps_need_seconds_not_only_steps():
    # 50 ms steps: 8 slowed steps are 0.4 s, under page_min_s: info
    tr = IncidentTracker()
    run(tr, [None] * 6, period=0.05)
    out = run(tr, [rank(1.0)] * 8 + [None] * 12, t0=10.3, period=0.05)
    assert out and {e["severity"] for e in out} == {"info"}


def test_long_steps_page_on_sustained_in_step_evidence():
    tr = IncidentTracker()
    run(tr, [None] * 6, period=8.0)
    out = run(tr, [rank(0.4, sustained_s=3.5)], t0=56.0, period=8.0)
    assert out[0]["severity"] == "warning"
    assert out[0]["evidence"]["policy"].startswith("sustained 3.5 s in-step")
    tr = IncidentTracker()
    run(tr, [None] * 6, period=8.0)
    assert run(tr, [rank(0.4, sustained_s=1.5)], t0=56.0, period=8.0)[0]["severity"] == "info"


def test_steady_imbalance_and_a_later_verdict_on_the_same_rank_are_one_info_incident():
    tr = IncidentTracker()
    run(tr, [None] * 3)
    steps: list = [[imbalance(0.5)]] * 30 + [[imbalance(0.5), rank(0.5, rule="substep-windows")]] * 20
    out = []
    for k, fs in enumerate(steps):
        out += tr.step("j", 13.0 + k, [(f, "unknown", ACT, "", {}) for f in fs])
    assert len({e["incident_id"] for e in out}) == 1
    assert {e["severity"] for e in out} == {"info"}
    now = tr.open[("j", "slow_rank:r5")].event["evidence"]
    assert set(now["signals"]) == {"imbalance", "substep-windows"}
    assert "steady imbalance" in now["policy"]
    # its gap grows past the margin (50 % -> 80 %: x1.5 and +10 points): it pages
    more = []
    for k in range(6):
        fs = [imbalance(0.5), rank(0.8)]
        more += tr.step("j", 63.0 + k, [(f, "unknown", ACT, "", {}) for f in fs])
    assert {e["incident_id"] for e in more} == {out[0]["incident_id"]}
    assert more[-1]["severity"] == "warning" and "imbalance grew" in more[-1]["evidence"]["policy"]


def test_resolves_promptly_once_back_even_while_a_rule_still_reports_it():
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [rank(0.5)] * 20, t0=16.0)
    assert out[-1]["severity"] != "info"
    # back among its peers (its windowed evidence still confirms it: a rule's memory)
    after = run(tr, [rank(0.01)] * 12, t0=36.0)
    resolved = [e for e in after if e["status"] == "resolved"]
    assert resolved and resolved[0]["ts"] - 36.0 <= 10
    assert all(e["severity"] == out[-1]["severity"] for e in after)


def test_a_flapping_culprit_is_one_incident():
    tr = IncidentTracker()
    run(tr, [None] * 6)
    flap = ([rank(0.5)] * 4 + [rank(0.0, confirmed=False)] * 4) * 6
    out = run(tr, flap + [None] * 12, t0=16.0)
    assert len({e["incident_id"] for e in out}) == 1
    assert [e["status"] for e in out].count("resolved") == 1


def test_a_flapping_culprit_resolves_past_its_own_gaps_not_a_fixed_wait():
    """Its resolve waits for the longest absence it came back after plus ``flap_steps``
    (4 + 2 here), not ``flap_steps`` per return up to ``resolve_max_steps`` (8)."""
    tr = IncidentTracker()
    run(tr, [None] * 6)
    flap = ([rank(0.5)] * 4 + [rank(0.0, confirmed=False)] * 4) * 5 + [rank(0.5)] * 4
    out = run(tr, flap + [rank(0.0, confirmed=False)] * 12, t0=16.0)
    assert len({e["incident_id"] for e in out}) == 1
    resolved = [e for e in out if e["status"] == "resolved"]
    last_slowed = 16.0 + len(flap) - 1
    assert len(resolved) == 1 and resolved[0]["ts"] - last_slowed == 6


def link(own: float, step_z: float | None, step_rel: float | None = None,
         job_pct: float = 8.0) -> Finding:
    """A slow_link finding of a rule whose memory reads ``own`` (its smoothed excess) and
    whose score of this very step is ``step_z`` sigmas and ``step_rel``; the job is
    ``job_pct`` slower for it."""
    return Finding(key="slow_link:h0", fault="slow_link", confirmed=True, onset_ts=9.5,
                   onset_step=9, slowdown_pct=job_pct, own_pct=100.0 * own, host="h0",
                   peer_host="h1", rule="p2p-steps", step_z=step_z,
                   step_rel=own if step_rel is None else step_rel,
                   evidence={"transfer_rel_slowdown": own})


@pytest.mark.parametrize("faded", [True, False])
def test_a_link_back_at_its_peers_resolves_while_its_rule_still_remembers_it(faded):
    """A confirmation's memory (a CUSUM still above its bar, a smoothed excess) outlasts
    the fault; a step whose own score is under ``present_z`` and whose excess is a small
    share (``fade_ratio``) of the incident's usual one counts toward resolving."""
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [link(0.8, 20.0)] * 10, t0=16.0)
    assert out[-1]["status"] == "open"
    # the rule still remembers 60 %; this step: 5 % at 2 sigmas (faded) or 20 sigmas
    after = run(tr, [link(0.6, 2.0 if faded else 20.0, 0.05)] * 8, t0=26.0)
    resolved = [e for e in after if e["status"] == "resolved"]
    if faded:
        assert resolved and resolved[0]["ts"] - 26.0 == PolicyConfig().resolve_steps - 1
    else:
        assert not resolved


def test_a_marginal_link_near_its_own_level_is_not_fading():
    """A link 10 % slow at 2-3 sigmas a step (confirmed by its CUSUM over steps) is as
    weak in every step as a big link's residue: it stays one open incident, since its
    steps stay near the incident's own level."""
    tr = IncidentTracker()
    run(tr, [None] * 6)
    steps = [link(0.1, 2.5, rel) for rel in (0.12, 0.08, 0.1, 0.11, 0.07) * 8]
    out = run(tr, steps, t0=16.0)
    assert out and len({e["incident_id"] for e in out}) == 1
    assert all(e["status"] == "open" for e in out)


@pytest.mark.parametrize("level,noise,resolves", [(0.26, (0.054, 0.03, 0.052, 0.022), True),
                                                  (0.07, (0.054, 0.08, 0.06, 0.075), False)])
def test_a_rank_back_within_noise_of_its_peers_resolves(level, noise, resolves):
    """A rank 26 % slow for 10 steps, then 2-5 % from its peers (their noise; its rule,
    with no score of the step, still confirms it): those steps are a small share
    (``fade_ratio``) of the episode's and count toward resolving. A marginal rank 7 %
    slow, whose steps stay near that level, stays open."""
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [rank(level)] * 10, t0=16.0)
    assert out[-1]["status"] == "open"
    after = run(tr, [rank(r) for r in noise * 3], t0=26.0)
    resolved = [e for e in after if e["status"] == "resolved"]
    if resolves:
        assert resolved and resolved[0]["ts"] - 26.0 == PolicyConfig().resolve_steps - 1
        assert len({e["incident_id"] for e in out + after}) == 1   # and nothing reopens
    else:
        assert not resolved


def test_a_link_the_job_no_longer_waits_for_resolves():
    """Its transfers still stand out now and then (20 sigmas, half their old excess), but
    the job is 0.8 % slower for it, a small share of the 8 % the episode cost per step."""
    tr = IncidentTracker()
    run(tr, [None] * 6)
    run(tr, [link(0.8, 20.0)] * 10, t0=16.0)
    after = run(tr, [link(0.6, 20.0, 0.4, job_pct=0.8)] * 8, t0=26.0)
    resolved = [e for e in after if e["status"] == "resolved"]
    assert resolved and resolved[0]["ts"] - 26.0 == PolicyConfig().resolve_steps - 1
    assert len({e["incident_id"] for e in after}) == 1


def test_a_rule_remembering_a_resolved_episode_reopens_only_on_a_return():
    """After an incident resolved as faded, a finding whose onset is before that resolve
    is its rule's memory of the episode: noise about the culprit opens nothing, a return
    to a sizeable share of the episode's excess opens a new incident, and so does a new
    episode (an onset after the resolve)."""
    tr = IncidentTracker()
    run(tr, [None] * 6)
    run(tr, [rank(0.26)] * 10, t0=16.0)
    out = run(tr, [rank(0.01)] * 6, t0=26.0)
    assert [e["status"] for e in out][-1] == "resolved"
    assert run(tr, [rank(0.054)] * 3, t0=32.0) == []
    again = run(tr, [rank(0.3)], t0=35.0)
    assert again and again[0]["status"] == "open" and again[0]["incident_id"].endswith(".1")
    tr2 = IncidentTracker()
    run(tr2, [None] * 6)
    run(tr2, [rank(0.26)] * 10 + [rank(0.01)] * 6, t0=16.0)
    new = run(tr2, [rank(0.06, onset_ts=32.5)], t0=33.0)
    assert new and new[0]["status"] == "open"


def test_the_cost_lost_so_far_never_shrinks_whichever_rule_prices_it():
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [rank(0.3, lost_s=60.0 * (k + 1)) for k in range(8)]
              + [rank(0.3, lost_s=30.0, rule="step-own-past")] * 8, t0=16.0)
    lost = [e["gpu_hours_lost"] for e in out]
    assert lost == sorted(lost) and lost[-1] == round(16 * 480.0 / 3600.0, 6)


def test_cost_stays_current_with_bounded_updates_that_never_page_again():
    tr = IncidentTracker()
    run(tr, [None] * 6)
    out = run(tr, [rank(0.3, lost_s=0.2 * (k + 1)) for k in range(120)], t0=16.0)
    lost = [e["gpu_hours_lost"] for e in out]
    assert lost == sorted(lost) and lost[-1] >= 0.8 * 16 * 0.2 * 120 / 3600
    assert len(out) <= 20                       # ~log(120) cost updates, not 120
    router = Router(Policy(), enabled=["slack", "pagerduty"])
    notes = [n for e in out for n in router.decide(e, now=e["ts"])]
    sevs = [e["severity"] for e in out]
    # one notification per destination per severity rise, none for the cost updates
    assert len(notes) <= len(set(sevs)) * 2


def test_policy_config_rejects_what_cannot_work():
    with pytest.raises(ValueError, match="page_steps"):
        PolicyConfig(page_steps=0).check()
    with pytest.raises(ValueError, match="resolve_max_steps"):
        PolicyConfig(resolve_steps=12).check()


def _incidents(name: str, seed: int = 0) -> list[dict]:
    from failslow.models.pipeline import Detector
    from failslow.simulator import SCENARIOS, simulate

    det = Detector()
    out: list[dict] = []
    for chunk in simulate(SCENARIOS[name], seed=seed).batches():
        out.extend(det.process_batch(chunk))
    return out + det.flush()


def test_end_to_end_every_page_is_explained_and_a_link_names_both_ends():
    incs = _incidents("slow_link_host_50")
    links = [e for e in incs if e["fault"] == "slow_link"]
    assert links and all(e.get("host") and e.get("peer_host") for e in links)
    assert all(e["host"] != e["peer_host"] for e in links)
    thermal = _incidents("gpu_thermal_30")
    for e in incs + thermal:
        if e["severity"] != "info":
            assert e["evidence"]["rule"] and e["evidence"]["policy"], e
    first = next(e for e in thermal if e.get("rank") == 5 and e["severity"] != "info")
    # paged on its fourth slowed step or so: onset at 30 s, 1 s steps (1.3 s slowed)
    assert first["ts"] - first["onset_ts"] < 8.0
    benign = _incidents("healthy_hybrid_64", 2)
    assert {i["severity"] for i in benign} <= {"info"}
