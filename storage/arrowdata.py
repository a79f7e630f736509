"""Column data in and out of ClickHouse as Arrow tables (the fast path of both transports)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import pyarrow as pa

# What `Client.insert` takes: an Arrow table, {column: values}, or a list of row dicts.
InsertData: TypeAlias = "pa.Table | Mapping[str, Any] | Sequence[Mapping[str, Any]]"


def to_arrow(data: InsertData) -> pa.Table:
    """Normalize insert data to an Arrow table (types are inferred unless already Arrow)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, Mapping):
        return pa.table({name: _array(values) for name, values in data.items()})
    rows = list(data)
    if not rows:
        return pa.table({})
    names = list(rows[0])
    return pa.table({name: _array([row.get(name) for row in rows]) for name in names})


def _array(values: Any) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values
    return pa.array(values)


def to_rows(table: pa.Table) -> tuple[list[str], list[tuple]]:
    """(column names, rows as tuples of Python values); DateTime64 becomes aware UTC datetime."""
    columns = list(table.column_names)
    if not columns:
        return [], []
    return columns, list(zip(*(col.to_pylist() for col in table.columns), strict=True))


def quote(name: str) -> str:
    """Backtick-quote an identifier (columns such as `bytes` and `group` are keywords)."""
    return "`" + name.replace("`", "\\`") + "`"
