"""Old detector snapshots: one mechanism, a version and a migration (``models.migrate``)."""

from __future__ import annotations

import base64
import gzip
import io
import math
import pickle
from pathlib import Path

import orjson
import pytest

from failslow.models.migrate import INCIDENT_SLOTS, JOB_FIELDS, STATE_VERSION
from failslow.models.p2p import RANK_OFF, PairState, PairTable
from failslow.models.pipeline import Detector, _PackageUnpickler
from failslow.simulator import SCENARIOS, simulate


def _as_version_7(d: dict) -> dict:
    """A snapshot as version 7 wrote it: none of the fields added since (the paging
    policy, incidents' persistence) and none of those version 7 added in its life."""
    state = _PackageUnpickler(io.BytesIO(base64.b64decode(d["state"]))).load()
    for name in ("config", "_p2p", "_seen"):
        state.pop(name)
    tr = state["tracker"]
    for name in ("policy", "policy_for", "steady_gap", "unexplained", "ends"):
        del tr.__dict__[name]
    tr.__dict__.update(resolve_steps=5, critical_pct=20.0, page_after_steps=2)
    for inc in tr.open.values():
        for name in INCIDENT_SLOTS:
            if hasattr(inc, name):
                delattr(inc, name)
    for job in state["jobs"].values():
        for name in (*JOB_FIELDS, "substep"):
            job.__dict__.pop(name, None)
        job.__dict__["newest"] = job.__dict__.pop("progress")
        del job.evidence.waited
        for st in job.ranks.values():
            del st.waited_share
    blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    return {"version": 7, "state": base64.b64encode(blob).decode("ascii"),
            "queued": d["queued"]}


# A detector's snapshot as version 8 wrote it (commit 083fb33, a rank still an object of
# river statistics): `gpu_thermal_30`, seed 0, after the first CUT of its 120 batches,
# mid-fault (an incident is open); with the incident events it had emitted by then.
V8 = Path(__file__).parent / "fixtures" / "detector_state_v8.json.gz"


def _v8() -> tuple[dict, int, list[dict]]:
    d = orjson.loads(gzip.decompress(V8.read_bytes()))
    return d["snapshot"], d["cut"], d["before"]


@pytest.mark.parametrize("version", [7, 8])
def test_an_old_snapshot_restores_and_goes_on_judging(version):
    snap, cut, before = _v8()
    assert snap["version"] == 8
    batches = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0).batches())
    open_ids = {e["incident_id"] for e in before} - {
        e["incident_id"] for e in before if e["status"] == "resolved"}
    assert open_ids
    old = Detector.from_state(_as_version_7(snap) if version == 7 else snap)
    # every rank carried over into the table: its state, and its baselines' values
    legacy = _PackageUnpickler(io.BytesIO(base64.b64decode(snap["state"]))).load()
    (was,) = legacy["jobs"].values()
    (job,) = old.jobs.values()
    assert len(job.ranks) == len(was.ranks) == 16
    for r, st in was.ranks.items():
        now = job.ranks[r]
        assert (now.kind, now.streak, now.cusum) == (st.kind, st.streak, st.cusum)
        assert now.work.n == st.work.n > 0
        assert now.work.median == pytest.approx(st.work.median, rel=1e-12)
        assert now.work.sigma == pytest.approx(st.work.sigma, rel=0.25, abs=1e-9)
        assert now.step.mean == st.step.mean and now.own.var == pytest.approx(st.own.var)
    after = [e for b in batches[cut:] for e in old.process_batch(b)] + old.flush()
    # the open incident carries on under its id and resolves; every event is explained
    assert {e["incident_id"] for e in after if e["status"] == "resolved"} >= open_ids
    assert all(e["evidence"].get("rule") and e["evidence"].get("policy") for e in after)


def test_the_current_version_round_trips_and_judges_alike():
    batches = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0).batches())
    cut = len(batches) // 2
    det, twin = Detector(), Detector()
    for b in batches[:cut]:
        det.process_batch(b)
        twin.process_batch(b)
    snap = det.state_dict()
    assert snap["version"] == STATE_VERSION
    again = Detector.from_state(snap)
    assert again.tracker.policy == det.tracker.policy
    rest = [e for b in batches[cut:] for e in again.process_batch(b)] + again.flush()
    assert rest == [e for b in batches[cut:] for e in twin.process_batch(b)] + twin.flush()


def test_an_unknown_version_is_refused():
    with pytest.raises(ValueError, match="unknown detector state version 6"):
        Detector.from_state({"version": 6, "state": "", "queued": []})


def _as_version_12(snap: dict) -> dict:
    """A snapshot as version 12 wrote it: a pipeline pair's per-window keys nested tuples
    (``P2PMonitor.wrep``: (pair, direction, rank); ``wlast`` and its size classes' keys:
    (pair, direction)), not ``wkey``'s ints."""
    # and its pipeline pairs as version 13 kept them
    state = _PackageUnpickler(io.BytesIO(base64.b64decode(_as_version_13(snap)["state"]))).load()

    def parts(k: int) -> tuple[int, int, int]:
        return (k >> 33) - RANK_OFF, ((k >> 1) & 0xFFFFFFFF) - RANK_OFF, k & 1

    for p2p in state["_p2p"].values():
        wrep = {}
        for k, v in p2p.wrep.items():
            r, peer, d = parts(k)
            wrep[((min(r, peer), max(r, peer)), d, r)] = v
        p2p.wrep = wrep
        p2p.wlast = {((a, b), d): v for (a, b, d), v in
                     ((parts(k), v) for k, v in p2p.wlast.items())}
        for row in p2p.wcls.values():
            row.keys = [((a, b), d) for a, b, d in map(parts, row.keys)]
            row.slot = {k: i for i, k in enumerate(row.keys)}
    blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    return {"version": 12, "state": base64.b64encode(blob).decode("ascii"),
            "queued": snap["queued"]}


