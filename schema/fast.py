"""A compiled fast path for validation: one generated function checks a whole list of
orjson-decoded objects against the SPECS table with no Python call per event.

``all_valid(objs)`` is True only when every object certainly passes
``schema.validate``; False sends the caller to ``validate``, which names the
offending field. Used by the hot paths (`failslow detect`, the stream worker,
the codec).

>>> all_valid([{"v": 1, "kind": "host", "ts": 1.0, "host": "a"}])
True
>>> all_valid([{"v": 1, "kind": "host", "ts": "1", "host": "a"}])
False
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from itertools import accumulate
from operator import le
from typing import Any

import numpy as np

from failslow.schema.events import (
    I32_MAX,
    I32_MIN,
    INT_MAX,
    INT_MIN,
    MINIMA,
    NESTED,
    OPS_MAX,
    ORDERED,
    SPECS,
    TIME_MAX,
    TIME_MIN,
)


def _field_check(name: str, ftype, optional: bool, low, pad: str) -> list[str]:
    """Source lines that ``return False`` unless field ``name`` of ``o`` has type
    ``ftype`` (a SPECS field type; the field may be absent or null when ``optional``)
    and is at least ``low`` (None: no bound). The value stays in the local ``f_<name>``
    for the ORDERED checks."""
    var = f"f_{name}"
    bad = " or ".join(_bad(ftype, var) + ([f"{var} < {low!r}"] if low is not None else []))
    if optional:
        return [f"{pad}{var} = g({name!r})",
                f"{pad}if {var} is not None and ({bad}): return False"]
    return [f"{pad}{var} = o[{name!r}]", f"{pad}if {bad}: return False"]


def _bad(ftype, v: str) -> list[str]:
    if ftype == "num":
        # a float is finite (orjson yields no other); an int must fit 64 bits, as in
        # validate (orjson decodes integers up to 2**64 - 1)
        return [f"type({v}) is not float and (type({v}) is not int "
                f"or not {INT_MIN} <= {v} <= {INT_MAX})"]
    if ftype == "time":
        return [f"type({v}) not in NUM", f"not {TIME_MIN!r} <= {v} < {TIME_MAX!r}"]
    if ftype == "int":
        return [f"type({v}) is not int", f"not {INT_MIN} <= {v} <= {INT_MAX}"]
    if ftype == "i32":
        return [f"type({v}) is not int", f"not {I32_MIN} <= {v} <= {I32_MAX}"]
    if ftype == "str":
        return [f"type({v}) is not str"]
    if ftype == "ints":
        return [f"type({v}) is not list", f"({v} and not ints_ok({v}))"]
    if ftype == "nums":
        return [f"type({v}) is not list", f"({v} and not nums_ok({v}))"]
    if ftype == "obj":
        return [f"type({v}) is not dict"]
    if ftype == "bool":
        return [f"type({v}) is not bool"]
    if ftype in NESTED:
        return [f"type({v}) is not list", f"len({v}) > {OPS_MAX}", f"not nested_{ftype}({v})"]
    if isinstance(ftype, tuple):
        return [f"{v} not in {ftype!r}"]
    raise ValueError(f"unknown field type {ftype!r}")


def _spec_lines(rules: str, required, optional, pad: str) -> list[str]:
    """The checks of one spec (an event kind, or the entries of a list field) and of
    the MINIMA and ORDERED rules named ``rules``."""
    lows = MINIMA.get(rules, {})
    src = []
    for name, ftype in required.items():
        src += _field_check(name, ftype, False, lows.get(name), pad)
    for name, ftype in optional.items():
        src += _field_check(name, ftype, True, lows.get(name), pad)
    for lo, hi in ORDERED.get(rules, ()):
        maybe = [f"f_{n} is not None and " for n in (lo, hi) if n in optional]
        src.append(f"{pad}if {''.join(maybe)}f_{lo} > f_{hi}: return False")
    return src


def ints_ok(xs: list) -> bool:
    """Every element of ``xs`` is an int in the 64-bit range (orjson decodes integers
    up to 2**64 - 1)."""
    return all(type(x) is int for x in xs) and INT_MIN <= min(xs) and max(xs) <= INT_MAX


def nums_ok(xs: list) -> bool:
    """Every element of ``xs`` is a float (orjson yields only finite ones) or an int in
    the 64-bit range."""
    return all(type(x) is float or (type(x) is int and INT_MIN <= x <= INT_MAX) for x in xs)


def _compile_all() -> Any:
    """``all_valid(objs)``: True when every object decoded by orjson certainly
    passes ``schema.validate``. One generated function with the SPECS table
    inlined (the way dataclasses builds ``__init__``): no Python call per
    event (one per event with a list field, for its entries). Numbers are checked by
    type and range (orjson never yields a non-finite float). False sends the caller to
    ``validate``, which names the offending field."""
    src = ["def all_valid(objs):", " for o in objs:", "  if type(o) is not dict: return False",
           "  g = o.get", "  v = g('v')", "  if type(v) is not int or v != 1: return False",
           "  k = g('kind')", "  try:"]
    for i, (kind, (required, optional)) in enumerate(SPECS.items()):
        src.append(f"   {'if' if i == 0 else 'elif'} k == {kind!r}:")
        src += _spec_lines(kind, required, optional, "    ")
    src += ["   else: return False", "  except KeyError:", "   return False", " return True"]
    # nested_<type>(items): the same for the entries of a list field (comm.ops)
    for ftype, (required, optional) in NESTED.items():
        src += [f"def nested_{ftype}(objs):", " for o in objs:",
                "  if type(o) is not dict: return False", "  g = o.get", "  try:"]
        src += _spec_lines(ftype, required, optional, "   ")
        src += ["  except KeyError:", "   return False", " return True"]
    scope: dict = {"NUM": frozenset((int, float)), "ints_ok": ints_ok, "nums_ok": nums_ok}
    exec("\n".join(src), scope)  # noqa: S102 - code built from the SPECS table only
    return scope["all_valid"]


all_valid = _compile_all()


# -- columns of a batch (``schema.batches.valid``) -------------------------------------------

_NONE = type(None)
_FLOAT, _NUMT, _INT = frozenset((float,)), frozenset((float, int)), frozenset((int,))
_LIST = frozenset((list,))
_LISTS = frozenset(("ints", "nums"))     # contract types whose value is a list
_ONE = {"str": frozenset((str,)), "bool": frozenset((bool,)), "obj": frozenset((dict,))}
# Contract types checked by their bounds: (the name of their allowed types in the checks'
# scope, least, most, most included)
_RANGED = {"time": ("NUMT", TIME_MIN, TIME_MAX, False), "int": ("INT", INT_MIN, INT_MAX, True),
           "i32": ("INT", I32_MIN, I32_MAX, True)}


def _ints_in(xs: list, low: int, high: int) -> bool:
    """The ints of a column of floats and ints lie in low..high."""
    ints = [x for x in xs if type(x) is int]
    return not ints or (low <= min(ints) and max(ints) <= high)


def _ordered(a, b, n: int) -> bool:
    """Row by row ``a <= b`` where both are given (a column, or one value for all)."""
    if a is None or b is None:
        return True
    if type(a) is not list and type(b) is not list:
        return a <= b
    a = a if type(a) is list else [a] * n
    b = b if type(b) is list else [b] * n
    if None in a or None in b:
        return all(x <= y for x, y in zip(a, b, strict=True) if x is not None and y is not None)
    return all(map(le, a, b))


# From this many values a column's min and max are taken by numpy (``lo_hi``: one C pass
# to an array, then two over it, ~40 % less than min() and max() of the list)
_NP_MIN = 128


def lo_hi(x: list, t: frozenset | set) -> tuple[Any, Any]:
    """``(min(x), max(x))`` of a column's values (no None; ``t`` their types): by numpy for
    a long column of only floats or only ints (an int beyond 64 bits, or a NaN, which orjson
    never gives but a caller's dict may hold and min() treats by position, goes to min()
    and max())."""
    if len(x) >= _NP_MIN and len(t) == 1:
        if float in t:
            a = np.fromiter(x, np.float64, len(x))
            lo, hi = a.min(), a.max()
            if lo == lo and hi == hi:       # not NaN
                return float(lo), float(hi)
        elif int in t:
            try:
                a = np.fromiter(x, np.int64, len(x))
            except OverflowError:
                pass
            else:
                return int(a.min()), int(a.max())
    return min(x), max(x)


# Contract types whose joined columns ``packed`` checks: the struct format of one value
_PACK = {"num": "d", "time": "d", "int": "q", "i32": "i"}
_PACK_DTYPE = {"d": np.float64, "q": np.int64, "i": np.int32}
_UNSIGNED = {"q": np.uint64, "i": np.uint32}
_F63 = 2.0 ** 63


def packed(cols: list[tuple[list, str, Any]]) -> list[np.ndarray | None]:
    """Per column ``(x, ftype, low)`` (the values of a joined column of contract type
    ``ftype``: ``num``, ``time``, ``int`` or ``i32``, all of one struct format: ``_PACK``;
    ``low``: its MINIMA bound or None), its values as an array when they certainly pass;
    None when not certainly (the caller checks them the usual way: ``column_check``).

    For values as orjson decodes them (str, int, float, bool, None, list, dict): a
    ``struct.pack`` of a column is its type check and its conversion at once (it takes
    only floats and ints for ``d``, only ints within 64 or 32 bits for ``q`` / ``i``); the
    columns' bytes joined, one ``reduceat`` gives their minima, one their maxima; ``bool``,
    which ``struct`` takes as 0 / 1, is looked for only among the values equal to 0 or 1.
    ~2x less than a type pass, a conversion and the bounds of each column."""
    fmt = _PACK[cols[0][1]]
    out: list[np.ndarray | None] = [None] * len(cols)
    parts, took = [], []
    for i, (x, _, _) in enumerate(cols):
        try:
            parts.append(struct.pack(f"={len(x)}{fmt}", *x))
        except (struct.error, TypeError, OverflowError):
            continue
        took.append(i)
    if not took:
        return out
    a = np.frombuffer(parts[0] if len(parts) == 1 else b"".join(parts), _PACK_DTYPE[fmt])
    at = [0, *accumulate(len(cols[i][0]) for i in took)]
    starts = at[:-1]
    los = np.minimum.reduceat(a, starts).tolist()
    his = np.maximum.reduceat(a, starts).tolist()
    zero_one = []
    for k, (i, lo, hi) in enumerate(zip(took, los, his, strict=True)):
        ftype, low = cols[i][1], cols[i][2]
        if fmt == "d" and not (
                TIME_MIN <= lo and hi < TIME_MAX if ftype == "time"
                # a num's ints in 64 bits (an int beyond them packs to a float >= 2**63 or
                # <= -2**63; floats that far go the usual way); a NaN fails either
                else -_F63 < lo and hi < _F63) or low is not None and lo < low:
            continue
        out[i] = a[at[k]:at[k + 1]]
        if lo <= 1 and hi >= 0:
            zero_one.append(k)
    if zero_one:
        maybe = np.flatnonzero((a == 0.0) | (a == 1.0) if fmt == "d"
                               else a.view(_UNSIGNED[fmt]) <= 1)
        cut = np.searchsorted(maybe, at).tolist()
        for k in zero_one:
            if cut[k] < cut[k + 1]:
                x = cols[took[k]][0]
                if bool in set(map(type, map(x.__getitem__,
                                             (maybe[cut[k]:cut[k + 1]] - at[k]).tolist()))):
                    out[took[k]] = None
    return out


def _list_ok(ftype, low: Any = None, joined: bool = False) -> str:
    """A check of a column's values ``x`` (no None), their types ``t`` (a set, not empty).
    ``joined`` (columns of many batches joined, ``column_check``): bounds from one ``lo_hi``,
    ``low`` (a MINIMA bound) checked against the same minimum."""
    lo, hi = ("(b := lo_hi(x, t))[0]", "b[1]") if joined else ("min(x)", "max(x)")
    floor = f" and not {lo if ftype in _RANGED else 'lo_hi(x, t)[0]'} < {low!r}" \
        if joined and low is not None else ""
    if ftype == "num":
        # the ints in 64 bits: at once when the min and max are (floats may lie beyond)
        return (f"(t <= FLOAT or (t <= NUMT and ({INT_MIN} <= min(x) and max(x) <= {INT_MAX}"
                f" or ints_in(x, {INT_MIN}, {INT_MAX})))){floor}")
    if ftype in _RANGED:
        types, least, most, incl = _RANGED[ftype]
        return (f"t <= {types} and {least!r} <= {lo} and {hi} {'<=' if incl else '<'} "
                f"{most!r}{floor}")
    if ftype in _ONE:
        check = f"t <= ONE[{ftype!r}]"
    elif ftype == "ints":
        check = "t <= LIST and all(map(ints_ok, filter(None, x)))"
    elif ftype == "nums":
        check = "t <= LIST and all(map(nums_ok, filter(None, x)))"
    elif isinstance(ftype, tuple):
        check = f"t <= ONE['str'] and set(x) <= {set(ftype)!r}"
    else:
        raise ValueError(f"unknown field type {ftype!r}")
    return f"({check}){floor}" if floor else check


def _compile_columns(rules: str, spec):
    """``columns_ok(o, n, absent)`` for one spec: one generated function with a check per
    field inlined, each column checked by C-level passes (its length, the set of its value
    types, its min and max), no Python call per value."""
    required, optional = spec
    lows = MINIMA.get(rules, {})
    src = ["def columns_ok(o, n, absent):", " g = o.get"]
    for fields, opt in ((required, False), (optional, True)):
        for name, ftype in fields.items():
            if ftype in NESTED:
                continue
            low = lows.get(name)
            # a list-typed field is always a column (null for all rows is no column)
            none = (f"  if {name!r} in o: return False" if ftype in _LISTS else "  pass") \
                if opt else "  return False"
            src += [f" x = g({name!r})", " if x is None:", none, " elif type(x) is list:",
                    "  if len(x) != n: return False"]
            if not opt:
                src.append(f"  if {name!r} in absent: return False")
            src += ["  t = set(map(type, x))", "  if NONE in t:",
                    "   t.discard(NONE)" if opt else "   return False"]
            if opt:
                src.append("   x = [y for y in x if y is not None]")
            src.append(f"  if t and not ({_list_ok(ftype)}): return False")
            if low is not None:
                src.append(f"  if t and min(x) < {low!r}: return False")
            bad = " or ".join(_bad(ftype, "x") + ([f"x < {low!r}"] if low is not None else []))
            src += [" else:", f"  if {bad}: return False"]
    for lo, hi in ORDERED.get(rules, ()):
        src.append(f" if not ordered(g({lo!r}), g({hi!r}), n): return False")
    src.append(" return True")
    scope: dict = {"NUM": frozenset((int, float)), "ints_ok": ints_ok, "nums_ok": nums_ok,
                   "NONE": _NONE, "FLOAT": _FLOAT, "NUMT": _NUMT, "INT": _INT, "LIST": _LIST,
                   "ONE": _ONE, "ints_in": _ints_in, "ordered": _ordered}
    exec("\n".join(src), scope)  # noqa: S102 - code built from the SPECS table only
    return scope["columns_ok"]


def column_check(ftype: Any, low: Any = None) -> Callable[[list, set], bool]:
    """``check(x, t)``: True when the values ``x`` of a column (no None among them), whose
    types are ``t`` (a set, not empty), pass the contract type ``ftype`` and are at least
    ``low`` (None: no bound): what ``columns_ok`` checks of one column, for checks that
    join columns (``schema.batches.valid_many``: long, so bounded by ``lo_hi``)."""
    scope: dict = {"NUM": frozenset((int, float)), "ints_ok": ints_ok, "nums_ok": nums_ok,
                   "NONE": _NONE, "FLOAT": _FLOAT, "NUMT": _NUMT, "INT": _INT, "LIST": _LIST,
                   "ONE": _ONE, "ints_in": _ints_in, "lo_hi": lo_hi}
    src = f"lambda x, t: {_list_ok(ftype, low, joined=True)}"
    return eval(src, scope)  # noqa: S307 - from SPECS only


_COLUMNS = {name: _compile_columns(name, spec)
            for name, spec in (*SPECS.items(), *NESTED.items())}


def columns_ok(rules: str, cols: dict, n: int, absent: dict) -> bool:
    """True when ``cols`` (field -> a list of ``n`` values, or one value for all: a batch's
    columns; a list of another length fails) hold ``n`` rows that each certainly pass
    ``validate`` against the spec named ``rules`` (an event kind, or ``ops``) and its
    MINIMA and ORDERED rules. ``absent``: field -> the rows that lack it (a required field
    may lack none). Nested list fields (``comm.ops``) are skipped: the caller checks their
    columns."""
    return _COLUMNS[rules](cols, n, absent)
