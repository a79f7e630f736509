"""Event kinds of CONTRACT.md v1 as typed records, and their validation.

Events travel as plain dicts (that is what orjson gives and what the hot paths
want); the ``TypedDict`` classes below are their static types, and ``SPECS``
is the single table the validator reads (tests/test_schema_types.py keeps the two in
agreement: same fields, required-ness and types). Fields may be added to the contract,
never renamed or re-typed: unknown extra fields are kept, not rejected.

>>> validate({"v": 1, "kind": "host", "ts": 1.5, "host": "h0"})["host"]
'h0'
"""

from __future__ import annotations

import math
from typing import Any, Literal, NotRequired, TypedDict

from failslow.schema.errors import FailslowError

VERSION = 1
# The ranges of the ClickHouse columns the fields land in (storage/migrations.py), so
# that every consumer (worker, sink, detect) accepts exactly the same events:
# "int" -> Int64, "i32" (ranks, indexes, sizes) -> Int32, "time" -> DateTime64 seconds.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
TIME_MIN, TIME_MAX = 0.0, 1.0e10       # 1970 .. 2286


class SchemaError(FailslowError):
    """An event does not match CONTRACT.md v1; the message names the field."""


# Field types: "str", "int" (64-bit), "i32" (32-bit integer), "num" (int or float,
# finite), "time" (a number of epoch seconds in TIME_MIN..TIME_MAX), "bool" (true or
# false), "ints" (list of int), "nums" (list of finite numbers), "obj" (JSON object),
# "ops" (a list of at most OPS_MAX
# objects of the NESTED spec "ops", each checked field by field like an event), or a
# tuple of allowed strings (an enum).
FieldType = str | tuple[str, ...]
Spec = tuple[dict[str, FieldType], dict[str, FieldType]]

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall",
       "barrier", "send", "recv")
FAULTS = ("slow_rank", "slow_link", "slow_host", "job_slowdown")
SEVERITIES = ("info", "warning", "critical")          # in order: an update may only raise it
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}  # severity -> its place in that order
STATUSES = ("open", "resolved")
ROOT_CAUSES = ("gpu_thermal", "gpu_power", "gpu_clock", "pcie_degraded", "gpu_errors",
               "nic_congestion", "nic_errors", "cpu_contention", "input_stall", "unknown")
# What the mitigation planner may ask a job to do (``action`` events, issue 32), and how.
ACTION_TYPES = ("rebalance_microbatches", "drain_host")
ACTION_MODES = ("dry_run", "apply")
# The escalation ladder, cheapest first (FALCON's S1-S4 plus migration): an open
# incident's mitigation only climbs it.
MITIGATIONS = ("ignore", "rebalance_microbatches", "adjust_pipeline", "migrate_node",
               "checkpoint_restart")

