"""Columnar batch kinds (docs/contract.md "Batch kinds"): one host's records of one window
as ONE object of columns, and their lossless conversion to and from the per-rank kinds.

A host agent relays its ranks' ``comm`` windows as one ``comm_batch`` and their steps as
one ``step_batch``, its GPUs' samples as one ``gpu_batch`` and its NIC ports' as one
``nic_batch``: the field names are
written once per message instead of once per rank, a value every row shares is written once, and one broker message carries
a host's window. Every consumer expands a batch into its per-rank events at decode
(``expand``), so everything downstream sees exactly the events the ranks produced.

Layout (``comm_batch``; ``gpu_batch`` and ``nic_batch`` are the same over ``gpu`` / ``nic``
rows, with ``host`` shared and no nested entries; a ``nic_batch`` row is a NIC port, named
by its ``nic`` and ``port``; ``step_batch`` is ``comm_batch``'s layout without nested
entries):

- ``v``, ``kind``; the shared fields (``job_id``, ``host``): one value for the batch;
- the row field (``rank``): a list, one value per row; it says how many rows there are;
- every other field of the rows: a list with one value per row, or a single value when
  every row has the same one (only fields whose contract type is not a list);
- ``ops_len``: how many ``ops`` entries each row has (a list, or one number for all);
  ``ops``: an object of columns over all rows' entries, in row order, by the same rules;
- ``absent`` / ``ops_absent``: ``{field: [row or entry indexes]}`` where a field given as
  a column is missing (not null) in the original; omitted when nothing is missing.

>>> rows = [{"v": 1, "kind": "gpu", "ts": 5.0, "host": "h0", "gpu": g, "uuid": f"U{g}"}
...         for g in range(2)]
>>> b = to_batch(rows)
>>> b["gpu"], b["uuid"], b["ts"]
([0, 1], ['U0', 'U1'], 5.0)
>>> expand(b) == rows
True
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import contains, itemgetter, le, lt, mul
from typing import Any

import numpy as np

from failslow.schema.events import MINIMA, NESTED, OPS_MAX, ORDERED, SPECS, VERSION, SchemaError
from failslow.schema.fast import _PACK, _ordered, all_valid, column_check, columns_ok, packed


@dataclass(frozen=True)
class BatchKind:
    """How one batch kind maps to its per-row kind."""

    row_kind: str              # the kind of each row: ``comm``, ``gpu``
    shared: tuple[str, ...]    # fields with one value per batch (what the batch groups by)
    row_key: str               # the always-a-list field that names a row (rank, gpu index)
    nested: str | None = None  # the list-of-objects field flattened into columns
    # the fields that together name a row, when the row key alone does not (a NIC's ports)
    row_id: tuple[str, ...] = ()
    # where ``batch_trace`` (and `failslow detect`'s ts order) puts a batch among the other
    # events: at its first row (False), or at its newest (True: a host's steps, sent once the
    # last of its ranks ended the step, never before a rank's windows of that step)
    at_last: bool = False


BATCH_KINDS: dict[str, BatchKind] = {
    "comm_batch": BatchKind("comm", ("job_id", "host"), "rank", "ops"),
    "gpu_batch": BatchKind("gpu", ("host",), "gpu"),
    "nic_batch": BatchKind("nic", ("host",), "nic", row_id=("nic", "port")),
    "step_batch": BatchKind("step", ("job_id", "host"), "rank", at_last=True),
}
ROW_BATCH = {spec.row_kind: kind for kind, spec in BATCH_KINDS.items()}
# A host has at most a few dozen GPUs: the bound stops a forged batch from making a
# consumer allocate millions of rows out of one small message.
ROWS_MAX = 1024
ABSENT = "absent"
# Contract field types whose value is itself a list: always written as a column.
_LIST_TYPES = frozenset(("ints", "nums", *NESTED))


class BatchError(ValueError):
    """Events that one batch cannot hold (mixed hosts, a reserved field name, ...);
    the caller sends them per rank instead."""


def is_batch(obj: Any) -> bool:
    if type(obj) is not dict:
        return False
    kind = obj.get("kind")
    return type(kind) is str and kind in BATCH_KINDS


def _scalar_fields(spec: tuple[dict, dict]) -> frozenset[str]:
    """Fields that a batch may write once (their contract type is not a list)."""
    return frozenset(name for part in spec for name, t in part.items()
                     if t not in _LIST_TYPES)


_SCALAR = {kind: _scalar_fields(SPECS[b.row_kind]) for kind, b in BATCH_KINDS.items()}
_NESTED_SCALAR = {name: _scalar_fields(spec) for name, spec in NESTED.items()}


def _reserved(bk: BatchKind) -> frozenset[str]:
    names = {"v", "kind", ABSENT}
    if bk.nested:
        names |= {f"{bk.nested}_len", f"{bk.nested}_{ABSENT}"}
    return frozenset(names)


# The fields a batch's columns check (``schema.fast.columns_ok``) and the layout's own:
# per batch kind, and per nested list field (``ops``).
_KNOWN = {**{kind: frozenset((*SPECS[b.row_kind][0], *SPECS[b.row_kind][1], *_reserved(b),
                              *((b.nested,) if b.nested else ())))
             for kind, b in BATCH_KINDS.items()},
          **{name: frozenset((*spec[0], *spec[1])) for name, spec in NESTED.items()}}


# -- per-rank events -> batch ---------------------------------------------------------------

def _same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` encode to the same JSON (1 is not 1.0 nor True; -0.0 is not 0.0)."""
    if type(a) is not type(b) or a != b:
        return False
    return type(a) is not float or math.copysign(1.0, a) == math.copysign(1.0, b)


