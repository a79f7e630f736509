"""The wire schema: validation names the field, the codec round-trips, garbage never crashes."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.schema import (
    SchemaError,
    Topics,
    decode,
    decode_lenient,
    encode,
    encode_deadletter,
    validate,
)
from failslow.schema.events import MINIMA, NESTED, ORDERED, SPECS
from failslow.schema.fast import all_valid
from failslow.schema.topics import key_for

STEP = {"v": 1, "kind": "step", "ts": 1700000000.5, "job_id": "j", "rank": 3, "world_size": 16,
        "host": "h0", "step": 7, "duration_s": 1.02, "compute_s": 0.8, "comm_s": None}


def test_valid_step_passes_and_extra_fields_are_kept():
    ev = dict(STEP, future_field="ok")
    assert validate(ev) is ev


@pytest.mark.parametrize(("patch", "field"), [
    ({"rank": "3"}, "step.rank"),
    ({"rank": True}, "step.rank"),
    ({"duration_s": "fast"}, "step.duration_s"),
    ({"job_id": None}, "step.job_id"),
    ({"compute_s": [1]}, "step.compute_s"),
    ({"v": 2}, "event.v"),
    ({"kind": "weird"}, "event.kind"),
])
def test_invalid_fields_are_named(patch, field):
    with pytest.raises(SchemaError, match=field.replace(".", r"\.")):
        validate(dict(STEP, **patch))


def test_missing_required_field_is_named():
    ev = dict(STEP)
    del ev["world_size"]
    with pytest.raises(SchemaError, match=r"step\.world_size: required field is missing"):
        validate(ev)


def test_non_finite_numbers_are_rejected():
    with pytest.raises(SchemaError, match="non-finite"):
        validate(dict(STEP, duration_s=math.inf))
    with pytest.raises(SchemaError, match="not JSON"):
        decode(b'{"v":1,"kind":"host","ts":1e400,"host":"a"}')


def test_integers_beyond_their_column_are_rejected():
    with pytest.raises(SchemaError, match=r"step\.tokens: integer .* 64-bit"):
        validate(dict(STEP, tokens=2**63))
    with pytest.raises(SchemaError, match=r"step\.rank: integer .* 32-bit"):
        validate(dict(STEP, rank=2**63 - 1))
    assert not all_valid([dict(STEP, rank=2**31)]) and all_valid([dict(STEP, rank=2**31 - 1)])


@pytest.mark.parametrize("ts", [1e300, -1.0, 1e10])
def test_times_outside_1970_2286_are_rejected(ts):
    with pytest.raises(SchemaError, match=r"step\.ts: .* not a time between 1970 and 2286"):
        validate(dict(STEP, ts=ts))
    assert not all_valid([dict(STEP, ts=ts)])


def test_enums_are_checked():
    coll = {"v": 1, "kind": "collective", "ts": 2.0, "job_id": "j", "rank": 0, "host": "h",
            "group": "dp0", "group_size": 2, "op": "allreduce", "seq": 1, "start_ts": 1.0,
            "duration_s": 1.0, "bytes": 10}
    validate(coll)
    with pytest.raises(SchemaError, match=r"collective\.op"):
        validate(dict(coll, op="shuffle"))


def test_array_must_be_one_kind_and_lenient_keeps_the_good_ones():
    host = {"v": 1, "kind": "host", "ts": 1.0, "host": "a"}
    with pytest.raises(SchemaError, match=r"\[1\] event\.kind"):
        decode(encode([host, STEP]))
    good, errors = decode_lenient(encode([host, {"v": 1, "kind": "host"}, host]))
    assert len(good) == 2 and len(errors) == 1 and errors[0].startswith("[1] host.ts")


def test_deadletter_shape():
    dl = orjson.loads(encode_deadletter("bad", "failslow.gpu", b"\xff{"))
    assert dl["error"] == "bad" and dl["topic"] == "failslow.gpu" and isinstance(dl["raw"], str)


def test_keys_follow_the_contract():
    assert key_for(STEP) == "j"
    assert key_for({"kind": "collective", "job_id": "j", "group": "tp1"}) == "j/tp1"
    assert key_for({"kind": "gpu", "host": "h9"}) == "h9"


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
ints64 = st.integers(-(2**63), 2**63 - 1)
VALUES = {"num": finite | ints64, "int": ints64, "i32": st.integers(-(2**31), 2**31 - 1),
          "time": st.floats(0.0, 1e10, exclude_max=True) | st.integers(0, 10**10 - 1),
          "str": st.text(max_size=12),
          "ints": st.lists(st.integers(0, 200), max_size=3),
          "nums": st.lists(finite, max_size=4),
          "obj": st.dictionaries(st.text(max_size=5), ints64, max_size=3),
          "bool": st.booleans()}


def _value(ftype):
    if ftype in NESTED:
        return st.lists(_fields(ftype, NESTED[ftype]), max_size=3)
    return VALUES[ftype] if isinstance(ftype, str) else st.sampled_from(ftype)


def _sane(obj, rules):
    """Make random fields keep the MINIMA and ORDERED rules (a valid event)."""
    def clamp():
        for name, low in MINIMA.get(rules, {}).items():
            if obj.get(name) is not None and obj[name] < low:
                obj[name] = low
    clamp()
    for lo, hi in ORDERED.get(rules, ()):
        if obj.get(lo) is not None and obj.get(hi) is not None and obj[lo] > obj[hi]:
            obj[lo], obj[hi] = obj[hi], obj[lo]
    clamp()  # a swapped pair may have brought a value below its minimum
    return obj


@st.composite
def _fields(draw, rules, spec):
    required, optional = spec
    ev = {}
    for name, ftype in required.items():
        ev[name] = draw(_value(ftype))
    for name, ftype in optional.items():
        choice = draw(st.integers(0, 2))
        if choice == 1:
            ev[name] = None
        elif choice == 2:
            ev[name] = draw(_value(ftype))
    return _sane(ev, rules)


@st.composite
def events(draw):
    kind = draw(st.sampled_from(sorted(SPECS)))
    return {"v": 1, "kind": kind, **draw(_fields(kind, SPECS[kind]))}


@settings(max_examples=300, deadline=None)
@given(events())
def test_roundtrip_one_event(ev):
    assert decode(encode(ev)) == [ev]


@settings(max_examples=100, deadline=None)
@given(st.lists(events(), min_size=1, max_size=5))
def test_roundtrip_arrays_lenient(evs):
    good, errors = decode_lenient(encode(evs))
    assert good == evs and errors == []


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_garbage_never_crashes_the_decoder(raw):
    try:
        decode(raw)
    except SchemaError:
        pass
    good, errors = decode_lenient(raw)
    assert good or errors


json_values = st.recursive(
    st.none() | st.booleans() | ints64 | finite | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=5),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_is_accepted_or_rejected_cleanly(obj):
    raw = orjson.dumps(obj)
    try:
        decode(raw)
    except SchemaError as exc:
        assert str(exc)
    good, errors = decode_lenient(raw)
    assert all(isinstance(e, str) for e in errors)


@settings(max_examples=300, deadline=None)
@given(events() | json_values)
def test_fast_path_never_accepts_what_validate_rejects(obj):
    try:
        validate(obj)
        valid = True
    except SchemaError:
        valid = False
    # Soundness: the fast path may decline, but never vouch for an invalid object.
    assert valid or not all_valid([obj])


@settings(max_examples=200, deadline=None)
@given(events())
def test_fast_path_accepts_every_valid_event_of_the_generator(ev):
    assert all_valid([ev])


def test_events_of_another_kind_than_the_topic_s_are_rejected():
    # A host sample inside an array of steps: every consumer of failslow.steps (worker,
    # sink) drops it with the same reason and keeps the steps.
    topics = Topics()
    host = {"v": 1, "kind": "host", "ts": 1.0, "host": "a"}
    good, errors = decode_lenient(encode([STEP, host, STEP]),
                                  topics.kinds_of(topics.for_kind("step")))
    assert good == [STEP, STEP]
    assert errors == ["1 event(s) of kind 'host' on a topic of step"]
    assert topics.kinds_of("failslow.collectives") == {"collective", "comm"}
    assert topics.kinds_of("other.steps") is None


def test_a_huge_dead_letter_still_fits_one_message():
    value = encode_deadletter("value: not JSON", "failslow.steps", b"\x01" * 999_900)
    assert len(value) < 1_048_576
    assert orjson.loads(value)["raw"].endswith("[truncated: 999900 bytes]")
