"""Event tables: one event kind as columns, turned into event dicts or JSON Lines bytes.

The file path never builds dicts: every column is formatted for all rows at once
in numpy (digits from a 4-digit lookup table) into a (rows, width) byte matrix
with a keep-mask, and the kept bytes, row after row, are the lines. Floats carry
the number of decimals they were rounded to: ``round(x, d)`` is the double
nearest to the decimal ``k / 10**d`` (``k = rint(x * 10**d)``), so printing that
decimal parses back to exactly ``x``. Small tables (a few events) go through
``orjson`` instead: there numpy's per-call cost would dominate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
import orjson

# "0000".."9999" as native uint32, so one gather writes four digits.
_LUT4 = np.array([f"{i:04d}".encode() for i in range(10_000)], dtype="S4").view(np.uint32)
_POW10 = 10 ** np.arange(1, 19, dtype=np.int64)
_COL = np.arange(64)
# Rows: below these, dicts + orjson are faster than numpy formatting (per-call costs).
SMALL_TABLE = 48
SMALL_CHUNK = 1000


class Choices:
    """A few JSON values picked per row by index (host names, group names, null-or-int).

    The encoded table is built once and reused across tables."""

    def __init__(self, values: list):
        self.values = values

    @cached_property
    def objects(self) -> np.ndarray:
        # A gather from an object array beats a list comprehension over the index.
        out = np.empty(len(self.values), dtype=object)
        out[:] = self.values
        return out

    @cached_property
    def encoded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raw = [orjson.dumps(v) for v in self.values]
        mat = np.array(raw, dtype=f"S{max(map(len, raw))}")
        mat = mat.view(np.uint8).reshape(len(raw), -1)
        return _void(mat), _void(mat != 0), np.array([len(r) for r in raw])


@dataclass
class Num:
    """Numbers: ints (``decimals`` None) or floats already rounded to ``decimals``."""

    values: np.ndarray
    decimals: int | None = None


@dataclass
class Pick:
    """Per-row choice: ``choices.values[index]``."""

    index: np.ndarray
    choices: Choices


@dataclass
class Const:
    """The same value on every row."""

    value: object


Column = Num | Pick | Const


class Table:
    """``n`` events of one kind: ordered (field, column) pairs and every row's ts."""

    def __init__(self, fields: list[tuple[str, Column]], ts: np.ndarray):
        self.fields, self.ts, self.n = fields, ts, len(ts)

    def dicts(self) -> list[dict]:
        keys, consts, columns = [], [], []
        for key, col in self.fields:
            keys.append(key)
            if isinstance(col, Const):
                consts.append(col.value)
            else:
                columns.append(_values(col))
        shape = tuple((k, isinstance(c, Const)) for k, c in self.fields)
        return list(map(_builder(shape)(*consts), *columns))

    def take(self, rows: np.ndarray) -> Table:
        return Table([(k, _take(c, rows)) for k, c in self.fields], self.ts[rows])

    def lines(self) -> tuple[memoryview, np.ndarray]:
        """The JSON lines (newline-terminated) and each line's length in bytes."""
        if self.n < SMALL_TABLE:
            raw = [orjson.dumps(d) + b"\n" for d in self.dicts()]
            return memoryview(b"".join(raw)), np.array([len(r) for r in raw], dtype=np.int64)
        return _render(self.fields, self.n)


def _values(col: Num | Pick) -> list:
    if isinstance(col, Num):
        return col.values.tolist()
    return col.choices.objects[col.index].tolist()


@cache
def _builder(shape: tuple[tuple[str, bool], ...]):
    """``make(const, ...)(value, ...) -> {key: value, ...}`` for fields (key, is_const):
    a dict display with the constants bound runs about twice as fast as
    ``dict(zip(keys, row))`` (measured on 45k collectives). Keys are our field names."""
    consts = ", ".join(f"a{i}" for i, (_, const) in enumerate(shape) if const)
    values = ", ".join(f"a{i}" for i, (_, const) in enumerate(shape) if not const)
    body = ", ".join(f"{key!r}: a{i}" for i, (key, _) in enumerate(shape))
    return eval(f"lambda {consts}: lambda {values}: {{{body}}}")


def _take(col: Column, rows: np.ndarray) -> Column:
    if isinstance(col, Num):
        return Num(col.values[rows], col.decimals)
    if isinstance(col, Pick):
        return Pick(col.index[rows], col.choices)
    return col


# -- vectorized formatting ------------------------------------------------------
# A block is one field's text on every row: (text, keep, length). ``text`` is a (n,)
# array of fixed-width void items (or one item for all rows), ``keep`` says which of
# its bytes are output (None: all), ``length`` how many. Void items make numpy copy
# a whole field per row at once instead of looping over its bytes.

Block = tuple[np.ndarray | np.void, np.ndarray | None, np.ndarray | int]


def _render(fields: list[tuple[str, Column]], n: int) -> tuple[memoryview, np.ndarray]:
    blocks: list[Block] = []
    text = b"{"
    for i, (key, col) in enumerate(fields):
        text += orjson.dumps(key) + b":"
        if isinstance(col, Const):
            text += orjson.dumps(col.value)
        else:
            blocks.append(_literal(text))
            blocks += _number(col) if isinstance(col, Num) else [_pick(col)]
            text = b""
        text += b"," if i < len(fields) - 1 else b"}\n"
    blocks.append(_literal(text))
    width = sum(b[0].dtype.itemsize for b in blocks)
    out = np.empty((n, width), dtype=np.uint8)
    keep = np.ones((n, width), dtype=bool)
    lengths = np.zeros(n, dtype=np.int64)
    at = 0
    for text_, kp, length in blocks:
        w = text_.dtype.itemsize
        _void(out[:, at:at + w])[...] = text_
        if kp is not None:
            _void(keep[:, at:at + w])[...] = kp
        lengths += length
        at += w
    return memoryview(out[keep].data), lengths