def _columns(rows: list[dict], skip: frozenset[str], scalar: frozenset[str],
             always_list: str | None = None) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """The fields of ``rows`` (first-seen order) as columns, a shared value written once;
    and, per column, the rows that lack the field."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    cols: dict[str, Any] = {}
    absent: dict[str, list[int]] = {}
    for name in names:
        if name in skip:
            continue
        missing = [i for i, row in enumerate(rows) if name not in row]
        values = [row.get(name) for row in rows]
        if missing:
            absent[name] = missing
        elif name in scalar and name != always_list and all(_same(x, values[0])
                                                           for x in values):
            cols[name] = values[0]
            continue
        cols[name] = values
    return cols, absent


def to_batch(rows: list[dict]) -> dict[str, Any]:
    """One batch of ``rows``: events of one kind (``comm`` or ``gpu``) that share the
    batch's shared fields. ``expand`` gives ``rows`` back exactly (order, absent and null
    fields, unknown extra fields). Raises ``BatchError`` for rows that one batch cannot
    hold (then send them as they are)."""
    if not rows:
        raise BatchError("no rows")
    row_kind = rows[0].get("kind")
    kind = ROW_BATCH.get(row_kind) if isinstance(row_kind, str) else None
    if kind is None:
        raise BatchError(f"kind {row_kind!r} has no batch kind")
    if len(rows) > ROWS_MAX:
        raise BatchError(f"{len(rows)} rows, at most {ROWS_MAX}")
    bk = BATCH_KINDS[kind]
    reserved = _reserved(bk)
    for row in rows:
        if type(row) is not dict or row.get("kind") != row_kind or not _same(row.get("v"),
                                                                            VERSION):
            raise BatchError(f"not all rows are v{VERSION} {row_kind} events")
        if bk.row_key not in row:
            raise BatchError(f"a row has no {bk.row_key}")
        if any(name in row for name in reserved if name not in ("v", "kind")):
            raise BatchError(f"a row has a field named like a batch column ({sorted(reserved)})")
        if bk.nested and (type(row.get(bk.nested)) is not list
                          or any(type(e) is not dict for e in row[bk.nested])):
            raise BatchError(f"a row's {bk.nested} is not a list of objects")
    for name in bk.shared:
        first = rows[0].get(name)
        if type(first) is not str or any(name not in r or not _same(r[name], first) for r in rows):
            raise BatchError(f"rows do not share one {name}")
    # the fields in the rows' order, so that expanded rows list them in that order too
    out: dict[str, Any] = {"v": VERSION, "kind": kind}
    cols, absent = _columns(rows, reserved, _SCALAR[kind], always_list=bk.row_key)
    for name, col in cols.items():
        if name == bk.nested:
            _put_nested(out, bk.nested, [row[name] for row in rows])
        else:
            out[name] = col
    if absent:
        out[ABSENT] = absent
    return out


def _put_nested(out: dict[str, Any], name: str, lists: list[list[dict]]) -> None:
    lens = [len(x) for x in lists]
    out[f"{name}_len"] = lens[0] if all(n == lens[0] for n in lens) else lens
    entries = [e for x in lists for e in x]
    cols, absent = _columns(entries, frozenset(), _NESTED_SCALAR[name])
    out[name] = cols
    if absent:
        out[f"{name}_{ABSENT}"] = absent


def group_key(ev: dict) -> tuple | None:
    """The batch an event belongs in (kind and shared fields), or None: not batchable."""
    row_kind = ev.get("kind")
    kind = ROW_BATCH.get(row_kind) if type(row_kind) is str else None
    if kind is None:
        return None
    shared = tuple(ev.get(name) for name in BATCH_KINDS[kind].shared)
    return (kind, *shared) if all(type(x) is str for x in shared) else None


def to_batches(events: Iterable[Any]) -> list[Any]:
    """``events`` with each group of batchable ones (same kind and shared fields) as one
    batch, in place of the group's first event; the others as they are, in order. A group
    that one batch cannot hold stays per rank."""
    out: list[Any] = []
    groups: dict[tuple, list[dict]] = {}
    for ev in events:
        key = group_key(ev) if type(ev) is dict else None
        if key is None:
            out.append(ev)
            continue
        group = groups.get(key)
        if group is None or len(group) >= ROWS_MAX:
            groups[key] = group = []
            out.append(group)
        group.append(ev)
    result: list[dict] = []
    for item in out:
        if type(item) is not list:
            result.append(item)
            continue
        try:
            result.append(to_batch(item))
        except BatchError:
            result += item
    return result


# -- batch -> per-rank events ---------------------------------------------------------------

def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _shown(name: str) -> str:
    """A field name from the input as it goes into an error line (one line, whatever it
    holds)."""
    return name if name.isidentifier() else repr(name)


def _fill(where: str, targets: list[dict], name: str, value: Any, list_only: bool) -> None:
    n = len(targets)
    if type(value) is list:
        if len(value) != n:
            raise SchemaError(f"{where}.{_shown(name)}: {len(value)} values for {n} rows")
        for row, x in zip(targets, value, strict=True):
            row[name] = x
    elif list_only:
        raise SchemaError(f"{where}.{_shown(name)}: expected a list with one value per row, got "
                          f"{type(value).__name__} {_short(value)}")
    else:
        for row in targets:
            row[name] = value


def _remove_absent(where: str, targets: list[dict], absent: Any) -> None:
    if type(absent) is not dict:
        raise SchemaError(f"{where}: expected an object of field: [indexes], got "
                          f"{type(absent).__name__}")
    n = len(targets)
    for name, idxs in absent.items():
        if type(idxs) is not list or any(type(i) is not int or not 0 <= i < n for i in idxs):
            raise SchemaError(f"{where}.{_shown(name)}: expected a list of indexes below {n}")
        for i in idxs:
            if name not in targets[i]:
                raise SchemaError(f"{where}.{_shown(name)}: names index {i} twice, or a field "
                                  "that is not a column")
            del targets[i][name]


def expand(obj: dict[str, Any]) -> list[dict]:
    """The per-rank events of one batch, in its row order; raises ``SchemaError`` (one line
    naming the field) when the batch's layout is wrong. The rows themselves are not
    validated here: the caller validates them as any event."""
    kind: str = obj["kind"]
    bk = BATCH_KINDS[kind]
    v = obj.get("v")
    if v != VERSION or type(v) is not int:
        raise SchemaError(f"{kind}.v: unknown version {v!r} (this reader knows v=1)")
    keys = obj.get(bk.row_key)
    if type(keys) is not list or not keys:
        raise SchemaError(f"{kind}.{bk.row_key}: expected a non-empty list, one value per row, "
                          f"got {type(keys).__name__} {_short(keys)}")
    if len(keys) > ROWS_MAX:
        raise SchemaError(f"{kind}.{bk.row_key}: {len(keys)} rows, at most {ROWS_MAX}")
    for name in bk.shared:
        value = obj.get(name)
        if value is None:
            raise SchemaError(f"{kind}.{name}: required field is missing")
        if type(value) is list:
            raise SchemaError(f"{kind}.{name}: expected one value for the batch, got a list")
    rows: list[dict] = [{"v": VERSION, "kind": bk.row_kind} for _ in keys]
    scalar = _SCALAR[kind]
    reserved = _reserved(bk)
    for name, value in obj.items():
        if name in reserved:
            continue
        if name == bk.nested:
            _expand_nested(kind, bk.nested, obj, rows)
        elif name in bk.shared:
            for row in rows:
                row[name] = value
        else:
            _fill(kind, rows, name, value, list_only=name not in scalar)
    if ABSENT in obj:
        _remove_absent(f"{kind}.{ABSENT}", rows, obj[ABSENT])
    if bk.nested and bk.nested not in obj:
        raise SchemaError(f"{kind}.{bk.nested}: required field is missing")
    return rows


def _expand_nested(kind: str, name: str, obj: dict[str, Any], rows: list[dict]) -> None:
    where = f"{kind}.{name}"
    cols = obj[name]
    if type(cols) is not dict:
        raise SchemaError(f"{where}: expected an object of columns, got {type(cols).__name__}")
    lens = obj.get(f"{name}_len")
    if type(lens) is int:
        lens = [lens] * len(rows)
    if (type(lens) is not list or len(lens) != len(rows)
            or any(type(n) is not int or n < 0 for n in lens)):
        raise SchemaError(f"{where}_len: expected a count of entries per row (a list of "
                          f"{len(rows)} integers >= 0, or one), got {_short(lens)}")
    total = sum(lens)
    if total > len(rows) * NESTED_MAX:
        raise SchemaError(f"{where}_len: {total} entries, at most {NESTED_MAX} a row")
    entries: list[dict] = [{} for _ in range(total)]
    scalar = _NESTED_SCALAR[name]
    for field, value in cols.items():
        if type(value) is list and len(value) != total:
            raise SchemaError(f"{where}.{_shown(field)}: {len(value)} values for {total} "
                              "entries")
        _fill(where, entries, field, value, list_only=field not in scalar)
    if f"{name}_{ABSENT}" in obj:
        _remove_absent(f"{where}_{ABSENT}", entries, obj[f"{name}_{ABSENT}"])
    at = 0
    for row, n in zip(rows, lens, strict=True):
        row[name] = entries[at:at + n]
        at += n


# An entry list longer than this fails row validation anyway (schema.events.OPS_MAX).
NESTED_MAX = 1024


def _absent_ok(absent: Any, cols: dict[str, Any], n: int) -> bool:
    """An ``absent`` map that ``expand`` takes: fields given as columns, each row once."""
    if type(absent) is not dict:
        return False
    for name, idxs in absent.items():
        if (type(cols.get(name)) is not list or type(idxs) is not list
                or not all(type(i) is int for i in idxs)):
            return False
        if idxs and (min(idxs) < 0 or max(idxs) >= n or len(set(idxs)) != len(idxs)):
            return False
    return True


def valid(obj: dict[str, Any]) -> bool:
    """True when ``obj`` (a batch: ``is_batch``) certainly expands and every row passes
    ``validate``: its layout and its columns checked at once, a column per pass, with no
    row made. False sends the caller to ``expand_checked``, which names what is wrong
    and keeps the valid rows. A consumer that reads a batch's columns (the detector's
    telemetry) takes only batches that pass."""
    try:
        return _valid(obj)
    except (TypeError, ValueError):     # a column of mixed types that min() cannot order
        return False


def _rows(obj: dict[str, Any], bk: BatchKind) -> int:
    """A batch's row count when its version, row column and shared fields are right, else
    0 (a batch has at least one row)."""
    v = obj.get("v")
    if type(v) is not int or v != VERSION:
        return 0
    keys = obj.get(bk.row_key)
    if type(keys) is not list or not 0 < len(keys) <= ROWS_MAX:
        return 0
    for name in bk.shared:
        if type(obj.get(name)) is not str:
            return 0
    return len(keys)


def _valid(obj: dict[str, Any]) -> bool:
    kind: str = obj["kind"]
    bk = BATCH_KINDS[kind]
    n = _rows(obj, bk)
    if not n:
        return False
    # a column's length and a field's form (a list-typed field is a column) are checked
    # with its values (``columns_ok``); a field the contract does not name is a column
    extra = obj.keys() - _KNOWN[kind]
    if extra and not _extra_ok(obj, extra, n):
        return False
    absent = obj.get(ABSENT, {})
    if absent and not _absent_ok(absent, obj, n):
        return False
    if not columns_ok(bk.row_kind, obj, n, absent):
        return False
    if bk.nested is None:
        return True
    name = bk.nested
    cols = obj.get(name)
    lens = obj.get(f"{name}_len")
    if type(cols) is not dict:
        return False
    if type(lens) is int:
        lens = [lens] * n
    if type(lens) is not list or len(lens) != n or not all(type(x) is int for x in lens) \
            or min(lens) < 0 or max(lens) > OPS_MAX:
        return False
    total = sum(lens)
    if total == 0:
        nscalar = _NESTED_SCALAR[name]
        return all(not value if type(value) is list else field in nscalar
                   for field, value in cols.items())
    extra = cols.keys() - _KNOWN[name]
    if extra and not _extra_ok(cols, extra, total):
        return False
    nabsent = obj.get(f"{name}_{ABSENT}", {})
    if nabsent and not _absent_ok(nabsent, cols, total):
        return False
    return columns_ok(name, cols, total, nabsent)


def valid_many(objs: list[dict[str, Any]]) -> bool:
    """True only when every batch of ``objs`` passes ``valid``: the batches of each kind
    checked together, a field at a time over all of them (the field's values of every
    batch joined, then one type set, one min and max: a value passes in its batch exactly
    when in the joined values). A chunk of a trace holds a hundred batches of a kind and
    a C-level pass per column of each was most of their validation. False: some batch
    may be wrong (``valid`` then checks each)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for o in objs:
        by.setdefault(o["kind"], []).append(o)
    try:
        return all(_valid_many(kind, group) for kind, group in by.items())
    except (TypeError, ValueError, KeyError, AttributeError):
        return False


