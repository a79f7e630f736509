"""The ``comm`` kind: nested ``ops`` entries are validated field by field with one-line
reasons, sanity rules hold, a bad entry costs only its record, and the fast path agrees."""

from __future__ import annotations

import copy

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.schema import SchemaError, Topics, decode, decode_lenient, encode, validate
from failslow.schema.events import OPS_MAX
from failslow.schema.fast import all_valid
from failslow.schema.topics import key_for

OP = {"group": "dp0", "group_size": 4, "op": "allreduce", "n": 3, "blocked_s": 0.12,
      "min_s": 0.01, "max_s": 0.08, "bytes": 3 << 20, "first_seq": 10, "last_seq": 12,
      "first_start_ts": 1700000000.1}
SEND = {"group": "pp0-1", "group_size": 2, "op": "send", "n": 1, "blocked_s": 0.0,
        "min_s": 0.002, "max_s": 0.002, "bytes": 4096, "peer": 1}
COMM = {"v": 1, "kind": "comm", "ts": 1700000001.0, "job_id": "j", "rank": 0, "host": "h0",
        "window_start_ts": 1700000000.0, "ops": [OP, SEND], "step": 7, "step_end": True,
        "world_size": 8, "gpu": 0}


def _with(patch_op=None, **patch):
    ev = copy.deepcopy(COMM)
    ev.update(patch)
    if patch_op is not None:
        ev["ops"][0].update(patch_op)
    return ev


def test_a_full_and_a_minimal_comm_record_are_valid():
    assert validate(copy.deepcopy(COMM)) == COMM
    bare = {k: COMM[k] for k in ("v", "kind", "ts", "job_id", "rank", "host",
                                 "window_start_ts", "ops")}
    bare["ops"] = [{k: OP[k] for k in ("group", "group_size", "op", "n", "blocked_s",
                                      "min_s", "max_s", "bytes")}]
    assert validate(bare) is bare
    assert all_valid([COMM, bare])
    # the tailer knows no steps; a window with no completed op is a valid (empty) summary
    for ev in (_with(step=None, step_end=None), _with(ops=[])):
        assert validate(ev) is ev and all_valid([ev])


@pytest.mark.parametrize(("ev", "reason"), [
    (_with(ops=None), r"^comm\.ops: required field is missing$"),
    (_with(ops={"group": "dp0"}), r"^comm\.ops: expected a list of objects, got dict"),
    (_with(ops=[OP, 3]), r"^comm\.ops\[1\]: expected an object, got int$"),
    (_with({"group": None}), r"^comm\.ops\[0\]\.group: required field is missing$"),
    (_with({"op": "shuffle"}), r"^comm\.ops\[0\]\.op: 'shuffle' is not one of allreduce"),
    (_with({"n": 1.5}), r"^comm\.ops\[0\]\.n: expected an integer, got float 1\.5$"),
    (_with({"n": 0}), r"^comm\.ops\[0\]\.n: 0 is below 1$"),
    (_with({"blocked_s": -0.5}), r"^comm\.ops\[0\]\.blocked_s: -0\.5 is below 0$"),
    (_with({"min_s": -0.01, "max_s": 0.0}), r"^comm\.ops\[0\]\.min_s: -0\.01 is below 0$"),
    (_with({"min_s": 0.5}), r"^comm\.ops\[0\]: min_s 0\.5 is above max_s 0\.08$"),
    (_with({"bytes": -1}), r"^comm\.ops\[0\]\.bytes: -1 is below 0$"),
    (_with({"group_size": 2**31}), r"^comm\.ops\[0\]\.group_size: integer .* 32-bit range$"),
    (_with({"first_seq": 13}), r"^comm\.ops\[0\]: first_seq 13 is above last_seq 12$"),
    (_with({"first_start_ts": -5.0}), r"^comm\.ops\[0\]\.first_start_ts: .* 1970 and 2286$"),
    (_with({"peer": "1"}), r"^comm\.ops\[0\]\.peer: expected an integer, got str '1'$"),
    (_with(window_start_ts=1700000002.0),
     r"^comm: window_start_ts 1700000002\.0 is after ts 1700000001\.0$"),
    (_with(step_end=1), r"^comm\.step_end: expected true or false, got int 1$"),
    (_with(step=True), r"^comm\.step: expected an integer, got bool True$"),
    (_with(ops=[OP] * (OPS_MAX + 1)), rf"^comm\.ops: {OPS_MAX + 1} entries, at most {OPS_MAX}$"),
])
def test_bad_records_are_refused_with_one_line_naming_the_entry(ev, reason):
    with pytest.raises(SchemaError, match=reason) as info:
        validate(ev)
    assert "\n" not in str(info.value)
    assert not all_valid([ev])