# kind -> (required fields, optional fields); "v" and "kind" are checked apart.
SPECS: dict[str, tuple[dict[str, FieldType], dict[str, FieldType]]] = {
    "step": (
        {"ts": "time", "job_id": "str", "rank": "i32", "world_size": "i32", "host": "str",
         "step": "int", "duration_s": "num"},
        {"gpu": "i32", "compute_s": "num", "comm_s": "num", "data_s": "num", "tokens": "int",
         "dp_rank": "i32", "pp_rank": "i32", "tp_rank": "i32", "samples": "int"},
    ),
    "collective": (
        {"ts": "time", "job_id": "str", "rank": "i32", "host": "str", "group": "str",
         "group_size": "i32", "op": OPS, "seq": "int", "start_ts": "time", "duration_s": "num",
         "bytes": "int"},
        {"step": "int", "peer": "i32", "gpu": "i32"},
    ),
    "comm": (
        {"ts": "time", "job_id": "str", "rank": "i32", "host": "str", "window_start_ts": "time",
         "ops": "ops"},
        {"step": "int", "step_end": "bool", "world_size": "i32", "gpu": "i32"},
    ),
    "gpu": (
        {"ts": "time", "host": "str", "gpu": "i32", "uuid": "str"},
        {"sm_clock_mhz": "num", "max_sm_clock_mhz": "num", "mem_clock_mhz": "num",
         "util_pct": "num", "mem_util_pct": "num", "power_w": "num", "power_limit_w": "num",
         "temp_c": "num", "clocks_event_reasons": "int", "pcie_gen": "i32", "pcie_width": "i32",
         "pcie_max_gen": "i32", "pcie_max_width": "i32", "pcie_tx_bytes_s": "num",
         "pcie_rx_bytes_s": "num", "pcie_replay_total": "int", "ecc_sbe_total": "int",
         "ecc_dbe_total": "int", "xid": "ints", "nvlink_crc_errors_total": "int",
         "mem_used_bytes": "int", "job_id": "str", "rank": "i32"},
    ),
    "nic": (
        {"ts": "time", "host": "str", "nic": "str", "port": "i32", "tx_bytes_total": "int",
         "rx_bytes_total": "int"},
        {"state": ("up", "down"), "speed_gbps": "num", "tx_packets_total": "int",
         "rx_packets_total": "int", "rx_errors_total": "int", "tx_errors_total": "int",
         "rx_drops_total": "int", "tx_pause_total": "int", "rx_pause_total": "int",
         "cnp_sent_total": "int", "cnp_handled_total": "int", "ecn_marked_total": "int",
         "out_of_sequence_total": "int", "link_downed_total": "int",
         "symbol_errors_total": "int", "xmit_wait_total": "int"},
    ),
    "host": (
        {"ts": "time", "host": "str"},
        {"cpu_util_pct": "num", "cpu_iowait_pct": "num", "cpu_steal_pct": "num",
         "load1": "num", "mem_available_bytes": "int", "procs_running": "i32"},
    ),
    "incident": (
        {"ts": "time", "incident_id": "str", "job_id": "str", "status": STATUSES,
         "fault": FAULTS, "severity": SEVERITIES, "onset_ts": "time", "detected_ts": "time",
         "slowdown_pct": "num"},
        {"rank": "i32", "host": "str", "gpu": "i32", "peer_rank": "i32", "peer_host": "str",
         "resolved_ts": "time", "root_cause": ROOT_CAUSES, "mitigation": MITIGATIONS,
         "evidence": "obj", "gpu_hours_lost": "num"},
    ),
    "action": (
        {"ts": "time", "action_id": "str", "job_id": "str", "incident_id": "str",
         "type": ACTION_TYPES, "mode": ACTION_MODES, "apply_at_step": "int",
         "expires_ts": "time", "shares": "nums", "reason": "str"},
        {"version": "int", "rank": "i32", "host": "str", "rollback": "bool",
         "step_s_before": "num"},
    ),
}
KINDS: tuple[str, ...] = tuple(SPECS)

# One comm record holds one entry per (group, op, peer) of one rank's window: a few
# dozen on the largest layouts. The bound keeps one record far below a Kafka message.
OPS_MAX = 1024
# Specs of the objects inside list fields, by field type: the entries of comm.ops.
NESTED: dict[str, Spec] = {
    "ops": (
        {"group": "str", "group_size": "i32", "op": OPS, "n": "int", "blocked_s": "num",
         "min_s": "num", "max_s": "num", "bytes": "int"},
        {"peer": "i32", "first_seq": "int", "last_seq": "int", "first_start_ts": "time"},
    ),
}
# Sanity beyond types, per kind or nested spec: fields with a lower bound, and
# (low, high) pairs that must hold low <= high when both are present.
MINIMA: dict[str, dict[str, int]] = {"ops": {"n": 1, "blocked_s": 0, "min_s": 0, "bytes": 0}}
ORDERED: dict[str, tuple[tuple[str, str], ...]] = {
    "comm": (("window_start_ts", "ts"),),
    "ops": (("min_s", "max_s"), ("first_seq", "last_seq")),
}


class _Base(TypedDict):
    v: int
    kind: str
    ts: float


class StepEvent(_Base):
    job_id: str
    rank: int
    world_size: int
    host: str
    step: int
    duration_s: float
    gpu: NotRequired[int | None]
    compute_s: NotRequired[float | None]
    comm_s: NotRequired[float | None]
    data_s: NotRequired[float | None]
    tokens: NotRequired[int | None]
    dp_rank: NotRequired[int | None]
    pp_rank: NotRequired[int | None]
    tp_rank: NotRequired[int | None]
    samples: NotRequired[int | None]


class CollectiveEvent(_Base):
    job_id: str
    rank: int
    host: str
    group: str
    group_size: int
    op: str
    seq: int
    start_ts: float
    duration_s: float
    bytes: int
    step: NotRequired[int | None]
    peer: NotRequired[int | None]
    gpu: NotRequired[int | None]