_EMPTY: dict[str, Any] = {}
_LIST_ONLY = frozenset((list,))
_INT_ONLY = frozenset((int,))
_STR_ONLY = frozenset((str,))
_DICT_ONLY = frozenset((dict,))
_INT_OR_LIST = frozenset((int, list))
_NONE = type(None)
_REQUIRED = {name: frozenset(f for f, t in spec[0].items() if t not in NESTED)
             for name, spec in (*SPECS.items(), *NESTED.items())}
# (contract type, MINIMA bound) -> the check of a joined column (``schema.fast``)
_CHECKS: dict[tuple[str, Any], Callable[[list, Any], bool]] = {
    (repr(t), MINIMA.get(rules, {}).get(name)): column_check(t, MINIMA.get(rules, {}).get(name))
    for rules, spec in (*SPECS.items(), *NESTED.items())
    for part in spec for name, t in part.items() if t not in NESTED}


def _valid_many(kind: str, objs: list[dict[str, Any]]) -> bool:
    bk = BATCH_KINDS[kind]
    ns = _rows_alike(kind, bk, objs)
    if ns is None:
        ns = []
        for o in objs:           # the layout, batch by batch (``_valid``'s checks)
            n = _rows(o, bk)
            if not n:
                return False
            ns.append(n)
            extra = o.keys() - _KNOWN[kind]
            if extra and not _extra_ok(o, extra, n):
                return False
            absent = o.get(ABSENT, _EMPTY)
            if type(absent) is not dict or absent and not (
                    _absent_ok(absent, o, n)
                    and absent.keys().isdisjoint(_REQUIRED[bk.row_kind])):
                return False
    if not _columns_many(bk.row_kind, objs, ns):
        return False
    if bk.nested is None:
        return True
    name = bk.nested
    alike = _nested_alike(name, objs, ns)
    if alike is not None:
        return _columns_many(name, *alike)
    subs, totals = [], []
    for o, n in zip(objs, ns, strict=True):
        cols = o.get(name)
        lens = o.get(f"{name}_len")
        if type(cols) is not dict:
            return False
        if type(lens) is int:
            if not 0 <= lens <= OPS_MAX:
                return False
            total = lens * n
        elif type(lens) is list and len(lens) == n and set(map(type, lens)) == _INT_ONLY \
                and min(lens) >= 0 and max(lens) <= OPS_MAX:
            total = sum(lens)
        else:
            return False
        if total == 0:
            nscalar = _NESTED_SCALAR[name]
            if not all(not value if type(value) is list else field in nscalar
                       for field, value in cols.items()):
                return False
            continue
        extra = cols.keys() - _KNOWN[name]
        if extra and not _extra_ok(cols, extra, total):
            return False
        nabsent = o.get(f"{name}_{ABSENT}", _EMPTY)
        if type(nabsent) is not dict or nabsent and not (
                _absent_ok(nabsent, cols, total) and nabsent.keys().isdisjoint(_REQUIRED[name])):
            return False
        subs.append(cols)
        totals.append(total)
    return not subs or _columns_many(name, subs, totals)