def test_non_finite_numbers_in_entries_are_refused():
    with pytest.raises(SchemaError, match=r"^comm\.ops\[0\]\.max_s: non-finite number nan$"):
        validate(_with({"max_s": float("nan")}))
    # on the wire NaN is not JSON at all (what the fast path relies on)
    good, errors = decode_lenient(orjson.dumps(COMM).replace(b'"max_s":0.08', b'"max_s":NaN'))
    assert good == [] and errors[0].startswith("value: not JSON")


def test_a_bad_entry_dead_letters_its_record_only():
    topics = Topics()
    bad = _with({"min_s": 0.5})
    good, errors = decode_lenient(encode([COMM, bad, COMM]),
                                  topics.kinds_of(topics.for_kind("comm")))
    assert good == [COMM, COMM]
    assert errors == ["[1] comm.ops[0]: min_s 0.5 is above max_s 0.08"]
    with pytest.raises(SchemaError, match=r"^\[1\] comm\.ops\[0\]: min_s"):
        decode(encode([COMM, bad]))


def test_comm_travels_on_collectives_keyed_by_job():
    topics = Topics()
    assert topics.for_kind("comm") == topics.for_kind("collective") == "failslow.collectives"
    assert topics.kinds_of("failslow.collectives") == {"collective", "comm"}
    assert key_for(COMM) == "j"
    # one input topic each, even though two kinds share one
    assert topics.inputs().count("failslow.collectives") == 1
    assert len(topics.all()) == len(set(topics.all()))
    # comm on another topic is refused like any other kind
    good, errors = decode_lenient(encode(COMM), topics.kinds_of(topics.for_kind("step")))
    assert good == [] and errors == ["1 event(s) of kind 'comm' on a topic of step"]


_any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=10)
_fields = sorted({*COMM, *OP, *SEND})


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(_fields), _any_json), max_size=4))
def test_mutated_records_are_accepted_or_refused_cleanly_and_the_fast_path_agrees(muts):
    ev = copy.deepcopy(COMM)
    for in_op, name, value in muts:
        ops = ev.get("ops")
        if in_op and type(ops) is list and ops and type(ops[0]) is dict:
            ops[0][name] = value
        else:
            ev[name] = value
    try:
        validate(ev)
        valid = True
    except SchemaError as exc:
        valid = False
        assert "\n" not in str(exc)
    assert valid or not all_valid([ev])  # the fast path never vouches for a bad record
    good, errors = decode_lenient(orjson.dumps(ev))
    if valid:
        assert good == [ev] and errors == []
    else:
        assert good == [] and len(errors) == 1


def test_the_fast_path_checks_the_range_of_list_integers():
    # orjson decodes integers up to 2**64 - 1: the fast path must not vouch for one
    gpu = {"v": 1, "kind": "gpu", "ts": 1.0, "host": "h", "gpu": 0, "uuid": "u", "xid": [2**63]}
    with pytest.raises(SchemaError, match=r"gpu\.xid: integer .* 64-bit"):
        validate(gpu)
    assert not all_valid([gpu]) and all_valid([dict(gpu, xid=[2**63 - 1])])