def _void(mat: np.ndarray) -> np.ndarray:
    """(n, w) bytes or bools, last axis contiguous -> (n,) items of w bytes (a view)."""
    return mat.view(f"V{mat.shape[1]}")[:, 0]


def _literal(text: bytes) -> Block:
    return np.void(text), None, len(text)


@cache
def _masks(width: int, leading: bool) -> np.ndarray:
    """Keep-masks of ``width`` bytes indexed by the count kept: the last ``count`` bytes
    (``leading`` zeros dropped) or the first ``count`` (trailing zeros dropped)."""
    count = np.arange(width + 1)[:, None]
    mat = _COL[:width] >= width - count if leading else _COL[:width] < count
    return _void(np.ascontiguousarray(mat))


def _pick(col: Pick) -> Block:
    text, keep, lengths = col.choices.encoded
    return text[col.index], keep[col.index], lengths[col.index]


def _digits(a: np.ndarray, width: int) -> np.ndarray:
    """ASCII digits of non-negative int64 ``a`` zero-padded to ``width``: (n,) items."""
    groups = -(-width // 4)
    out = np.empty((len(a), groups), dtype=np.uint32)
    for g in range(groups - 1, 0, -1):
        out[:, g] = _LUT4[a % 10_000]
        a = a // 10_000
    out[:, 0] = _LUT4[a]
    return _void(out.view(np.uint8)[:, 4 * groups - width:])


def _unsigned(a: np.ndarray) -> Block:
    """An integer's digits without leading zeros (at least one digit)."""
    width = len(str(int(a.max(initial=0))))
    count = 1 + np.searchsorted(_POW10, a, side="right")
    return _digits(a, width), _masks(width, True)[count], count


def _number(col: Num) -> list[Block]:
    d = col.decimals
    k = col.values.astype(np.int64) if d is None else np.rint(
        col.values * 10.0 ** d).astype(np.int64)
    negative = k < 0
    blocks: list[Block] = []
    if negative.any():
        k = np.abs(k)
        blocks.append((np.void(b"-"), _void(negative[:, None]), negative.astype(np.int64)))
    if d is None:
        blocks.append(_unsigned(k))
    elif d == 0:
        blocks += [_unsigned(k), _literal(b".0")]
    else:
        whole, frac = np.divmod(k, 10 ** d)
        # Keep the fraction up to its last non-zero digit (at least one digit).
        last = np.full(len(k), d)
        for t in range(1, d):
            last -= frac % 10 ** t == 0
        blocks += [_unsigned(whole), _literal(b"."),
                   (_digits(frac, d), _masks(d, False)[last], last)]
    return blocks


def ordered_dicts(tables: list[Table], order: np.ndarray) -> list[dict]:
    """The events of all ``tables`` (rows numbered across them, in list order) in
    ``order``. Each table's dicts are built in output order: gathering them from
    creation order afterwards costs a cache miss per event (small chunks excepted:
    there numpy's per-call costs of reordering every column would dominate)."""
    if len(order) < SMALL_CHUNK:
        flat = [e for table in tables for e in table.dicts()]
        return [flat[i] for i in order.tolist()]
    parts, runs = _runs(tables, order)
    lists = [p.dicts() for p in parts]
    if len(runs) == 1:
        return lists[runs[0][0]]
    out: list[dict] = []
    for t, a, b in runs:
        out += lists[t][a:b]
    return out


def ordered_lines(tables: list[Table], order: np.ndarray) -> list[bytes | memoryview]:
    """Like ``ordered_dicts``, as JSON Lines: byte slices to write one after the other."""
    if len(order) < SMALL_CHUNK:
        # One orjson call, then split the array into lines: every event starts with its
        # "v" and nested objects (a comm record's ops) never have one, so '},{"v":' only
        # occurs between events.
        text = orjson.dumps(ordered_dicts(tables, order))[1:-1].replace(b'},{"v":',
                                                                         b'}\n{"v":')
        return [text + b"\n"] if text else []
    parts, runs = _runs(tables, order)
    blobs, starts = [], []
    for part in parts:
        blob, lengths = part.lines()
        blobs.append(blob)
        starts.append([0, *np.cumsum(lengths).tolist()])
    return [blobs[t][starts[t][a]:starts[t][b]] for t, a, b in runs]


def _runs(tables: list[Table], order: np.ndarray) -> tuple[list[Table], list[tuple]]:
    """Each table's rows in output order, and the output as runs (table, first, end) of
    consecutive rows of one of those."""
    if not len(order):
        return [], []
    offsets = np.cumsum([0] + [t.n for t in tables])
    which = np.searchsorted(offsets, order, side="right") - 1
    rank = np.empty(len(order), dtype=np.int64)   # position of each row among its table's
    parts = []
    for t, table in enumerate(tables):
        at = np.flatnonzero(which == t)
        rank[at] = np.arange(len(at))
        parts.append(table.take(order[at] - offsets[t]))
    cut = np.flatnonzero(np.diff(which)) + 1
    first = np.concatenate([[0], cut])
    last = np.concatenate([cut, [len(order)]]) - 1
    runs = list(zip(which[first].tolist(), rank[first].tolist(), (rank[last] + 1).tolist(),
                    strict=True))
    return parts, runs