def _rows_alike(kind: str, bk: BatchKind, objs: list[dict[str, Any]]) -> list[int] | None:
    """The rows of each of ``objs`` when all are laid out the usual way (the version, a
    row column, the shared fields, no field the contract does not name, nothing absent):
    ``_valid_many``'s checks of each batch's layout as a few C-level passes over all of them
    (a loop over a chunk's hundred batches of a kind was a tenth of their validation);
    None: some batch is not, each is checked on its own."""
    vs = list(map(dict.get, objs, repeat("v")))
    if vs.count(VERSION) != len(vs) or set(map(type, vs)) != _INT_ONLY:
        return None
    keys: list[Any] = list(map(dict.get, objs, repeat(bk.row_key)))
    if set(map(type, keys)) != _LIST_ONLY:
        return None
    ns = list(map(len, keys))
    if min(ns) <= 0 or max(ns) > ROWS_MAX:
        return None
    for name in bk.shared:
        if set(map(type, map(dict.get, objs, repeat(name)))) != _STR_ONLY:
            return None
    if not all(map(_KNOWN[kind].issuperset, objs)):
        return None
    absent = list(map(dict.get, objs, repeat(ABSENT), repeat(_EMPTY)))
    return ns if absent.count(_EMPTY) == len(absent) else None


