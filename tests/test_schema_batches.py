"""Columnar batch kinds (``comm_batch``, ``gpu_batch``, ``nic_batch``, ``step_batch``): lossless both ways (property-tested:
every optional field absent, null or present, unknown fields, key order), decoded into the
per-rank events by every consumer's codec, and a bad batch refused with one line."""

from __future__ import annotations

import copy

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.schema import SchemaError, decode, decode_lenient, encode
from failslow.schema.batches import (
    ROWS_MAX,
    BatchError,
    batch_trace,
    expand,
    is_batch,
    rows_fields,
    to_batch,
    to_batches,
)
from failslow.schema.events import NESTED, OPS, SPECS
from failslow.schema.topics import Topics, key_for

T0 = 1_700_000_000.0
OP = {"group": "dp0", "group_size": 8, "op": "allreduce", "n": 3, "blocked_s": 0.12,
      "min_s": 0.01, "max_s": 0.08, "bytes": 3 << 20, "first_seq": 10, "last_seq": 12,
      "first_start_ts": T0 + 0.1}


def _comm(rank: int, **patch) -> dict:
    ev = {"v": 1, "kind": "comm", "ts": T0 + 1, "job_id": "j", "rank": rank, "host": "h0",
          "window_start_ts": T0, "ops": [dict(OP, blocked_s=0.1 + rank / 100)], "step": 7,
          "step_end": True, "world_size": 8, "gpu": rank}
    ev.update(patch)
    return ev


def _gpu(index: int, **patch) -> dict:
    ev = {"v": 1, "kind": "gpu", "ts": T0, "host": "h0", "gpu": index, "uuid": f"GPU-{index}",
          "sm_clock_mhz": 1980.0, "temp_c": 40.0 + index, "xid": [], "job_id": "j",
          "rank": index}
    ev.update(patch)
    return ev


def _same_bytes(a: list[dict], b: list[dict], keep_order: bool = False) -> bool:
    """Equal as the JSON a consumer would see: values and types (1, 1.0 and true differ;
    so do -0.0 and 0.0), and with ``keep_order`` the order of the keys too."""
    opt = 0 if keep_order else orjson.OPT_SORT_KEYS
    return [orjson.dumps(x, option=opt) for x in a] == [orjson.dumps(x, option=opt) for x in b]


# -- hypothesis: any valid rows, any mix of absent / null / present ---------------------------

def _value(ftype):
    if ftype == "str":
        return st.text(max_size=6)
    if ftype in ("int", "i32"):
        return st.integers(1, 2**31 - 1)
    if ftype == "num":
        return st.one_of(st.integers(0, 10**6),
                         st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
    if ftype == "time":
        return st.floats(T0, T0 + 100, allow_nan=False)
    if ftype == "bool":
        return st.booleans()
    if ftype == "ints":
        return st.lists(st.integers(0, 100), max_size=3)
    if isinstance(ftype, tuple):
        return st.sampled_from(ftype)
    raise AssertionError(ftype)


# an optional field: absent, null, or a value; sometimes the same on every row, so the
# batch writes it once
_ABSENT = object()


def _optional(ftype):
    return st.one_of(st.just(_ABSENT), st.none(), _value(ftype))


@st.composite
def _record(draw, spec, fixed: dict, shared_optional: dict):
    required, optional = spec
    out = {}
    for name, ftype in required.items():
        out[name] = fixed[name] if name in fixed else draw(_value(ftype))
    for name, ftype in optional.items():
        value = shared_optional[name] if name in shared_optional else draw(_optional(ftype))
        if value is not _ABSENT:
            out[name] = value
    for lo, hi in (("window_start_ts", "ts"), ("min_s", "max_s"), ("first_seq", "last_seq")):
        if out.get(lo) is not None and out.get(hi) is not None and out[lo] > out[hi]:
            out[lo], out[hi] = out[hi], out[lo]
    if draw(st.booleans()):  # an unknown extra field a newer producer sends
        out["extra_note"] = draw(st.one_of(st.none(), st.text(max_size=4),
                                           st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2)))
    return out


@st.composite
def comm_rows(draw):
    n = draw(st.integers(1, 9))
    fixed = {"job_id": draw(st.text(min_size=1, max_size=5)), "host": "h" + draw(st.text(
        max_size=3)), "op": draw(st.sampled_from(OPS)), "window_start_ts": T0}
    shared = {name: draw(_optional(t)) for name, t in SPECS["comm"][1].items()
              if draw(st.booleans())}
    rows = []
    for rank in draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n, unique=True)):
        ev = {"v": 1, "kind": "comm",
              **draw(_record(SPECS["comm"], {**fixed, "rank": rank, "ops": None}, shared))}
        ev["ops"] = draw(st.lists(_record(NESTED["ops"], fixed, {}), max_size=3))
        rows.append(ev)
    return rows