class CommOp(TypedDict):
    """One entry of ``CommEvent.ops``: the ops of one (group, op, peer) that ended in
    the window."""

    group: str
    group_size: int
    op: str
    n: int
    blocked_s: float
    min_s: float
    max_s: float
    bytes: int
    peer: NotRequired[int | None]
    first_seq: NotRequired[int | None]
    last_seq: NotRequired[int | None]
    first_start_ts: NotRequired[float | None]


class CommEvent(_Base):
    job_id: str
    rank: int
    host: str
    window_start_ts: float
    ops: list[CommOp]
    step: NotRequired[int | None]
    step_end: NotRequired[bool | None]
    world_size: NotRequired[int | None]
    gpu: NotRequired[int | None]


class GpuEvent(_Base):
    host: str
    gpu: int
    uuid: str
    sm_clock_mhz: NotRequired[float | None]
    max_sm_clock_mhz: NotRequired[float | None]
    mem_clock_mhz: NotRequired[float | None]
    util_pct: NotRequired[float | None]
    mem_util_pct: NotRequired[float | None]
    power_w: NotRequired[float | None]
    power_limit_w: NotRequired[float | None]
    temp_c: NotRequired[float | None]
    clocks_event_reasons: NotRequired[int | None]
    pcie_gen: NotRequired[int | None]
    pcie_width: NotRequired[int | None]
    pcie_max_gen: NotRequired[int | None]
    pcie_max_width: NotRequired[int | None]
    pcie_tx_bytes_s: NotRequired[float | None]
    pcie_rx_bytes_s: NotRequired[float | None]
    pcie_replay_total: NotRequired[int | None]
    ecc_sbe_total: NotRequired[int | None]
    ecc_dbe_total: NotRequired[int | None]
    xid: NotRequired[list[int] | None]
    nvlink_crc_errors_total: NotRequired[int | None]
    mem_used_bytes: NotRequired[int | None]
    job_id: NotRequired[str | None]
    rank: NotRequired[int | None]


class NicEvent(_Base):
    host: str
    nic: str
    port: int
    tx_bytes_total: int
    rx_bytes_total: int
    state: NotRequired[Literal["up", "down"] | None]
    speed_gbps: NotRequired[float | None]
    tx_packets_total: NotRequired[int | None]
    rx_packets_total: NotRequired[int | None]
    rx_errors_total: NotRequired[int | None]
    tx_errors_total: NotRequired[int | None]
    rx_drops_total: NotRequired[int | None]
    tx_pause_total: NotRequired[int | None]
    rx_pause_total: NotRequired[int | None]
    cnp_sent_total: NotRequired[int | None]
    cnp_handled_total: NotRequired[int | None]
    ecn_marked_total: NotRequired[int | None]
    out_of_sequence_total: NotRequired[int | None]
    link_downed_total: NotRequired[int | None]
    symbol_errors_total: NotRequired[int | None]
    xmit_wait_total: NotRequired[int | None]


class HostEvent(_Base):
    host: str
    cpu_util_pct: NotRequired[float | None]
    cpu_iowait_pct: NotRequired[float | None]
    cpu_steal_pct: NotRequired[float | None]
    load1: NotRequired[float | None]
    mem_available_bytes: NotRequired[int | None]
    procs_running: NotRequired[int | None]


class IncidentEvent(_Base):
    incident_id: str
    job_id: str
    status: str
    fault: str
    severity: str
    onset_ts: float
    detected_ts: float
    slowdown_pct: float
    rank: NotRequired[int | None]
    host: NotRequired[str | None]
    gpu: NotRequired[int | None]
    peer_rank: NotRequired[int | None]
    peer_host: NotRequired[str | None]
    resolved_ts: NotRequired[float | None]
    root_cause: NotRequired[str | None]
    mitigation: NotRequired[str | None]
    evidence: NotRequired[dict[str, Any] | None]
    gpu_hours_lost: NotRequired[float | None]


class ActionEvent(_Base):
    action_id: str
    job_id: str
    incident_id: str
    type: str
    mode: str
    apply_at_step: int
    expires_ts: float
    shares: list[float]
    reason: str
    version: NotRequired[int | None]
    rank: NotRequired[int | None]
    host: NotRequired[str | None]
    rollback: NotRequired[bool | None]
    step_s_before: NotRequired[float | None]


Event = (StepEvent | CollectiveEvent | CommEvent | GpuEvent | NicEvent | HostEvent
         | IncidentEvent | ActionEvent)


def _type_error(kind: str, name: str, want: str, value: Any) -> SchemaError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return SchemaError(f"{kind}.{name}: expected {want}, got {type(value).__name__} {shown}")