def _nested_alike(name: str, objs: list[dict[str, Any]], ns: list[int]
                  ) -> tuple[list[dict[str, Any]], list[int]] | None:
    """``_rows_alike`` for the nested entries (``comm_batch.ops``): their columns and
    counts when every batch has entries, no field the contract does not name, and fields
    absent only as lists of distinct entries of their own; None: each batch is checked on
    its own."""
    cols: list[Any] = list(map(dict.get, objs, repeat(name)))
    lens: list[Any] = list(map(dict.get, objs, repeat(f"{name}_len")))
    if set(map(type, cols)) != _DICT_ONLY:
        return None
    kinds = set(map(type, lens))
    if kinds == _INT_ONLY:
        if min(lens) <= 0 or max(lens) > OPS_MAX:
            return None
        totals = list(map(mul, lens, ns))
    elif kinds <= _INT_OR_LIST:       # a few hosts whose ranks have different counts
        totals = []
        for x, n in zip(lens, ns, strict=True):
            if type(x) is int:
                if not 0 < x <= OPS_MAX:
                    return None
                totals.append(x * n)
            elif len(x) == n and set(map(type, x)) == _INT_ONLY and min(x) >= 0 \
                    and max(x) <= OPS_MAX and sum(x):
                totals.append(sum(x))
            else:
                return None
    else:
        return None
    if not all(map(_KNOWN[name].issuperset, cols)):
        return None
    nabs: list[Any] = list(map(dict.get, objs, repeat(f"{name}_{ABSENT}"), repeat(_EMPTY)))
    if set(map(type, nabs)) != _DICT_ONLY:
        return None
    for field in set().union(*nabs):
        has = list(map(contains, nabs, repeat(field)))     # the batches it is absent in
        if field in _REQUIRED[name] or set(map(type, map(dict.get, compress(cols, has),
                                                             repeat(field)))) != _LIST_ONLY:
            return None
        idxs: list[Any] = list(map(itemgetter(field), compress(nabs, has)))
        if set(map(type, idxs)) != _LIST_ONLY:
            return None
        k = list(map(len, idxs))
        if 0 in k or set(map(type, chain.from_iterable(idxs))) != _INT_ONLY \
                or min(map(min, idxs)) < 0 \
                or not all(map(lt, map(max, idxs), compress(totals, has))) \
                or list(map(len, map(set, idxs))) != k:
            return None
    return cols, totals


# The type a column of each contract type holds (what ``_types`` counts first)
_COMMON: dict[str, type] = {"num": float, "time": float, "int": int, "i32": int, "str": str,
                            "bool": bool, "obj": dict, "ints": list, "nums": list}
_ONLY: dict[type, frozenset[type]] = {t: frozenset((t,))
                                     for t in (float, int, str, bool, dict, list)}


def _types(x: Sequence[Any], common: type) -> frozenset[type] | set[type]:
    """``set(map(type, x))``; when every value is of type ``common`` (a column's usual
    type), by a count of a list of the types: a C-level pass that costs ~40 % less than
    a set's hashing (the check of every value of a batch column is that pass)."""
    tl = list(map(type, x))
    if tl and tl.count(common) == len(tl):
        return _ONLY[common]
    return set(tl)


# the fields of each spec's ORDERED rules; a marker: a field no dict has a value of
_ORDERED_FIELDS = {rules: frozenset(chain.from_iterable(pairs))
                   for rules, pairs in ORDERED.items()}
_NONE_ONLY = frozenset((_NONE,))
# per spec, its fields checked as columns (not the nested ones)
_FIELD_NAMES = {rules: tuple(name for part in spec for name, t in part.items()
                             if t not in NESTED)
                for rules, spec in (*SPECS.items(), *NESTED.items())}
_NO_VALUES: list[Any] = []
_F53 = 2.0 ** 53


_ENUMS = {t: frozenset(t) for rules, spec in (*SPECS.items(), *NESTED.items())
          for part in spec for t in part.values() if type(t) is tuple}


