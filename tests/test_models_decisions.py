"""Unit tests of the decision models: root cause, mitigation, incident tracker."""

from __future__ import annotations

import pytest

from failslow import schema
from failslow.models.findings import Finding
from failslow.models.incidents import IncidentTracker
from failslow.models.mitigation import Planner
from failslow.models.rootcause import attribute
from failslow.models.telemetry import TelemetryStore


def gpu(host, idx, ts, **kw):
    base = {"v": 1, "kind": "gpu", "ts": ts, "host": host, "gpu": idx, "uuid": f"{host}-{idx}",
            "sm_clock_mhz": 1980.0, "temp_c": 60.0 + idx % 3, "power_w": 600.0,
            "power_limit_w": 700.0, "clocks_event_reasons": 0, "pcie_gen": 5, "pcie_width": 16,
            "pcie_max_gen": 5, "pcie_max_width": 16, "ecc_sbe_total": 0, "ecc_dbe_total": 0,
            "pcie_replay_total": 0, "xid": []}
    base.update(kw)
    return base


def nic(host, idx, ts, k, **rates):
    ev = {"v": 1, "kind": "nic", "ts": ts, "host": host, "nic": f"mlx5_{idx}", "port": 1,
          "tx_bytes_total": 10**9 * k, "rx_bytes_total": 10**9 * k}
    for name in ("rx_pause_total", "tx_pause_total", "cnp_sent_total", "cnp_handled_total",
                 "ecn_marked_total", "xmit_wait_total", "symbol_errors_total", "rx_errors_total",
                 "rx_drops_total", "out_of_sequence_total", "link_downed_total"):
        ev[name] = int(rates.get(name, 1) * k)
    return ev


def store_with(faulty: dict, n_hosts=2, per_host=8, samples=6, nic_fault=None):
    st = TelemetryStore()
    for k in range(samples):
        for h in range(n_hosts):
            for g in range(per_host):
                kw = faulty.get((f"h{h}", g), {})
                if callable(kw):
                    kw = kw(k)
                st.observe_gpu(gpu(f"h{h}", g, 100.0 + k, **kw))
                st.observe_nic(nic(f"h{h}", g, 100.0 + k, k + 1,
                                   **(nic_fault.get((f"h{h}", g), {}) if nic_fault else {})))
            st.observe_host({"v": 1, "kind": "host", "ts": 100.0 + k, "host": f"h{h}",
                             "cpu_util_pct": 30.0, "load1": 40.0, "procs_running": 30})
    return st


HOSTS = {"h0", "h1"}


@pytest.mark.parametrize("fields,cause", [
    ({"clocks_event_reasons": 0x20, "sm_clock_mhz": 1500.0, "temp_c": 90.0}, "gpu_thermal"),
    ({"clocks_event_reasons": 0x04, "sm_clock_mhz": 1600.0, "power_limit_w": 500.0}, "gpu_power"),
    ({"sm_clock_mhz": 1600.0}, "gpu_clock"),
    ({"pcie_width": 4}, "pcie_degraded"),
    ({"xid": [94]}, "gpu_errors"),
    ({}, "unknown"),
])
def test_root_cause_of_a_gpu(fields, cause):
    st = store_with({("h1", 3): fields})
    got, evidence = attribute("slow_rank", st, ["h1"], [("h1", 3)], HOSTS, 0.0)
    assert got == cause
    assert cause == "unknown" or cause in evidence


def test_blips_on_peers_do_not_make_a_cause():
    # A momentary power cap on a different GPU each sample is normal at full load.
    st = store_with({("h0", g): (lambda k, g=g: {"clocks_event_reasons": 0x04} if k == g else {})
                     for g in range(8)})
    assert attribute("slow_rank", st, ["h0"], [("h0", 2)], HOSTS, 0.0)[0] == "unknown"


def test_input_stall_and_cpu_contention():
    st = store_with({})
    assert attribute("slow_rank", st, ["h0"], [("h0", 1)], HOSTS, 0.8)[0] == "input_stall"
    for k in range(4):
        st.observe_host({"v": 1, "kind": "host", "ts": 200.0 + k, "host": "h1",
                         "cpu_util_pct": 100.0, "load1": 250.0, "procs_running": 200})
    gpus = [("h1", g) for g in range(8)]
    assert attribute("slow_host", st, ["h1"], gpus, HOSTS, 0.3)[0] == "cpu_contention"


