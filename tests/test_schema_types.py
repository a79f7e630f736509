"""The TypedDicts of schema/events.py (the static types producers and readers use) agree
with SPECS (the table the validator reads): same fields, same required-ness, same types."""

from __future__ import annotations

import typing
from typing import Any, Literal

import pytest

from failslow.schema import events
from failslow.schema.events import NESTED, SPECS, CommOp

TYPED: dict[str, Any] = {
    "step": events.StepEvent, "collective": events.CollectiveEvent, "comm": events.CommEvent,
    "gpu": events.GpuEvent, "nic": events.NicEvent, "host": events.HostEvent,
    "incident": events.IncidentEvent, "action": events.ActionEvent}
PYTHON = {"str": str, "int": int, "i32": int, "num": float, "time": float, "bool": bool,
          "ints": list[int], "nums": list[float], "obj": dict[str, Any], "ops": list[CommOp]}


def _expected(ftype: events.FieldType) -> set[Any]:
    """The annotations that express one SPECS field type (an enum may be spelled as str)."""
    if isinstance(ftype, tuple):
        return {str, Literal[ftype]}
    return {PYTHON[ftype]}


def _check(cls: Any, spec: events.Spec, base: set[str]) -> None:
    required, optional = spec
    # Not __required_keys__: under `from __future__ import annotations` Python 3.11 does not
    # see NotRequired in the string annotations; the evaluated hints carry it.
    raw = typing.get_type_hints(cls, include_extras=True)
    not_required = {n for n, t in raw.items() if typing.get_origin(t) is typing.NotRequired}
    assert set(raw) - base - not_required == set(required)
    assert not_required == set(optional)
    hints = typing.get_type_hints(cls)
    for name, ftype in required.items():
        assert hints[name] in _expected(ftype), name
    for name, ftype in optional.items():
        assert hints[name] in {t | None for t in _expected(ftype)}, name


def test_every_kind_has_its_typeddict():
    assert set(TYPED) == set(SPECS)
    assert set(typing.get_args(events.Event)) == set(TYPED.values())


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_typeddict_matches_the_spec(kind):
    _check(TYPED[kind], SPECS[kind], base={"v", "kind"})


def test_nested_ops_typeddict_matches_the_spec():
    _check(CommOp, NESTED["ops"], base=set())


def test_the_check_notices_a_disagreement():
    class Drifted(events.HostEvent):
        cpu_steal_s: typing.NotRequired[float | None]

    with pytest.raises(AssertionError):
        _check(Drifted, SPECS["host"], base={"v", "kind"})
