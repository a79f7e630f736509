"""Old detector snapshots, one mechanism: a version and a migration per version.

``Detector.state_dict`` writes ``STATE_VERSION``; ``Detector.from_state`` unpickles the
state, then ``migrate`` brings it from the version it was written at to this one, one
step at a time. A field added to a model is given its default here, once, instead of a
``getattr`` fallback wherever it is read. History: 3 slotted objects pickled natively,
4 queued telemetry, 5 windowed evidence, 6 comm windows per job, 7 sub-step evidence and
p2p pairs per job, 8 the paging policy (issue 30: the tracker holds a ``PolicyConfig``,
incidents count persistence, the detector a ``DetectionConfig``), 9 columnar rank state
(issue 31: a job's ranks are one ``RankTable`` of arrays, not an object per rank), 10 an
incident's longest absence and mean step excess (issue 30: a flapping culprit resolves
past its own gaps, a link once its step excess faded), 11 NIC ports as one table (issue
31: ``models.telemetry.NicTable`` of arrays, not a ``Device`` per port), 12 the episodes
resolved as faded and an incident's mean job slowdown (issue 30: a rule's memory of a
recovered culprit reopens nothing; a culprit the job no longer waits for resolves), 13
a pipeline pair's per-window keys one int (issue 31: ``models.p2p.wkey``, not nested
tuples, in ``P2PMonitor.wrep`` / ``wlast`` and the size classes' ``KeyedValues``), 14 a
job's pipeline pairs as one table (issue 31: ``models.p2p.PairTable`` of arrays, not a
``PairState`` of river statistics per pair; its windows' send/recv entries as columns per
step, ``P2PMonitor.pend_rows``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from failslow.models.comm import CommWindows
from failslow.models.config import JobConfig
from failslow.models.evidence import WaitedFor
from failslow.models.links import GroupTable
from failslow.models.p2p import PairTable, wkey
from failslow.models.peers import KeyedValues
from failslow.models.ranks import EW_STATS, FLOATS, INTS, KIND_CODE, RankTable
from failslow.models.settings import DetectionConfig

STATE_VERSION = 14

# Defaults of fields added to slotted objects during version 7's life.
INCIDENT_SLOTS: dict[str, Callable[[], Any]] = {
    "lost_s": float, "lost_ts": lambda: None, "where": lambda: ([], [], 0.0),
    "recheck": lambda: -1e300, "last_rel": float, "steps": int, "seconds": float,
    "rule": str, "signals": set, "returns": int, "cost_sent": float}
RANK_SLOTS: dict[str, Callable[[], Any]] = {"waited_share": float, "waited_lag": float}
GROUP_SLOTS: dict[str, Callable[[], Any]] = {"run": list, "z": float}
JOB_FIELDS: dict[str, Callable[[], Any]] = {
    "moved": dict, "comm": CommWindows, "nostep_buf": list, "nostep_acc": dict,
    "comm_full": list, "host_firm": dict, "alone": set}


def migrate(state: dict[str, Any], version: Any) -> dict[str, Any]:
    """A detector's unpickled ``__dict__`` as written at ``version``, brought to
    ``STATE_VERSION``; ValueError for a version no migration knows."""
    if version not in STEPS and version != STATE_VERSION:
        raise ValueError(f"unknown detector state version {version!r}")
    while version != STATE_VERSION:
        STEPS[version](state)
        version += 1
    return state


def _slots(obj: Any, defaults: dict[str, Callable[[], Any]]) -> None:
    for name, make in defaults.items():
        if not hasattr(obj, name):
            setattr(obj, name, make())


def _from_7(state: dict[str, Any]) -> None:
    state.setdefault("_p2p", {})
    if "_seen" not in state:              # from before jobs ended
        state["_seen"] = {j: -math.inf for j in state["jobs"]}
    if "config" not in state:
        state["config"] = DetectionConfig.from_mapping({
            "rules": {"min_rel": state["min_rel"], "z_min": state["z_min"],
                      "confirm_steps": state["confirm_steps"]},
            "policy": {"resolve_steps": state["resolve_steps"],
                       "critical_pct": state["critical_pct"]}})
    config = state["config"]
    tr = state["tracker"].__dict__
    for name in ("page_after_steps", "page_after_s", "open_min_pct", "min_update_s",
                 "resolve_steps", "critical_pct"):
        tr.pop(name, None)
    tr.setdefault("policy", config.policy)
    tr.setdefault("policy_for", config.policy_of)
    for name in ("unexplained", "ends", "steady_gap"):
        tr.setdefault(name, {})
    for inc in tr["open"].values():
        _slots(inc, INCIDENT_SLOTS)
        inc.steps = max(inc.steps, inc.age)
    for _, inc in tr["unexplained"].values():
        _slots(inc, INCIDENT_SLOTS)
    fresh = vars(JobConfig())
    for job in state["jobs"].values():
        for name, value in fresh.items():     # thresholds added to the tree since
            job.cfg.__dict__.setdefault(name, value)
        _job(job)
        for st in job.ranks.values():
            _slots(st, RANK_SLOTS)
        for g in job.links.groups.values():
            _slots(g, GROUP_SLOTS)
        for g in job.substep.groups.values():
            if not hasattr(g, "obs"):
                g.obs = []
        if not hasattr(job.evidence, "waited"):
            job.evidence.waited = WaitedFor()
    for p2p in state["_p2p"].values():
        d = p2p.__dict__
        if "wrun" not in d:                # from before the per-window evidence
            p2p._init_windows()
        if "wcls" not in d:                # from before wlast's index by size class
            p2p.wcls = {}
            for k, (cost, cls) in p2p.wlast.items():
                p2p.wcls.setdefault(cls, KeyedValues()).set(k, cost)


def _job(job: Any) -> None:
    d = job.__dict__
    if "progress" not in d:               # every rank then counts as stalled
        d["progress"] = d.pop("newest", -1)
    for name, make in JOB_FIELDS.items():
        d.setdefault(name, make())
    if "substep" not in d:
        job._init_substep()


def _from_8(state: dict[str, Any]) -> None:
    for job in state["jobs"].values():
        job.ranks = rank_table(job.ranks)
        links = job.links.__dict__
        links["table"] = GroupTable.of_groups(links.pop("groups", {}))


def _from_9(state: dict[str, Any]) -> None:
    tracker = state["tracker"]
    for inc in [*tracker.open.values(), *(i for _, i in tracker.unexplained.values())]:
        _slots(inc, {"gap": int, "level": float, "level_n": int})


def rank_table(old: dict[int, Any]) -> RankTable:
    """A job's ranks as version 8 kept them (an object each, river statistics) as one
    ``RankTable``. Every field is carried over; the own-work window, which river keeps
    out of reach, is rebuilt as values with its median and spread (normal quantiles)."""
    t = RankTable()
    rows = t.slots_for(list(old))
    for i, st in zip(rows.tolist(), old.values(), strict=True):
        d = st.__dict__
        for name in (*FLOATS, *INTS):
            if name in d:
                getattr(t, name)[i] = d[name]
        t.imb[i] = bool(d.get("imb", False))
        t.kind[i] = KIND_CODE[d.get("kind")]
        for name in EW_STATS:
            ew = d[name]
            if ew.n:
                getattr(t, f"{name}_m")[i] = ew.mean
                getattr(t, f"{name}_q")[i] = ew.var + ew.mean * ew.mean
                getattr(t, f"{name}_n")[i] = ew.n
        work = d["work"]
        t.work.seed(i, work.n, work.median, work.sigma)
        pending = d.get("pending") or []
        if pending:
            t.pend_n[i] = len(pending)
            if t.pend.shape[1] < len(pending):
                grown = np.zeros((t.pend.shape[0], len(pending), 4))
                grown[:, :t.pend.shape[1]] = t.pend
                t.pend = grown
            t.pend[i, :len(pending)] = pending
    if rows.size:
        t.work.refresh(rows)
    return t


def _from_10(state: dict[str, Any]) -> None:
    store = state["store"]
    old = store.__dict__.pop("nics", None)    # {(host, nic, port): Device}
    if old:
        store.load_nics(old)


def _from_11(state: dict[str, Any]) -> None:
    tracker = state["tracker"]
    tracker.__dict__.setdefault("faded", {})
    for inc in [*tracker.open.values(), *(i for _, i in tracker.unexplained.values())]:
        # an old episode's cost per step unknown: its mean excess alone decides
        _slots(inc, {"cost_level": float})


def _from_12(state: dict[str, Any]) -> None:
    for p2p in state["_p2p"].values():
        # (pair, direction, rank) -> wkey(rank, peer, direction); (pair, direction) ->
        # wkey(*pair, direction), each class's keys in their order (their values' places)
        p2p.wrep = {wkey(r, a + b - r, d): v for ((a, b), d, r), v in p2p.wrep.items()}
        p2p.wlast = {wkey(a, b, d): v for ((a, b), d), v in p2p.wlast.items()}
        for row in p2p.wcls.values():
            row.keys = [wkey(a, b, d) for (a, b), d in row.keys]
            row.slot = {k: i for i, k in enumerate(row.keys)}


def _from_13(state: dict[str, Any]) -> None:
    for p2p in state["_p2p"].values():
        p2p.__dict__.setdefault("pend_rows", {})     # windows' entries as columns, per step
        if "pairs" not in p2p.__dict__:
            continue
        old = p2p.__dict__.pop("pairs")
        table = PairTable(p2p.cfg.p2p.cost_window)
        table.of_pairs(old, [river_window(st.cost) for st in old.values()])
        p2p.table = table


def river_window(m: Any) -> np.ndarray | None:
    """The values in a ``stats.RollingMedian``'s window, oldest first, read from river's
    own state (its Rust quantile's: the window's values sorted, then in the order they came,
    each a count and little-endian doubles); None when that state reads otherwise."""
    try:
        raw = m._median._rolling_quantile.__getstate__()
        word = np.dtype("<f8").itemsize         # the bytes of a count, or of a value
        k = int.from_bytes(raw[:word], "little")
        at = word + word * k
        if int.from_bytes(raw[at:at + word], "little") != k or k > m.window:
            return None
        vals = np.frombuffer(raw, dtype="<f8", count=k, offset=at + word).astype(np.float64)
        ordered = np.frombuffer(raw, dtype="<f8", count=k, offset=word)
        if not np.array_equal(np.sort(vals), ordered) or k != min(m.n, m.window):
            return None
        return vals
    except (AttributeError, TypeError, ValueError):
        return None


STEPS: dict[int, Callable[[dict[str, Any]], None]] = {7: _from_7, 8: _from_8, 9: _from_9,
                                                      10: _from_10, 11: _from_11,
                                                      12: _from_12, 13: _from_13}