@st.composite
def gpu_rows(draw):
    n = draw(st.integers(1, 9))
    shared = {name: draw(_optional(t)) for name, t in SPECS["gpu"][1].items()
              if draw(st.booleans())}
    host = draw(st.text(max_size=4))
    rows = []
    for gpu in range(n):
        rows.append({"v": 1, "kind": "gpu", **draw(_record(SPECS["gpu"],
                                                           {"host": host, "gpu": gpu}, shared))})
    return rows


@st.composite
def nic_rows(draw):
    """A host's NIC ports: rows named by (nic, port), a NIC's ports in one batch."""
    ports = draw(st.lists(st.tuples(st.sampled_from(("mlx5_0", "mlx5_1", "eth0")),
                                    st.integers(1, 3)), min_size=1, max_size=9, unique=True))
    shared = {name: draw(_optional(t)) for name, t in SPECS["nic"][1].items()
              if draw(st.booleans())}
    host = draw(st.text(max_size=4))
    return [{"v": 1, "kind": "nic", **draw(_record(SPECS["nic"], {"host": host, "nic": nic,
                                                                 "port": port}, shared))}
            for nic, port in ports]


@st.composite
def step_rows(draw):
    """A host's ranks' steps: job and host shared, a row per rank."""
    n = draw(st.integers(1, 9))
    fixed = {"job_id": draw(st.text(min_size=1, max_size=5)),
             "host": "h" + draw(st.text(max_size=3))}
    if draw(st.booleans()):       # most often every rank of the host is at the same step
        fixed["step"] = draw(_value("int"))
    shared = {name: draw(_optional(t)) for name, t in SPECS["step"][1].items()
              if draw(st.booleans())}
    return [{"v": 1, "kind": "step",
             **draw(_record(SPECS["step"], {**fixed, "rank": rank}, shared))}
            for rank in draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n,
                                      unique=True))]


_ROWS = st.one_of(comm_rows(), gpu_rows(), nic_rows(), step_rows())


@settings(max_examples=160, deadline=None)
@given(_ROWS)
def test_rows_to_batch_and_back_is_exact(rows):
    original = copy.deepcopy(rows)
    batch = to_batch(rows)
    assert rows == original                      # the input is not changed
    assert _same_bytes(expand(batch), original)
    # on the wire: what every consumer's codec gives back
    assert _same_bytes(decode(encode(batch)), original)
    assert _same_bytes(decode(encode([batch, batch])), original + original)
    got, errors = decode_lenient(encode(batch))
    assert _same_bytes(got, original) and errors == []


@settings(max_examples=80, deadline=None)
@given(_ROWS)
def test_batch_to_rows_and_back_is_exact(rows):
    batch = to_batch(rows)
    wire = orjson.loads(encode(batch))
    assert orjson.dumps(to_batch(expand(wire))) == encode(batch)


def test_a_batch_is_smaller_than_its_rows_and_names_each_shared_value_once():
    rows = [_comm(r) for r in range(8)]
    batch = to_batch(rows)
    assert batch["job_id"] == "j" and batch["host"] == "h0" and batch["rank"] == list(range(8))
    assert batch["step"] == 7 and batch["world_size"] == 8 and batch["ops_len"] == 1
    assert batch["ops"]["group"] == "dp0" and len(batch["ops"]["blocked_s"]) == 8
    assert len(encode(batch)) < 0.5 * len(encode(rows))
    # rows that list their fields in one order come back in that order
    assert _same_bytes(decode(encode(batch)), rows, keep_order=True)


def test_to_batches_groups_by_kind_and_shared_fields_and_keeps_the_rest():
    step = {"v": 1, "kind": "step", "ts": T0, "job_id": "j", "rank": 0, "world_size": 8,
            "host": "h0", "step": 7, "duration_s": 1.0}
    host = {"v": 1, "kind": "host", "ts": T0, "host": "h0", "load1": 3.0}
    events = [_comm(0), step, _gpu(0), _comm(1), _comm(2, host="h1"), _gpu(1), _comm(3), host,
              dict(step, rank=1, duration_s=1.5)]
    out = to_batches(events)
    assert [e["kind"] for e in out] == ["comm_batch", "step_batch", "gpu_batch", "comm_batch",
                                        "host"]
    assert out[0]["rank"] == [0, 1, 3] and out[3]["rank"] == [2] and out[2]["gpu"] == [0, 1]
    # a host's steps: one row per rank, the step and world size written once
    assert out[1]["rank"] == [0, 1] and out[1]["duration_s"] == [1.0, 1.5]
    assert out[1]["step"] == 7 and out[1]["world_size"] == 8 and out[1]["job_id"] == "j"
    assert expand(out[1]) == [step, dict(step, rank=1, duration_s=1.5)]
    assert sorted(map(orjson.dumps, decode_lenient(encode([out[0], out[3]]))[0])) == sorted(
        orjson.dumps(e) for e in events if e["kind"] == "comm")
    # batches travel on the per-rank kinds' topics, with their keys
    assert Topics().for_kind("comm_batch") == Topics().for_kind("comm")
    assert Topics().for_kind("gpu_batch") == Topics().for_kind("gpu")
    assert Topics().for_kind("step_batch") == Topics().for_kind("step")
    assert key_for(out[0]) == "j" and key_for(out[2]) == "h0" and key_for(out[1]) == "j"