def test_version_12_pipeline_pair_windows_restore_and_judge_alike():
    # a slow pipeline link judged from windows inside long steps: cut just before the
    # batch that confirms it (the pairs' per-window reports and its run under way)
    batches = list(simulate(SCENARIOS["p2p_link_pp"], seed=0, grain="comm").batches())
    first = Detector()
    cut = next(i for i, b in enumerate(batches)
               if any(e["evidence"].get("p2p_windows") for e in first.process_batch(b)))
    det, twin = Detector(), Detector()
    for b in batches[:cut]:
        det.process_batch(b)
        twin.process_batch(b)
    (now,) = det._p2p.values()
    assert len(now.wrep) == 192 and len(now.wlast) == 96 and now.wrun
    old = Detector.from_state(_as_version_12(det.state_dict()))
    (p2p,) = old._p2p.values()
    assert p2p.wrep == now.wrep and p2p.wlast == now.wlast
    assert [(r.keys, r.array().tolist()) for r in p2p.wcls.values()] == \
        [(r.keys, r.array().tolist()) for r in now.wcls.values()]
    assert all(type(k) is int for k in [*p2p.wrep, *p2p.wlast])
    rest = [e for b in batches[cut:] for e in old.process_batch(b)] + old.flush()
    assert rest == [e for b in batches[cut:] for e in twin.process_batch(b)] + twin.flush()
    assert any(e["evidence"].get("p2p_windows") for e in rest)


def _as_version_13(snap: dict) -> dict:
    """A snapshot as version 13 wrote it: a job's pipeline pairs each a ``PairState`` of
    river statistics (``P2PMonitor.pairs``), not rows of a ``PairTable``."""
    state = _PackageUnpickler(io.BytesIO(base64.b64decode(snap["state"]))).load()
    for p2p in state["_p2p"].values():
        t = p2p.__dict__.pop("table")
        w = t.cost.window
        pairs = {}
        for p, i in t.row.items():
            st = pairs[p] = PairState(w)
            for name in (*PairTable.FLOATS, *PairTable.INTS, "active"):
                setattr(st, name, getattr(t, name)[i].item())
            n = int(t.cost.n[i])
            k = min(n, w)
            for j in range(k):       # its window, oldest first, as river learned it
                st.cost.update(float(t.cost.win[i, (n - k + j) % w]))
            st.cost.n = n
        p2p.pairs = pairs
        # windows' entries still to judge, added up per pair in ``pending`` as then
        for step, chunks in p2p.__dict__.pop("pend_rows").items():
            per = p2p.pending.setdefault(step, {})
            for chunk in chunks:
                for a, b, c0, c1, sent, n in zip(*(x.tolist() for x in chunk), strict=True):
                    got = per.setdefault((a, b), [math.inf, math.inf, 0.0, 0])
                    got[0], got[1] = min(got[0], c0), min(got[1], c1)
                    got[2] += sent
                    got[3] += n
    blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    return {"version": 13, "state": base64.b64encode(blob).decode("ascii"),
            "queued": snap["queued"]}


def test_version_13_pipeline_pairs_restore_into_the_table_and_judge_alike():
    # a slow pipeline link judged from its steps: cut while its finding runs (a pair
    # active, its baseline and lost time under way)
    batches = list(simulate(SCENARIOS["p2p_link_pp"], seed=0).batches())
    det, twin = Detector(), Detector()
    cut = None
    for i, b in enumerate(batches):
        det.process_batch(b)
        twin.process_batch(b)
        (now,) = det._p2p.values()
        if now.table.active.any():
            cut = i + 1
            break
    assert cut is not None and cut < len(batches) - 5
    t = now.table
    old = Detector.from_state(_as_version_13(det.state_dict()))
    (p2p,) = old._p2p.values()
    assert "pairs" not in p2p.__dict__ and p2p.table.row == t.row and len(t) > 10
    assert p2p.pend_rows == {} and p2p.pending
    k = len(t)
    for name in (*PairTable.FLOATS, *PairTable.INTS, "active"):
        assert getattr(p2p.table, name)[:k].tolist() == getattr(t, name)[:k].tolist(), name
    # the cost windows read back from river's state exactly: the same medians and sigmas
    assert p2p.table.cost.n[:k].tolist() == t.cost.n[:k].tolist()
    assert p2p.table.cost.med[:k].tolist() == t.cost.med[:k].tolist()
    assert p2p.table.cost.sig[:k].tolist() == t.cost.sig[:k].tolist()
    rest = [e for b in batches[cut:] for e in old.process_batch(b)] + old.flush()
    assert rest == [e for b in batches[cut:] for e in twin.process_batch(b)] + twin.flush()
    assert any(e["fault"] == "slow_link" for e in rest)