def _check_range(kind: str, name: str, value: int, bits: int = 64) -> None:
    lo, hi = (INT_MIN, INT_MAX) if bits == 64 else (I32_MIN, I32_MAX)
    if not lo <= value <= hi:
        raise SchemaError(f"{kind}.{name}: integer {value} is outside the {bits}-bit range")


def _check(kind: str, name: str, ftype: FieldType, value: Any) -> None:
    # bool is an int subclass in Python but never a valid number on the wire.
    if ftype == "num":
        if type(value) is float:
            if not math.isfinite(value):
                raise SchemaError(f"{kind}.{name}: non-finite number {value!r}")
            return
        if type(value) is int:
            _check_range(kind, name, value)
            return
        raise _type_error(kind, name, "a number", value)
    if ftype == "time":
        if type(value) is not float and type(value) is not int:
            raise _type_error(kind, name, "epoch seconds", value)
        if not TIME_MIN <= value < TIME_MAX:  # NaN fails this too
            raise SchemaError(f"{kind}.{name}: {value!r} is not a time between 1970 and 2286")
        return
    if ftype == "int" or ftype == "i32":
        if type(value) is not int:
            raise _type_error(kind, name, "an integer", value)
        _check_range(kind, name, value, 64 if ftype == "int" else 32)
    elif ftype == "str":
        if type(value) is not str:
            raise _type_error(kind, name, "a string", value)
    elif ftype == "ints":
        if type(value) is not list or any(type(x) is not int for x in value):
            raise _type_error(kind, name, "a list of integers", value)
        for x in value:
            _check_range(kind, name, x)
    elif ftype == "nums":
        if type(value) is not list:
            raise _type_error(kind, name, "a list of numbers", value)
        for x in value:
            _check(kind, name, "num", x)
    elif ftype == "obj":
        if type(value) is not dict:
            raise _type_error(kind, name, "an object", value)
    elif ftype == "bool":
        if type(value) is not bool:
            raise _type_error(kind, name, "true or false", value)
    elif ftype in NESTED:
        if type(value) is not list:
            raise _type_error(kind, name, "a list of objects", value)
        if len(value) > OPS_MAX:
            raise SchemaError(f"{kind}.{name}: {len(value)} entries, at most {OPS_MAX}")
        for i, item in enumerate(value):
            where = f"{kind}.{name}[{i}]"
            if type(item) is not dict:
                raise SchemaError(f"{where}: expected an object, got {type(item).__name__}")
            _check_fields(where, ftype, NESTED[ftype], item)
    elif value not in ftype:
        raise SchemaError(f"{kind}.{name}: {value!r} is not one of {', '.join(ftype)}")


def validate(obj: Any) -> Any:
    """Check one decoded event against CONTRACT.md v1 and return it unchanged.

    Raises SchemaError naming the first offending field. Extra fields are allowed.
    """
    if type(obj) is not dict:
        raise SchemaError(f"event: expected a JSON object, got {type(obj).__name__}")
    v = obj.get("v")
    if v != VERSION or type(v) is not int:
        raise SchemaError(f"event.v: unknown version {v!r} (this reader knows v=1)")
    kind = obj.get("kind")
    spec = SPECS.get(kind) if isinstance(kind, str) else None
    if spec is None or not isinstance(kind, str):
        raise SchemaError(f"event.kind: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    _check_fields(kind, kind, spec, obj)
    return obj


def _check_fields(where: str, rules: str, spec: Spec, obj: dict[str, Any]) -> None:
    """Check the fields of ``obj`` (an event, or an entry of a list field) against
    ``spec`` and the MINIMA/ORDERED rules named ``rules``; errors start with ``where``."""
    required, optional = spec
    for name, ftype in required.items():
        value = obj.get(name)
        if value is None:
            raise SchemaError(f"{where}.{name}: required field is missing")
        _check(where, name, ftype, value)
    for name, ftype in optional.items():
        value = obj.get(name)
        if value is not None:
            _check(where, name, ftype, value)
    for name, low in MINIMA.get(rules, {}).items():
        value = obj.get(name)
        if value is not None and value < low:
            raise SchemaError(f"{where}.{name}: {value!r} is below {low}")
    for lo, hi in ORDERED.get(rules, ()):
        a, b = obj.get(lo), obj.get(hi)
        if a is not None and b is not None and a > b:
            raise SchemaError(f"{where}: {lo} {a!r} is after {hi} {b!r}"
                              if lo.endswith("_ts") else
                              f"{where}: {lo} {a!r} is above {hi} {b!r}")