def test_nic_causes_of_a_link():
    cong = {("h1", g): {"rx_pause_total": 5000, "cnp_sent_total": 9000, "ecn_marked_total": 9000}
            for g in range(8)}
    st = store_with({}, nic_fault=cong)
    assert attribute("slow_link", st, ["h1"], [], HOSTS, 0.0)[0] == "nic_congestion"
    errs = {("h0", 2): {"symbol_errors_total": 900, "rx_errors_total": 300}}
    st = store_with({}, nic_fault=errs)
    got = attribute("slow_link", st, ["h0", "h1"], [], HOSTS, 0.0, {("h0", "mlx5_2")})[0]
    assert got == "nic_errors"


def test_mitigation_ladder_escalates_with_cost():
    p = Planner()
    assert p.plan("job_slowdown", "unknown", 50, 1000, 1.0)[0] == "ignore"
    assert p.plan("slow_rank", "gpu_thermal", 3.0, 1000, 1.0)[0] == "ignore"
    # A confirmed culprit above the floor gets the first action at once, even before
    # it has cost the action's price (a fail-slow outlasts its break-even).
    action, why = p.plan("slow_rank", "gpu_thermal", 30, 1, 1.0, lost_s=0.3)
    assert action == "rebalance_microbatches" and "repaid in 7 steps" in why
    assert p.plan("slow_link", "nic_errors", 30, 10, 1.0)[0] == "adjust_pipeline"
    assert p.plan("slow_rank", "gpu_errors", 30, 60, 1.0)[0] == "rebalance_microbatches"
    assert p.plan("slow_rank", "gpu_errors", 30, 100, 1.0)[0] == "migrate_node"
    assert p.plan("slow_rank", "gpu_errors", 30, 3000, 1.0)[0] == "checkpoint_restart"
    # Congestion is not fixed by another machine: never past the first action.
    action, why = p.plan("slow_link", "nic_congestion", 30, 3000, 1.0)
    assert action == "adjust_pipeline" and "not fixed" in why


def finding(confirmed=True, pct=30.0, fault="slow_rank"):
    return Finding(key="slow_rank:r5", fault=fault, confirmed=confirmed, onset_ts=10.0,
                   onset_step=7, slowdown_pct=pct, own_pct=pct, rank=5, host="h0", gpu=5)


def test_tracker_open_update_resolve_without_flapping():
    tr = IncidentTracker(resolve_steps=3, min_update_s=3.0)
    assert tr.step("j", 11.0, [(finding(confirmed=False), "unknown", "ignore", "", {})]) == []
    act = "rebalance_microbatches"
    opened = tr.step("j", 12.0, [(finding(), "gpu_thermal", act, "why", {})])
    assert [e["status"] for e in opened] == ["open"] and opened[0]["incident_id"] == "j:slow_rank:r5:7"
    assert opened[0]["severity"] == "info"
    schema.validate(opened[0])
    # Still there two steps later: it persisted 4 slowed steps and pages (warning: it has
    # cost little so far; models.policy).
    assert tr.step("j", 13.0, [(finding(), "gpu_thermal", act, "why", {})]) == []
    paged = tr.step("j", 13.5, [(finding(), "gpu_thermal", act, "why", {})])
    assert [e["severity"] for e in paged] == ["warning"]
    assert paged[0]["evidence"]["policy"].startswith("persisted 4 steps")
    # Gone for two steps, back: still the same incident.
    assert tr.step("j", 14.0, []) == [] and tr.step("j", 15.0, []) == []
    assert tr.step("j", 16.0, [(finding(confirmed=False), "gpu_thermal", "ignore", "", {})]) == []
    upd = tr.step("j", 17.0, [(finding(), "gpu_thermal", "migrate_node", "", {})])
    assert upd[0]["mitigation"] == "migrate_node"
    # A weaker recommendation later does not de-escalate.
    assert tr.step("j", 18.0, [(finding(), "gpu_thermal", "ignore", "", {})]) == []
    # It came back once after two steps away (a flap): its longest absence (2) plus
    # flap_steps (2) steps without it resolve it, at least resolve_steps (models.policy).
    out = []
    for t in (19.0, 20.0, 21.0, 22.0, 23.0):
        out += tr.step("j", t, [])
    assert [e["status"] for e in out] == ["resolved"] and out[0]["resolved_ts"] == 22.0
    schema.validate(out[0])


