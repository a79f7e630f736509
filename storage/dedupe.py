"""Raw rows are written once, so the per-minute rollups count each event once (issue 33
item 4).

The sink is at-least-once: after a crash it writes its last batch again, and a trace
replayed twice arrives twice. The raw tables are ReplacingMergeTree and collapse a row
delivered again on merge, but the rollups (steps_1m, comm_1m, gpu_clocks_1m, nic_1m) are
filled by materialized views from each INSERT's block: a row inserted twice was summed
twice, for good. So the writer inserts only rows whose identity (``KEYS``: the raw table's
sort key, the ReplacingMergeTree's own notion of "the same row") is neither earlier in
the same batch nor already in the table. The first delivery wins.

The lookup reads the keys already stored for the batch's jobs or hosts (the first sort
column) within the batch's time ranges: the batch's timestamps cut where they are more
than ``GAP_MS`` apart, so one far-off clock in a batch does not widen the range to a year.

What stays inexact (docs/operations.md): two sinks writing the same rows at the same time
(a consumer-group rebalance while the old owner still writes), and a process killed between
the raw part and the rollup part of one INSERT (that batch's rows then stay missing from the
rollup: the retry finds them in the raw table).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.storage.client import Client

# Sort keys of storage/migrations.py (comm: ifNull(peer, -1), then step_key).
KEYS: dict[str, tuple[str, ...]] = {
    "steps": ("job_id", "rank", "ts", "step"),
    "collectives": ("job_id", "group", "seq", "rank", "ts"),
    "comm": ("job_id", "group", "rank", "ts", "op", "peer", "step_key"),
    "gpu": ("host", "gpu", "ts"),
    "nic": ("host", "nic", "port", "ts"),
    "host": ("host", "ts"),
}
NULL_KEY = -1  # a Nullable key column (comm.peer) as the sort key has it
GAP_MS = 600_000
_INDEX = "__row"


def _keys(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    cols = {}
    for name in names:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if col.null_count:
            col = col.fill_null(pa.scalar(NULL_KEY, col.type))
        cols[name] = col
    return pa.table(cols)


def _ranges(ts: pa.ChunkedArray) -> list[tuple[int, int]]:
    """The batch's timestamps (ms) as [first, last] ranges, cut at gaps over GAP_MS."""
    ms = np.unique(ts.cast(pa.int64()).to_numpy(zero_copy_only=False))
    cuts = np.nonzero(np.diff(ms) > GAP_MS)[0]
    starts = np.concatenate(([0], cuts + 1))
    ends = np.concatenate((cuts, [len(ms) - 1]))
    return [(int(ms[a]), int(ms[b])) for a, b in zip(starts, ends, strict=True)]


def _stored(client: Client, database: str, table: str, batch_keys: pa.Table) -> pa.Table:
    names = KEYS[table]
    scope = names[0]
    cols = ", ".join(f"ifNull(`{n}`, {NULL_KEY}) AS `{n}`" if n == "peer" else f"`{n}`"
                     for n in names)
    # The ms bounds are integers computed here, not input text.
    within = " OR ".join(f"ts BETWEEN fromUnixTimestamp64Milli({a}, 'UTC') AND "
                         f"fromUnixTimestamp64Milli({b}, 'UTC')"
                         for a, b in _ranges(batch_keys.column("ts")))
    scopes = pc.unique(batch_keys.column(scope)).to_pylist()
    found = client.query_arrow(
        f"SELECT {cols} FROM {database}.{table} WHERE `{scope}` IN {{scopes:Array(String)}} "
        f"AND ({within})", {"scopes": scopes})
    if found.num_rows == 0:
        return found
    return pa.table({n: _keys(found, (n,)).column(n).cast(batch_keys.schema.field(n).type)
                     for n in names})


def fresh_rows(client: Client, database: str, table: str, batch: pa.Table) -> list[int] | None:
    """Indices of the rows of ``batch`` (for ``table``) to insert: the first of each key,
    and none already stored; None when every row is new (nothing to take)."""
    names = KEYS.get(table)
    if names is None or batch.num_rows == 0 or not set(names) <= set(batch.column_names):
        return None  # not a raw table as migrations made it: the insert says what is wrong
    keys = _keys(batch, names).append_column(_INDEX, pa.array(np.arange(batch.num_rows)))
    first = keys.group_by(list(names), use_threads=False).aggregate([(_INDEX, "min")])
    keep = keys
    if first.num_rows < keys.num_rows:
        keep = keys.take(np.sort(first.column(f"{_INDEX}_min").to_numpy()))
    stored = _stored(client, database, table, keep.drop_columns([_INDEX]))
    if stored.num_rows:
        keep = keep.join(stored, list(names), join_type="left anti", use_threads=False)
    if keep.num_rows == batch.num_rows:
        return None
    return sorted(keep.column(_INDEX).to_pylist())


def rows_taken(rows: list[Any], indices: list[int] | None) -> list[Any]:
    return rows if indices is None else [rows[i] for i in indices]