def _column_ok(name: str, ftype: Any, opt: bool, x: list[Any], kinds: Any, low: Any,
               ns: list[int], rowwise: dict[str, Any] | None) -> bool:
    """One joined column ``x`` of field ``name`` (``kinds``: the types of the dicts' values
    of it; ``opt``: optional) checked against its contract type ``ftype`` and MINIMA bound
    ``low``; its values row by row put in ``rowwise`` (given when an ORDERED rule names
    it) where they are all there."""
    if type(ftype) is tuple and rowwise is None:
        # one of a few strings: the set of the values is their check (a value of another
        # type is none of them; a list or a dict is no member of a set: TypeError)
        values = set(x)
        if None in values:
            if not opt:
                return False
            values.discard(None)
        return values <= _ENUMS[ftype]
    t = _types(x, _COMMON.get(ftype, str) if type(ftype) is str else str)
    if rowwise is not None:
        if kinds == _NONE_ONLY:       # no dict has a value: no rule to check
            rowwise[name] = _NO_VALUES
        elif _NONE not in t:
            if kinds == _LIST_ONLY:
                rowwise[name] = x
            elif list not in kinds:   # one value per dict, for each of its rows
                rowwise[name] = list(chain.from_iterable(map(repeat, x, ns)))
    if _NONE in t:
        if not opt:
            return False
        t = t - {_NONE}
        x = [y for y in x if y is not None]
    return not t or _CHECKS[repr(ftype), low](x, t)


def _rowwise(a: np.ndarray, x: list[Any], joined: bool, ns: list[int]) -> Any:
    """A checked column (``packed``: ``a``, from the values ``x``) row by row over all
    dicts, for its ORDERED rules: ``x`` as it is when ``joined`` (a list per dict), else
    each dict's one value repeated for its rows; an array when it holds the values exactly
    (ints; floats within 2**53, where every int is a float too), else a list."""
    if a.dtype != np.float64 or -_F53 < a.min() and a.max() < _F53:
        return a if joined else np.repeat(a, ns)
    return x if joined else list(chain.from_iterable(map(repeat, x, ns)))


def _columns_many(rules: str, dicts: list[dict[str, Any]], ns: list[int]) -> bool:
    """``schema.fast.columns_ok(rules, d, n, ...)`` of every ``d`` of ``dicts`` (``ns``: its
    rows), a field at a time over all of them (the absent maps are the caller's)."""
    spec = SPECS[rules] if rules in SPECS else NESTED[rules]
    lows = MINIMA.get(rules, {})
    gets = [d.get for d in dicts]
    # the fields the first dict has, taken from every dict at once (one C-level call per
    # dict, then transposed) when every dict has them (a chunk's batches of a kind are
    # written alike); a field the first lacks, or all when some dict lacks one, one by one
    d0 = dicts[0]
    have = [name for name in _FIELD_NAMES[rules] if name in d0]
    taken: dict[str, Any] = {}
    if len(have) > 1:
        try:
            taken = dict(zip(have, zip(*map(itemgetter(*have), dicts), strict=True),
                             strict=True))
        except KeyError:
            pass
    # the joined columns of ORDERED fields, row by row over all dicts (no None among them),
    # so that each (low, high) rule is one C-level pass, not a call per dict
    pairs = ORDERED.get(rules, ())
    wanted = _ORDERED_FIELDS.get(rules, frozenset())
    rowwise: dict[str, Any] = {}
    packs: dict[str, list[tuple[str, Any, bool, list[Any], Any]]] = {}
    for fields, opt in ((spec[0], False), (spec[1], True)):
        for name, ftype in fields.items():
            if ftype in NESTED:
                continue
            vals: Sequence[Any] = taken.get(name) or [g(name) for g in gets]
            kinds = _types(vals, list)
            x: list[Any]
            if ftype in _LIST_TYPES:      # a column, or (optional) missing: not null
                cols = []
                for v, d, n in zip(vals, dicts, ns, strict=True):
                    if type(v) is list:
                        if len(v) != n:
                            return False
                        cols.append(v)
                    elif v is not None or name in d or not opt:
                        return False
                x = list(chain.from_iterable(cols))
            elif kinds == _LIST_ONLY:
                if list(map(len, vals)) != ns:
                    return False
                x = list(chain.from_iterable(vals))
            elif list not in kinds:       # one value for all rows (None: no value)
                x = list(vals)
            else:
                x = []
                for v, n in zip(vals, ns, strict=True):
                    if type(v) is list:
                        if len(v) != n:
                            return False
                        x += v
                    else:
                        x.append(v)
            if ftype in _PACK and x and kinds != _NONE_ONLY:
                # the numbers: the columns of a struct format checked together, below
                packs.setdefault(_PACK[ftype], []).append((name, ftype, opt, x, kinds))
                continue
            if not _column_ok(name, ftype, opt, x, kinds, lows.get(name), ns,
                              rowwise if name in wanted else None):
                return False
    for group in packs.values():
        arrays = packed([(x, ftype, lows.get(name)) for name, ftype, _, x, _ in group])
        for (name, ftype, opt, x, kinds), a in zip(group, arrays, strict=True):
            if a is None:       # not certainly valid: the usual way
                if not _column_ok(name, ftype, opt, x, kinds, lows.get(name), ns,
                                  rowwise if name in wanted else None):
                    return False
            elif name in wanted and (kinds == _LIST_ONLY or list not in kinds):
                rowwise[name] = _rowwise(a, x, kinds == _LIST_ONLY, ns)
    for lo, hi in pairs:
        a, b = rowwise.get(lo), rowwise.get(hi)
        if a is _NO_VALUES or b is _NO_VALUES:
            continue
        if a is not None and b is not None:
            if type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype:
                if not (a <= b).all():
                    return False
                continue
            # (an array holds the values exactly: ``_rowwise``)
            a = a.tolist() if type(a) is np.ndarray else a
            b = b.tolist() if type(b) is np.ndarray else b
            if not all(map(le, a, b)):
                return False
            continue
        for d, n in zip(dicts, ns, strict=True):
            if not _ordered(d.get(lo), d.get(hi), n):
                return False
    return True


