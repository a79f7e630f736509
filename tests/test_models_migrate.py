"""Old detector snapshots: one mechanism, a version and a migration (``models.migrate``)."""

from __future__ import annotations

import base64
import io
import pickle

import pytest

from failslow.models.migrate import INCIDENT_SLOTS, JOB_FIELDS, STATE_VERSION
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


def test_a_version_7_snapshot_restores_and_goes_on_judging():
    batches = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0).batches())
    cut = len(batches) // 2          # mid-fault: an incident is open
    det = Detector()
    before = [e for b in batches[:cut] for e in det.process_batch(b)]
    open_ids = {e["incident_id"] for e in before} - {
        e["incident_id"] for e in before if e["status"] == "resolved"}
    assert open_ids
    snap = det.state_dict()
    assert snap["version"] == STATE_VERSION
    old = Detector.from_state(_as_version_7(snap))
    after = [e for b in batches[cut:] for e in old.process_batch(b)] + old.flush()
    # the open incident carries on under its id and resolves; every event is explained
    assert {e["incident_id"] for e in after if e["status"] == "resolved"} >= open_ids
    assert all(e["evidence"].get("rule") and e["evidence"].get("policy") for e in after)
    # the current version round-trips unchanged
    again = Detector.from_state(det.state_dict())
    assert again.tracker.policy == det.tracker.policy


def test_an_unknown_version_is_refused():
    with pytest.raises(ValueError, match="unknown detector state version 6"):
        Detector.from_state({"version": 6, "state": "", "queued": []})