@pytest.mark.parametrize(("rows", "why"), [
    ([_comm(0), _comm(1, host="h1")], "share one host"),
    ([_comm(0), _gpu(1)], "not all rows are v1 comm"),
    ([_comm(0, ops_len=3)], "named like a batch column"),
    ([_comm(0, job_id=None)], "share one job_id"),
    ([{k: v for k, v in _comm(0).items() if k != "rank"}], "no rank"),
    ([_comm(r) for r in range(ROWS_MAX + 1)], "at most"),
    ([_comm(0, ops="x")], "not a list of objects"),
])
def test_rows_one_batch_cannot_hold_are_refused_and_stay_per_rank(rows, why):
    with pytest.raises(BatchError, match=why):
        to_batch(rows)
    # to_batches sends what one batch cannot hold per rank (or in several batches)
    out = to_batches(rows)
    back = [ev for item in out for ev in (expand(item) if is_batch(item) else [item])]
    assert sorted(map(orjson.dumps, back)) == sorted(map(orjson.dumps, rows))


def _bad(**patch) -> dict:
    batch = to_batch([_comm(r) for r in range(4)])
    batch.update(patch)
    return batch


@pytest.mark.parametrize(("batch", "reason"), [
    (_bad(rank=3), r"^comm_batch\.rank: expected a non-empty list, one value per row, got int"),
    (_bad(rank=[]), r"^comm_batch\.rank: expected a non-empty list"),
    (_bad(host=None), r"^comm_batch\.host: required field is missing$"),
    (_bad(job_id=["a", "b"]), r"^comm_batch\.job_id: expected one value for the batch"),
    (_bad(gpu=[0, 1]), r"^comm_batch\.gpu: 2 values for 4 rows$"),
    (_bad(extra_note="x"), r"^comm_batch\.extra_note: expected a list with one value per row"),
    (_bad(ops=[OP]), r"^comm_batch\.ops: expected an object of columns, got list$"),
    (_bad(ops_len=[1, 1]), r"^comm_batch\.ops_len: expected a count of entries per row"),
    (_bad(ops_len=-1), r"^comm_batch\.ops_len: expected a count of entries per row"),
    (_bad(ops_len=2), r"^comm_batch\.ops\.blocked_s: 4 values for 8 entries$"),
    (_bad(absent={"gpu": [7]}), r"^comm_batch\.absent\.gpu: expected a list of indexes below 4"),
    (_bad(absent={"nope": [0]}), r"^comm_batch\.absent\.nope: names index 0 twice, or a field"),
    (_bad(v=2), r"^comm_batch\.v: unknown version 2"),
    (_bad(rank=list(range(ROWS_MAX + 1))), rf"^comm_batch\.rank: {ROWS_MAX + 1} rows, at most"),
])
def test_a_bad_batch_is_refused_whole_with_one_line(batch, reason):
    with pytest.raises(SchemaError, match=reason) as info:
        decode(encode(batch))
    assert "\n" not in str(info.value)
    good, errors = decode_lenient(encode([batch, _comm(9)]))
    assert good == [_comm(9)] and len(errors) == 1 and errors[0].startswith("[0] comm_batch")


def test_a_bad_row_costs_only_its_row_and_is_named():
    rows = [_comm(r) for r in range(4)]
    rows[2]["ops"][0]["n"] = 0
    batch = to_batch(rows)
    good, errors = decode_lenient(encode(batch), Topics().kinds_of("failslow.collectives"))
    assert [e["rank"] for e in good] == [0, 1, 3]
    assert errors == ["comm_batch row 2 (rank 2): comm.ops[0].n: 0 is below 1"]
    with pytest.raises(SchemaError, match=r"^comm_batch row 2 \(rank 2\): comm\.ops\[0\]\.n"):
        decode(encode(batch))
    # a batch on a topic that does not carry its rows' kind is refused like its rows
    good, errors = decode_lenient(encode(batch), Topics().kinds_of("failslow.gpu"))
    assert good == [] and "of kind 'comm' on a topic of gpu" in errors[-1]


