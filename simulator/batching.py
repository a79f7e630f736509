"""A simulated trace batched as the host agents publish it, at a cost linear in its events.

``batch_events(events)`` gives exactly what ``schema.batches.batch_trace(events)`` gives
(the same batches, in the same places: byte for byte once encoded) for the simulator's
per-rank events. ``batch_trace`` is written for an agent's few hosts: on every event it
walks every open group to find the ones that lingered long enough, and once a trace has
more than ``4 * ROWS_MAX`` (host, kind) keys it rebuilds its memory of past windows on
every close. Over a whole cluster's trace both grow with the number of hosts, so the
cost per event did too (4,096 ranks: 20 of 28 CPU s in the linger scan). Here:

- the groups open wait in a heap by their first row's time: the ones due come off its
  top, closed in the order ``Batcher._due`` closes them (its open dict's key order, then
  each key's groups in age order);
- the keys remembered but no longer open are kept in a set, so forgetting them is what
  ``Batcher._close``'s rebuild keeps, without walking the others;
- a batch's columns are taken by C-level maps when its rows (or ops entries) have one
  shape, and checked as ``schema.batches.to_batch`` checks them; anything else goes to
  ``to_batch`` itself.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain, repeat
from math import copysign
from operator import itemgetter
from typing import Any

from failslow.schema.batches import (
    _NESTED_SCALAR,
    _SCALAR,
    ABSENT,
    BATCH_KINDS,
    ROW_BATCH,
    ROWS_MAX,
    BatchError,
    _reserved,
    group_key,
    placed,
    to_batch,
)
from failslow.schema.events import VERSION

_PRUNE_AT = 4 * ROWS_MAX   # Batcher._close: hosts and jobs long gone are forgotten past this


class _Group:
    __slots__ = ("gid", "key", "t0", "rows", "names", "open")

    def __init__(self, gid: int, key: tuple, t0: float) -> None:
        self.gid, self.key, self.t0 = gid, key, t0
        self.rows: list[dict] = []
        self.names: set = set()
        self.open = True


class _Batcher:
    """``schema.batches.Batcher``'s decisions (see there), each at a cost that does not
    grow with the number of hosts."""

    def __init__(self, linger_s: float = 0.5, max_open: int = 64, remember: int = 3) -> None:
        self.linger_s, self.max_open, self.remember = linger_s, max_open, remember
        self._open: dict[tuple, list[_Group]] = {}
        self._since: dict[tuple, int] = {}     # key -> when it last entered _open (its order)
        self._entered = 0
        self._last: dict[tuple, deque[frozenset]] = {}
        self._known: dict[tuple, frozenset] = {}   # key -> the union of its _last
        self._stale: set[tuple] = set()            # keys of _last not in _open
        self._heap: list[tuple[float, int, _Group]] = []
        self._gids = 0

    def _groups(self, key: tuple) -> list[_Group]:
        groups = self._open.get(key)
        if groups is None:
            groups = self._open[key] = []
            self._entered += 1
            self._since[key] = self._entered
            self._stale.discard(key)
        return groups

    def add(self, ev: dict, now: float) -> tuple[list[tuple[int | None, list[dict]]],
                                                  int | None]:
        """``Batcher._add``."""
        key = group_key(ev) if type(ev) is dict else None
        if key is None:
            return [(None, [ev])], None
        bk = BATCH_KINDS[key[0]]
        row = tuple(map(ev.get, bk.row_id)) if bk.row_id else ev.get(bk.row_key)
        groups = self._groups(key)
        out = []
        group = next((g for g in groups if row not in g.names), None)
        if group is None:
            if len(groups) >= self.max_open or (groups and key not in self._last):
                out.append(self._close(groups[0]))
                groups = self._groups(key)
            self._gids += 1
            group = _Group(self._gids, key, now)
            groups.append(group)
            heapq.heappush(self._heap, (now, group.gid, group))
        group.rows.append(ev)
        group.names.add(row)
        known = self._known.get(key)
        if known is not None and group.names >= known or len(group.rows) >= ROWS_MAX:
            out.append(self._close(group))
        return out, group.gid

    def due(self, now: float) -> list[tuple[int | None, list[dict]]]:
        """``Batcher._due``: the groups whose first row waited ``linger_s``."""
        heap, ready = self._heap, []
        while heap and now - heap[0][0] >= self.linger_s:
            group = heapq.heappop(heap)[2]
            if group.open:
                ready.append(group)
        if len(ready) > 1:
            ready.sort(key=lambda g: (self._since[g.key], g.gid))
        return [self._close(g) for g in ready]

    def flush(self) -> list[tuple[int | None, list[dict]]]:
        return [self._close(g) for groups in list(self._open.values()) for g in list(groups)]

    def _close(self, group: _Group) -> tuple[int | None, list[dict]]:
        key = group.key
        groups = self._open[key]
        groups.remove(group)
        group.open = False
        if not groups:
            del self._open[key]
        last = self._last.get(key)
        if last is None:
            last = self._last[key] = deque(maxlen=self.remember)
        last.append(frozenset(group.names))
        self._known[key] = frozenset().union(*last)
        if key not in self._open:
            self._stale.add(key)
        if len(self._last) > _PRUNE_AT:     # Batcher._close keeps the keys open
            for k in self._stale:
                del self._last[k]
                del self._known[k]
            self._stale.clear()
        try:
            return group.gid, [fast_batch(group.rows)]
        except BatchError:
            return group.gid, group.rows


def batch_events(events: Iterable[dict], linger_s: float = 0.5) -> Iterator[dict]:
    """``schema.batches.batch_trace(events, linger_s)`` for per-rank events (see there)."""
    batcher = _Batcher(linger_s)
    return placed(events, batcher.add, batcher.due, batcher.flush, lambda: bool(batcher._open))


# -- one batch -------------------------------------------------------------------------------

def _all_same(values: list | tuple) -> bool:
    """``all(_same(x, values[0]) for x in values)`` by C-level passes: ``_same`` is one type
    and ``==`` (which ``count`` tests), and for floats the same sign of zero and no NaN."""
    v0 = values[0]
    if values.count(v0) != len(values) or len(set(map(type, values))) != 1:
        return False
    if type(v0) is float:
        if v0 != v0:
            return False
        if v0 == 0.0:
            return len(set(map(copysign, repeat(1.0, len(values)), values))) == 1
    return True


def _columns(rows: list[dict], skip: frozenset[str], scalar: frozenset[str],
             always_list: str | None = None) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """``schema.batches._columns``."""
    shapes = set(map(tuple, rows))
    cols: dict[str, Any] = {}
    absent: dict[str, list[int]] = {}
    if len(shapes) == 1:
        # one shape: every column at once, by a transpose
        names = next(iter(shapes))
        columns = zip(*map(itemgetter(*names), rows), strict=True) if len(names) > 1 else \
            [tuple(map(itemgetter(names[0]), rows))]
        for name, values in zip(names, columns, strict=True):
            if name in skip:
                continue
            single = name in scalar and name != always_list and _all_same(values)
            cols[name] = values[0] if single else list(values)
        return cols, absent
    everywhere = set.intersection(*map(set, shapes)) if shapes else set()
    for name in dict.fromkeys(chain.from_iterable(rows)):
        if name in skip:
            continue
        if name not in everywhere:
            absent[name] = [i for i, row in enumerate(rows) if name not in row]
            cols[name] = [row.get(name) for row in rows]
            continue
        column = list(map(itemgetter(name), rows))
        single = name in scalar and name != always_list and _all_same(column)
        cols[name] = column[0] if single else column
    return cols, absent


def fast_batch(rows: list[dict]) -> dict[str, Any]:
    """``schema.batches.to_batch(rows)`` for rows of one group (``group_key``): rows of one
    shape taken column by column, anything else by ``to_batch``."""
    shapes = set(map(tuple, rows))
    if len(shapes) != 1 or len(rows) > ROWS_MAX:
        return to_batch(rows)
    shape = next(iter(shapes))
    kind = ROW_BATCH[rows[0]["kind"]]          # a group's rows share their kind
    bk = BATCH_KINDS[kind]
    reserved = _reserved(bk)
    versions = list(map(itemgetter("v"), rows)) if "v" in shape else None
    if (versions is None or bk.row_key not in shape
            or any(name in reserved for name in shape if name not in ("v", "kind"))
            or not (versions.count(VERSION) == len(versions)
                    and all(type(v) is int for v in versions))):
        return to_batch(rows)
    nested = None
    if bk.nested:
        nested = list(map(itemgetter(bk.nested), rows)) if bk.nested in shape else None
        if nested is None or not all(type(x) is list for x in nested) \
                or not all(type(e) is dict for e in chain.from_iterable(nested)):
            return to_batch(rows)
    for name in bk.shared:
        first = rows[0].get(name)
        if type(first) is not str or not _all_same(list(map(itemgetter(name), rows))):
            return to_batch(rows)
    out: dict[str, Any] = {"v": VERSION, "kind": kind}
    cols, _ = _columns(rows, reserved, _SCALAR[kind], always_list=bk.row_key)
    for name, col in cols.items():
        if name == bk.nested:
            assert nested is not None
            _put_nested(out, name, nested)
        else:
            out[name] = col
    return out


def _put_nested(out: dict[str, Any], name: str, lists: list[list[dict]]) -> None:
    """``schema.batches._put_nested``."""
    lens = list(map(len, lists))
    out[f"{name}_len"] = lens[0] if lens.count(lens[0]) == len(lens) else lens
    entries = list(chain.from_iterable(lists))
    cols, absent = _columns(entries, frozenset(), _NESTED_SCALAR[name])
    out[name] = cols
    if absent:
        out[f"{name}_{ABSENT}"] = absent
