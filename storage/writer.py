"""Batched columnar writes of CONTRACT.md events into ClickHouse.

Buffering is apart from writing (`add` / `write` / `flush`), and the buffer is
bounded: `add` returns False when it is full, so the caller flushes (or stops
reading) instead of growing memory without bound.

Events become Arrow columns per table (float seconds -> DateTime64(3) in UTC,
objects -> JSON text; a ``comm`` record one row per ``ops`` entry, its window's fields
on each), read from each table's own DESCRIBE, so a column added by
a later migration is filled with no change here. An event whose values do not
fit the columns (an integer too big for Int32, a ts outside 1970..2286) is not
written: it comes back in `WriteResult.rejected` with the reason, for the dead
letters, and never blocks the rest of its batch.

A raw row is written once (storage.dedupe): a row whose key is earlier in the batch or
already stored is skipped (``WriteResult.duplicates``), so the rollups that materialized
views fill on insert count each event once under at-least-once delivery.

>>> w = Writer(client)                      # doctest: +SKIP
>>> w.add({"v": 1, "kind": "host", "ts": 1.7e9, "host": "h0"})   # doctest: +SKIP
True
>>> w.flush().rows                          # doctest: +SKIP
1
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from failslow.storage.client import Client
from failslow.storage.dedupe import fresh_rows
from failslow.storage.errors import QueryError
from failslow.storage.url import check_identifier

log = logging.getLogger(__name__)

KIND_TABLE = {"step": "steps", "collective": "collectives", "comm": "comm", "gpu": "gpu",
              "nic": "nic", "host": "host", "incident": "incidents",
              "action": "actions"}
DEAD_LETTERS = "dead_letters"
# ClickHouse's UNKNOWN_TABLE (code 60), as chdb and the native protocol word it.
_MISSING_TABLE = re.compile(r"UNKNOWN_TABLE|Code: 60\b|Table \S+ does(?:n't| not) exist")
TS_MAX_S = 1.0e10  # DateTime64 ends in 2299; anything past 2286 is a broken clock

_INTS = {"Int8": pa.int8(), "Int16": pa.int16(), "Int32": pa.int32(), "Int64": pa.int64(),
         "UInt8": pa.uint8(), "UInt16": pa.uint16(), "UInt32": pa.uint32(),
         "UInt64": pa.uint64()}
_FLOATS = {"Float32": pa.float32(), "Float64": pa.float64()}

Converter = Callable[[list[Any]], pa.Array]


@dataclass
class WriteResult:
    """What one write did: rows written per table, and the events that were not."""

    rows: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    rejected: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    events: int = 0  # records written (a comm record is one, whatever its rows)
    duplicates: int = 0  # rows not written again: their key was already stored

    def merge(self, other: WriteResult) -> None:
        self.rows += other.rows
        self.events += other.events
        self.duplicates += other.duplicates
        for t, n in other.tables.items():
            self.tables[t] = self.tables.get(t, 0) + n
        self.rejected.extend(other.rejected)


def _unwrap(chtype: str) -> tuple[str, bool]:
    nullable = False
    while True:
        m = re.fullmatch(r"(LowCardinality|Nullable)\((.*)\)", chtype)
        if not m:
            return chtype, nullable
        nullable = nullable or m.group(1) == "Nullable"
        chtype = m.group(2)


def _ts_converter(nullable: bool) -> Converter:
    def convert(values: list[Any]) -> pa.Array:
        secs = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        missing = np.isnan(secs)
        if missing.any() and not nullable:
            raise ValueError("missing timestamp")
        present = secs[~missing]
        if ((present < 0) | (present >= TS_MAX_S)).any():
            raise ValueError("timestamp outside 1970..2286")
        ms = np.rint(np.where(missing, 0.0, secs) * 1000.0).astype(np.int64)
        return pa.array(ms, type=pa.timestamp("ms", tz="UTC"),
                        mask=missing if nullable else None)
    return convert


def _text(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    # numpy scalars too: with numpy 2, round() of a numpy float stays a numpy float, and
    # evidence built from numpy results must not cost the incident its row.
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def converter_for(chtype: str) -> Converter:
    """How a list of event values becomes an Arrow array for a ClickHouse column type."""
    base, nullable = _unwrap(chtype)
    if base.startswith("DateTime64"):
        return _ts_converter(nullable)
    if base in _INTS:
        itype = _INTS[base]
        return lambda values: pa.array(values, type=itype)
    if base == "Bool":
        return lambda values: pa.array(values, type=pa.bool_())
    if base in _FLOATS:
        ftype = _FLOATS[base]
        return lambda values: pa.array(values, type=ftype)
    if base == "String":
        if nullable:
            return lambda values: pa.array([_text(v) for v in values], type=pa.string())
        return lambda values: pa.array(["" if v is None else _text(v) for v in values],
                                       type=pa.string())
    m = re.fullmatch(r"Array\((\w+)\)", base)
    if m and m.group(1) in _INTS:
        ltype = pa.list_(_INTS[m.group(1)])
        return lambda values: pa.array([v or [] for v in values], type=ltype)
    if m and m.group(1) in _FLOATS:
        ftype = pa.list_(_FLOATS[m.group(1)])
        return lambda values: pa.array([v or [] for v in values], type=ftype)
    raise ValueError(f"no converter for ClickHouse type {chtype}")


# The row of a comm window with no ops entry: it still says the rank reported.
_NO_OPS = {"group": "", "group_size": 0, "op": "", "n": 0, "blocked_s": 0.0, "min_s": 0.0,
           "max_s": 0.0, "bytes": 0}


def rows_of(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows an event becomes: itself, or for ``comm`` one row per ``ops`` entry (the
    window's fields on each; ``_event`` keeps the record for the dead letters)."""
    if event["kind"] != "comm":
        return [event]
    window = {k: v for k, v in event.items() if k != "ops"}
    window["_event"] = event
    step = event.get("step")
    window["step_key"] = -1 if step is None else step  # in the sort key (migration 8)
    return [{**window, **entry} for entry in event["ops"] or (_NO_OPS,)]