def _extra_ok(cols: dict[str, Any], extra: set[str], n: int) -> bool:
    """Fields the contract does not name (kept, not checked): each a column of ``n``."""
    return all(type(cols[name]) is list and len(cols[name]) == n for name in extra)


def take(obj: dict[str, Any], idxs: list[int]) -> dict[str, Any]:
    """The batch of rows ``idxs`` (in that order) of a valid batch without nested entries
    (``gpu_batch``): columns cut, shared and one-for-all values kept, ``absent`` renumbered.
    ``expand(take(b, idxs)) == [expand(b)[i] for i in idxs]``."""
    bk = BATCH_KINDS[obj["kind"]]
    if bk.nested is not None:
        raise ValueError(f"take: {obj['kind']} has nested entries")
    reserved = _reserved(bk)
    out: dict[str, Any] = {}
    for name, value in obj.items():
        if name == ABSENT:
            continue
        out[name] = [value[i] for i in idxs] if type(value) is list and name not in reserved \
            else value
    absent = obj.get(ABSENT)
    if absent:
        pos = {i: j for j, i in enumerate(idxs)}
        kept = {name: [pos[i] for i in rows if i in pos] for name, rows in absent.items()}
        kept = {name: rows for name, rows in kept.items() if rows}
        if kept:
            out[ABSENT] = kept
    return out


def rows_fields(obj: dict[str, Any], fields: tuple[str, ...]) -> list[dict]:
    """The rows of a valid batch without nested entries, each with only ``fields`` (a
    field its row lacks stays absent; ``kind`` is the row kind), built from the columns:
    ``[{k: row[k] for k in fields if k in row} for row in expand(obj)]``, no whole row
    made."""
    bk = BATCH_KINDS[obj["kind"]]
    n = len(obj[bk.row_key])
    rows: list[dict] = [{} for _ in range(n)]
    absent = obj.get(ABSENT) or {}
    for name in fields:
        if name == "kind" or name == "v":
            value: Any = bk.row_kind if name == "kind" else obj["v"]
        elif name in obj and name not in _reserved(bk):
            value = obj[name]
        else:
            continue
        if type(value) is list:
            for row, x in zip(rows, value, strict=True):
                row[name] = x
        else:
            for row in rows:
                row[name] = value
        for i in absent.get(name, ()):
            del rows[i][name]
    return rows


def expand_checked(obj: dict[str, Any]) -> tuple[list[dict], list[str]]:
    """A batch's valid rows and one error line per rejected row (or for the whole batch
    when its layout is wrong): ``comm_batch row 2 (rank 7): comm.ops[0].n: 0 is below 1``."""
    from failslow.schema.events import validate

    try:
        rows = expand(obj)
    except SchemaError as exc:
        return [], [str(exc)]
    if all_valid(rows):
        return rows, []
    bk = BATCH_KINDS[obj["kind"]]
    good, errors = [], []
    for i, row in enumerate(rows):
        try:
            good.append(validate(row))
        except SchemaError as exc:
            errors.append(f"{obj['kind']} row {i} ({bk.row_key} {_short(row.get(bk.row_key))})"
                          f": {exc}")
    return good, errors


def expand_all(items: list[Any]) -> Iterator[tuple[int, list[Any], list[str]]]:
    """Per item of a message array: (index, its events, its error lines). A batch gives
    its valid rows; any other item is given as it is (its validation is the caller's)."""
    for i, item in enumerate(items):
        if is_batch(item):
            good, errors = expand_checked(item)
            yield i, good, errors
        else:
            yield i, [item], []


# -- gathering a stream of per-rank events into batches -------------------------------------

class _Group:
    __slots__ = ("gid", "key", "t0", "rows", "names")

    def __init__(self, gid: int, key: tuple, t0: float) -> None:
        self.gid, self.key, self.t0 = gid, key, t0
        self.rows: list[dict] = []
        self.names: set = set()