def test_severity_rules():
    # never loud: the whole job, a link no NIC counter explains; else by persistence
    for fault, cause, sev in (("job_slowdown", "unknown", "info"),
                              ("slow_link", "unknown", "info"),
                              ("slow_rank", "unknown", "warning")):
        tr = IncidentTracker()
        out = []
        for k in range(8):
            f = finding(fault=fault)
            f.key = f"{fault}:x"
            out += tr.step("j", 10.0 + k, [(f, cause, "rebalance_microbatches", "", {})])
        assert out[-1]["severity"] == sev, fault


def test_updates_are_rate_limited_but_pages_are_not():
    tr = IncidentTracker(min_update_s=5.0)
    out = []
    for k in range(40):       # a slowdown estimate that swings every step, 0.5 s steps
        pct = 30.0 if k % 2 else 60.0
        out += tr.step("j", 10.0 + 0.5 * k, [(finding(pct=pct), "gpu_thermal",
                                               "rebalance_microbatches", "", {})])
    ts = [e["ts"] for e in out]
    assert out[0]["severity"] == "info" and out[1]["severity"] == "warning"
    assert ts[1] - ts[0] < 5.0                      # the page went out at once
    assert all(b - a >= 5.0 for a, b in zip(ts[1:], ts[2:], strict=False))
    assert len(out) <= 2 + 20 / 5


def test_a_slowdown_the_planner_ignores_never_pages():
    tr = IncidentTracker()
    out = []
    for k in range(10):
        f = finding(pct=4.0)
        f.own_pct = 40.0      # its own work is well above its peers, the job barely slower
        out += tr.step("j", 10.0 + k, [(f, "unknown", "ignore", "", {})])
    assert out and {e["severity"] for e in out} == {"info"}


def test_ignore_never_pages_whatever_the_slowdown():
    # 30 % on the finding, but the mitigation says ignore (a caller's planner, a floor
    # raised): recorded, never a page, on any event.
    tr = IncidentTracker()
    out = []
    for k in range(10):
        out += tr.step("j", 10.0 + k, [(finding(pct=30.0), "unknown", "ignore", "", {})])
    assert out and {e["severity"] for e in out} == {"info"}
    # The planner says the first action as soon as it can: the page is not delayed.
    out = tr.step("j", 20.0, [(finding(pct=30.0), "unknown", "rebalance_microbatches", "", {})])
    assert [e["severity"] for e in out] == ["warning"]


def test_planner_and_tracker_page_a_fresh_fault_at_once_never_with_ignore():
    # A 2x rank confirmed at step 3 of its onset (1 s steps, 50 % slower: 1.5 s lost,
    # less than the 2-step rebalance): it pages once it persisted 4 steps, mitigation set.
    p, tr = Planner(), IncidentTracker()
    out = []
    for k in range(4):
        f = finding(pct=50.0)
        f.lost_s = 0.5 * (k + 3)
        action, why = p.plan("slow_rank", "unknown", 50.0, k + 3.0, 1.0, f.lost_s)
        out += tr.step("j", 13.0 + k, [(f, "unknown", action, why, {})])
    assert [e["severity"] for e in out][:2] == ["info", "warning"]
    # the tracker's first step of the job is 13: 13-16 are its 4 slowed steps
    assert out[1]["ts"] == 16.0
    # every event of every run: loud implies a mitigation other than ignore
    for pct in (2.0, 4.9, 5.0, 12.0, 80.0):
        tr = IncidentTracker()
        for k in range(8):
            f = finding(pct=pct)
            action, why = p.plan("slow_rank", "unknown", pct, k + 1.0, 1.0, 0.1 * k)
            for e in tr.step("j", 13.0 + k, [(f, "unknown", action, why, {})]):
                assert e["severity"] == "info" or e["mitigation"] != "ignore", e