class Writer:
    """Buffer events per table and insert them as Arrow batches. One thread uses a Writer."""

    def __init__(self, client: Client, database: str | None = None, max_rows: int = 200_000,
                 repair: Callable[[], object] | None = None):
        self.client = client
        # Called once when a table is missing (dropped by hand, a database restored without
        # it): the sink passes `migrate`, which recreates what it owns; then the insert is
        # retried. Without it the error would hold back every table buffered after it.
        self.repair = repair
        self.database = check_identifier(database or client.database)
        self.max_rows = max_rows
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._pending = 0
        self._columns: dict[str, list[tuple[str, Converter]]] = {}

    @property
    def pending(self) -> int:
        """Rows buffered and not yet written."""
        return self._pending

    @property
    def full(self) -> bool:
        return self._pending >= self.max_rows

    def add(self, event: dict[str, Any]) -> bool:
        """Buffer one event (a comm record: its rows); False (and nothing buffered) when
        the buffer is full."""
        return self._add(KIND_TABLE[event["kind"]], *rows_of(event))

    def add_dead_letter(self, row: dict[str, Any]) -> bool:
        """Buffer one dead_letters row: ts (float s), topic, partition, offset, key, error,
        raw, reporter."""
        return self._add(DEAD_LETTERS, row)

    def _add(self, table: str, *rows: dict[str, Any]) -> bool:
        if self._pending >= self.max_rows:
            return False
        self._buffers.setdefault(table, []).extend(rows)
        self._pending += len(rows)
        return True

    def flush(self) -> WriteResult:
        """Write everything buffered. On a ClickHouse error the unwritten tables stay
        buffered (the error propagates), so calling flush again retries them."""
        result = WriteResult()
        for table in list(self._buffers):
            rows = self._buffers[table]
            result.merge(self._insert(table, rows))
            del self._buffers[table]
            self._pending -= len(rows)
        return result

    def write(self, events: Iterable[dict[str, Any]]) -> WriteResult:
        """Write events now (any mix of kinds), bypassing the buffer."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for ev in events:
            groups.setdefault(KIND_TABLE[ev["kind"]], []).extend(rows_of(ev))
        result = WriteResult()
        for table, rows in groups.items():
            result.merge(self._insert(table, rows))
        return result

    def _columns_of(self, table: str) -> list[tuple[str, Converter]]:
        if table not in self._columns:
            _, rows = self.client.query(f"DESCRIBE TABLE {self.database}.{table}")
            # name, type, default_type, ...: DEFAULT/MATERIALIZED/ALIAS columns fill themselves
            self._columns[table] = [(r[0], converter_for(r[1])) for r in rows if not r[2]]
        return self._columns[table]

    def _convert(self, table: str, rows: list[dict[str, Any]]) -> pa.Table:
        return pa.table({name: conv([r.get(name) for r in rows])
                         for name, conv in self._columns_of(table)})

    def _insert(self, table: str, rows: list[dict[str, Any]]) -> WriteResult:
        try:
            return self._insert_once(table, rows)
        except QueryError as exc:
            if self.repair is None or not _MISSING_TABLE.search(str(exc)):
                raise
            log.warning("table %s.%s is missing: recreating the schema (%s)", self.database,
                        table, exc)
            self.repair()
            self._columns.pop(table, None)
            return self._insert_once(table, rows)

    def _insert_once(self, table: str, rows: list[dict[str, Any]]) -> WriteResult:
        result = WriteResult()
        try:
            batch = self._convert(table, rows)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            # Some row does not fit; find it one by one rather than lose the batch. A
            # comm record is kept or rejected whole, never written in part.
            bad: set[int] = set()
            for row in rows:
                event = row.get("_event", row)
                if id(event) in bad:
                    continue
                try:
                    self._convert(table, [row])
                except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                    bad.add(id(event))
                    result.rejected.append((event, f"{table}: {' '.join(str(exc).split())}"))
            rows = [r for r in rows if id(r.get("_event", r)) not in bad]
            batch = self._convert(table, rows)
        fresh = fresh_rows(self.client, self.database, table, batch)
        if fresh is not None:
            result.duplicates = batch.num_rows - len(fresh)
            batch = batch.take(pa.array(fresh, type=pa.int64()))
            rows = [rows[i] for i in fresh]
        if batch.num_rows:
            self.client.insert(f"{self.database}.{table}", batch)
        result.rows = batch.num_rows
        result.tables[table] = batch.num_rows
        result.events = (len({id(r["_event"]) for r in rows})
                         if table == KIND_TABLE["comm"] else batch.num_rows)
        return result