_any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=8)
_BATCH = to_batch([_comm(r) for r in range(3)])
_paths = [(k,) for k in _BATCH] + [("ops", k) for k in _BATCH["ops"]] + [("absent",)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_paths), _any_json), min_size=1, max_size=3))
def test_mutated_batches_are_accepted_or_refused_cleanly(muts):
    batch = copy.deepcopy(_BATCH)
    for path, value in muts:
        target = batch if len(path) == 1 else batch["ops"]
        if type(target) is dict:
            target[path[-1]] = value
    try:
        raw = encode(batch)
    except TypeError:  # not JSON (an integer beyond 64 bits): never on the wire
        return
    good, errors = decode_lenient(raw)          # never raises
    assert all(isinstance(e, str) and "\n" not in e for e in errors)
    try:
        strict = decode(raw)
    except SchemaError:
        assert errors
    else:
        assert errors == [] and strict == good


def test_the_route_sends_a_batch_to_its_ranks_shard_whole_or_cut_per_shard():
    from failslow.streams.sharding import shard_parts

    whole = to_batch([_comm(r) for r in (8, 9, 10)])
    assert shard_parts(encode(to_batch([_comm(r) for r in range(4)])), 8) is None  # shard 0
    parts = shard_parts(encode([whole]), 8)
    assert parts is not None and list(parts) == [1] and orjson.loads(parts[1]) == [whole]
    straddling = [_comm(r) for r in (6, 7, 8, 9)]
    parts = shard_parts(encode(to_batch(straddling)), 8)
    assert parts is not None
    assert {k: [e["rank"] for e in decode(v)] for k, v in parts.items()} == {0: [6, 7],
                                                                            1: [8, 9]}
    assert all(orjson.loads(v)[0]["kind"] == "comm_batch" for v in parts.values())
    assert sorted(map(orjson.dumps, (e for v in parts.values() for e in decode(v)))) == sorted(
        map(orjson.dumps, straddling))


@settings(max_examples=60, deadline=None)
@given(step_rows(), st.lists(st.sampled_from(tuple(SPECS["step"][0]) + tuple(SPECS["step"][1])
                                             + ("kind", "v", "extra_note", "absent")),
                             unique=True))
def test_rows_fields_are_the_expanded_rows_fields(rows, fields):
    batch = orjson.loads(encode(to_batch(rows)))
    want = [{k: r[k] for k in fields if k in r} for r in expand(batch)]
    assert _same_bytes(rows_fields(batch, tuple(fields)), want, keep_order=True)


def test_a_step_batch_goes_where_its_newest_row_was():
    """``batch_trace``: a comm_batch takes its first row's place, a step_batch its newest
    row's: no rank's step comes before its own windows of that step, even when a slow
    rank's step-end window falls in the host's next comm_batch."""
    def comm(r: int, t: float, step: int) -> dict:
        return _comm(r, ts=T0 + t, window_start_ts=T0 + t - 0.5, step=step, world_size=2)

    def step(r: int, t: float, s: int) -> dict:
        return {"v": 1, "kind": "step", "ts": T0 + t, "job_id": "j", "rank": r,
                "world_size": 2, "host": "h0", "step": s, "duration_s": 1.0}

    # rank 1 is late: its step-end window comes after rank 0's next mid-step window
    events = [comm(0, 1.0, 0), step(0, 1.0, 0), comm(0, 1.5, 1), comm(1, 1.6, 0),
              step(1, 1.6, 0), comm(1, 2.1, 1), comm(0, 2.5, 1), step(0, 2.5, 1),
              comm(1, 2.6, 1), step(1, 2.6, 1)]
    out = list(batch_trace(events, linger_s=1.0))
    seen: set = set()
    for item in out:
        rows = expand(item) if is_batch(item) else [item]
        for row in rows:
            if row["kind"] == "step":
                assert {(row["rank"], row["step"], "end")} <= seen, (row, out)
        seen |= {(row["rank"], row["step"], "end") for row in rows
                 if row["kind"] == "comm"}
    assert [e["kind"] for e in out].count("step_batch") == 2
    assert [len(e["rank"]) for e in out if e["kind"] == "step_batch"] == [2, 2]
    back = [r for e in out for r in (expand(e) if is_batch(e) else [e])]
    assert sorted(map(orjson.dumps, back)) == sorted(map(orjson.dumps, events))