def test_a_slow_link_is_priced_from_elapsed_time():
    tr = IncidentTracker()
    out = []
    for k in range(6):       # onset at 10.0, 25 % slower, seen every second from 12.0
        f = Finding(key="slow_link:r1-r2", fault="slow_link", confirmed=True, onset_ts=10.0,
                    onset_step=7, slowdown_pct=25.0, own_pct=60.0, rank=1, peer_rank=2,
                    evidence={"world_size": 16})
        out += tr.step("j", 12.0 + k, [(f, "nic_errors", "adjust_pipeline", "", {})])
    inc = tr.open[("j", "slow_link:r1-r2")].event
    # 7 s since the onset, a fifth of it extra (1.25 x base: 0.25 / 1.25)
    assert inc["evidence"]["lost_s"] == pytest.approx(1.4)
    assert inc["gpu_hours_lost"] == pytest.approx(16 * 1.4 / 3600, rel=1e-3)
    assert all(e.get("gpu_hours_lost") for e in out)
    lost = [e["gpu_hours_lost"] for e in out]
    assert lost == sorted(lost)


def _culprit(own_s: float, step_s: float, excess_s: float, base_s: float, now_s: float):
    from failslow.models.ranks import RankState

    st = RankState()
    for _ in range(20):            # its usual step and own work, learned clean
        st.observe(1.0, own_s, 0.0, step_s, False)
    st.kind, st.base_job_s, st.excess_s = "change", base_s, excess_s
    st.since_s, st.since_n = 10 * now_s, 10
    return st


def test_slowdown_is_the_jobs_measured_increase_even_in_a_pipeline():
    from failslow.models.attribution import Attribution

    a = Attribution()
    # a pipeline stage (own work 0.025 s of a 0.1 s step) doing 2x: +0.025 s of its own,
    # the job +0.04 s (later micro-batches and stages wait): priced +40 %, not +25 %
    st = _culprit(own_s=0.025, step_s=0.1, excess_s=0.025, base_s=0.1, now_s=0.14)
    assert a.slowdown_pct(st) == pytest.approx(40.0)
    assert a._extra(st, 0.14, 0.025) == pytest.approx(0.04)
    # a data-parallel straggler (own work most of the step): the job's increase is its
    # excess; a job twice slower for other reasons does not bill it more than it can cost
    st = _culprit(own_s=0.16, step_s=0.2, excess_s=0.04, base_s=0.2, now_s=0.4)
    assert a.slowdown_pct(st) == pytest.approx(100.0 * 0.04 * 1.25 / 0.2)
    st = _culprit(own_s=0.16, step_s=0.2, excess_s=0.04, base_s=0.2, now_s=0.23)
    assert a.slowdown_pct(st) == pytest.approx(15.0)


def test_late_telemetry_explains_an_incident_resolved_before_it_came():
    tr = IncidentTracker(resolve_steps=2)
    out = []
    for k in range(4):
        f = finding()
        f.hosts, f.gpus = ["h1"], [("h1", 3)]
        out += tr.step("j", 10.0 + k, [(f, "unknown", "rebalance_microbatches", "", {})])
    out += tr.step("j", 14.0, []) + tr.step("j", 15.0, [])
    resolved = out[-1]
    assert resolved["status"] == "resolved" and resolved["root_cause"] == "unknown"
    sent = dict(resolved)
    # the culprit's samples arrive now, behind the steps: thermal throttling on h1:3
    st = store_with({("h1", 3): {"clocks_event_reasons": 0x20, "sm_clock_mhz": 1500.0,
                                 "temp_c": 90.0}})
    upd = tr.late_sample("h1", 12.0, 60.0, st, lambda job: HOSTS)
    assert [(e["status"], e["root_cause"], e["ts"]) for e in upd] == \
        [("resolved", "gpu_thermal", 60.0)]
    assert upd[0]["evidence"]["root_cause_from"] == "late telemetry"
    assert resolved == sent                       # what was sent is not rewritten
    assert tr.late_sample("h1", 13.0, 61.0, st, lambda job: HOSTS) == []   # once
    assert not tr.late_pending()