class Batcher:
    """Gathers a stream of per-rank events into one batch per host (and job) and window.

    ``add(event, now)`` returns what is ready to send: the event itself when it is not
    batchable (a collective, a host sample), else the batches that closed. An event joins the
    oldest open group of its kind and shared fields that lacks its row (its rank, its
    GPU, its NIC port), so a rank that sends several windows at once (a backlog after an agent restart)
    still fills one batch per window. A group closes when it holds every row of the last
    ``remember`` batches of its kind and shared fields (all of the host's ranks are in;
    before any, when a row comes again), or once its first row waited ``linger_s`` (``due(now)``: a rank that is late or gone does not hold
    the others back longer). ``now`` is any clock: the relay's monotonic one, or event
    time when converting a trace (``batch_trace``). At most ``max_open`` groups of one
    kind and shared fields are open: beyond, the oldest closes."""

    def __init__(self, linger_s: float = 0.5, max_open: int = 64, remember: int = 3) -> None:
        self.linger_s = linger_s
        self.max_open = max_open
        self.remember = remember
        self._open: dict[tuple, list[_Group]] = {}
        # key -> the rows of its last ``remember`` batches: a group holding all of them
        # is complete (a rank gone for that many windows no longer holds it back)
        self._last: dict[tuple, deque[frozenset]] = {}
        self._gids = 0

    def add(self, ev: dict, now: float) -> list[dict]:
        return _flat(self._add(ev, now)[0])

    def due(self, now: float) -> list[dict]:
        """The batches whose first row waited ``linger_s``."""
        return _flat(self._due(now))

    def flush(self) -> list[dict]:
        return _flat(self._flush())

    @property
    def pending(self) -> int:
        """Rows held in open groups."""
        return sum(len(g.rows) for groups in self._open.values() for g in groups)

    def _add(self, ev: dict, now: float) -> tuple[list[tuple[int | None, list[dict]]],
                                                   int | None]:
        """(group id or None, what to send) pairs, and the id of the group ``ev`` joined
        (None: not batchable)."""
        key = group_key(ev) if type(ev) is dict else None
        if key is None:
            return [(None, [ev])], None
        bk = BATCH_KINDS[key[0]]
        row = tuple(map(ev.get, bk.row_id)) if bk.row_id else ev.get(bk.row_key)
        groups = self._open.setdefault(key, [])
        out = []
        group = next((g for g in groups if row not in g.names), None)
        if group is None:
            # a row again with nothing known of the host yet: its first window is whole
            if len(groups) >= self.max_open or (groups and key not in self._last):
                out.append(self._close(groups[0]))
                groups = self._open.setdefault(key, [])
            self._gids += 1
            group = _Group(self._gids, key, now)
            groups.append(group)
        group.rows.append(ev)
        group.names.add(row)
        known = self._last.get(key)
        if (known is not None and group.names >= frozenset().union(*known)
                or len(group.rows) >= ROWS_MAX):
            out.append(self._close(group))
        return out, group.gid

    def _due(self, now: float) -> list[tuple[int | None, list[dict]]]:
        return [self._close(g) for groups in list(self._open.values()) for g in list(groups)
                if now - g.t0 >= self.linger_s]

    def _flush(self) -> list[tuple[int | None, list[dict]]]:
        return [self._close(g) for groups in list(self._open.values()) for g in list(groups)]

    def _close(self, group: _Group) -> tuple[int | None, list[dict]]:
        groups = self._open[group.key]
        groups.remove(group)
        if not groups:
            del self._open[group.key]
        self._last.setdefault(group.key, deque(maxlen=self.remember)).append(
            frozenset(group.names))
        if len(self._last) > 4 * ROWS_MAX:   # hosts and jobs long gone
            self._last = {k: v for k, v in self._last.items() if k in self._open}
        try:
            return group.gid, [to_batch(group.rows)]
        except BatchError:
            return group.gid, group.rows


def _flat(pairs: list[tuple[int | None, list[dict]]]) -> list[dict]:
    return [ev for _, items in pairs for ev in items]


def batch_trace(events: Iterable[dict], linger_s: float = 0.5) -> Iterator[dict]:
    """A per-rank trace as a host agent would publish it: ``comm`` windows, ``step``
    events, ``gpu`` and ``nic`` samples gathered per host and window (event time,
    ``linger_s``), the rest as it is.
    A batch takes the place of its first row, so no row moves after an event it came
    before (a rank's window before its step end); a ``step_batch`` the place of its newest
    row (``BatchKind.at_last``), so no step moves before its rank's windows and the step is
    complete where its last rank's step was: ``failslow detect`` gives the same incidents
    on both."""
    batcher = Batcher(linger_s)
    return placed(events, batcher._add, batcher._due, batcher._flush,
                  lambda: bool(batcher._open))


Pairs = list[tuple[int | None, list[dict]]]   # (group id or None, what to send)


def placed(events: Iterable[dict], add: Callable[[dict, float], tuple[Pairs, int | None]],
           due: Callable[[float], Pairs], flush: Callable[[], Pairs],
           any_open: Callable[[], bool]) -> Iterator[dict]:
    """What a batcher (``add(event, now)``: what closed and the group the event joined;
    ``due(now)``, ``flush()``) makes of a trace on its event time, each batch in the place
    ``batch_trace`` says: where its first row was (a ``step_batch``: its newest row)."""
    slots: deque[list] = deque()          # [what to send], or [None] while its group is open
    waiting: dict[int, list] = {}         # group id -> its slot

    def fill(pairs: Pairs) -> None:
        for gid, items in pairs:
            if gid is None:
                slots.append([items])
            else:
                waiting.pop(gid)[0] = items

    for ev in events:
        pairs, gid = add(ev, ev["ts"])
        if gid is not None:
            slot = waiting.get(gid)
            if slot is None or BATCH_KINDS[ROW_BATCH[ev["kind"]]].at_last:
                if slot is not None:
                    slot[0] = []          # the batch moves on to its newest row
                waiting[gid] = slot = [None]
                slots.append(slot)
        fill(pairs)
        if any_open() and type(ev["ts"]) is not list:   # (a batch already made: no clock)
            fill(due(ev["ts"]))
        while slots and slots[0][0] is not None:
            yield from slots.popleft()[0]
    fill(flush())
    while slots:
        yield from slots.popleft()[0]


def split_batch(obj: dict[str, Any], part_of: Any) -> dict[Any, list[dict]]:
    """A batch cut by ``part_of(row)`` (e.g. the shard of its rank): part -> what to send
    there, the batch itself when all of its rows fall in one part (most batches: one host's
    ranks are neighbours), else a batch per part. A batch whose layout is wrong goes whole
    to ``part_of({})``, whose consumer reports it."""
    try:
        rows = expand(obj)
    except SchemaError:
        return {part_of({}): [obj]}
    parts: dict[Any, list[dict]] = {}
    for row in rows:
        parts.setdefault(part_of(row), []).append(row)
    if len(parts) == 1:
        return {next(iter(parts)): [obj]}
    out: dict[Any, list[dict]] = {}
    for part, group in parts.items():
        try:
            out[part] = [to_batch(group)]
        except BatchError:
            out[part] = group
    return out
