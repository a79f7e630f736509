"""A host's columnar batches carried whole through the job stage (issue 31).

The job stage used to expand every batch into its per-rank events at decode, for the
clock screen, the input caps, the ordering and the de-duplication, and the Detector then
judged per-rank events; ``failslow detect`` hands the Detector the batches whole. The
stages now read a batch's columns where they need its rows (its ranks, their ts, their
de-duplication marks) and keep it whole; only a batch with a row that must be treated
apart (too far ahead, a duplicate, a new rank of a job, a host no job runs on) is cut, or
expanded where cutting its nested entries is not supported.

Generic over ``schema.batches.BATCH_KINDS``: a batch's row fields are read as columns
(``column``), whatever the kind. ``WHOLE_KINDS`` are the kinds the Detector takes whole
(``Detector.process_batch``); a batch kind not in it is expanded at decode, as before.
"""

from __future__ import annotations

from typing import Any

from failslow.models.pipeline import DEVICE_BATCHES
from failslow.schema.batches import ABSENT, BATCH_KINDS, expand, take

# The batch kinds the Detector judges whole: a host's comm windows, step ends and device
# samples (``Detector.process_batch``). A step batch sits at its newest row
# (``BatchKind.at_last``): ``ordering.EventOrder`` releases it, and a replay skips it,
# whole at that row's ts.
WHOLE_KINDS = frozenset(("comm_batch", "step_batch", *DEVICE_BATCHES)) & frozenset(BATCH_KINDS)


def nrows(ev: dict) -> int:
    """Rows of an event: a batch's, 1 for a per-rank event."""
    bk = BATCH_KINDS.get(ev["kind"])
    return 1 if bk is None else len(ev[bk.row_key])


def rows_of(events: list[dict]) -> int:
    """Rows of a list of events (batches count their rows)."""
    n = len(events)
    for ev in events:
        bk = BATCH_KINDS.get(ev["kind"])
        if bk is not None:
            n += len(ev[bk.row_key]) - 1
    return n


def first_ts(ev: dict) -> float:
    """An event's ts; where ``failslow detect`` places a batch: its first row's, its
    newest row's for a kind placed there (``BatchKind.at_last``: a ``step_batch``)."""
    t = ev["ts"]
    if type(t) is not list:
        return t
    return t[-1] if getattr(BATCH_KINDS[ev["kind"]], "at_last", False) else t[0]


def max_ts(ev: dict) -> float:
    """An event's ts; a batch's newest row's."""
    t = ev["ts"]
    return max(t) if type(t) is list else t


def min_ts(ev: dict) -> float:
    t = ev["ts"]
    return min(t) if type(t) is list else t


def column(ev: dict, name: str, n: int) -> list:
    """A batch's field ``name`` as one value per row (a shared or one-for-all value
    repeated; None where the field is absent from the batch)."""
    v = ev.get(name)
    return v if type(v) is list else [v] * n


def row_kind(ev: dict) -> str:
    """The per-rank kind of an event (a batch's rows' kind)."""
    kind = ev["kind"]
    bk = BATCH_KINDS.get(kind)
    return kind if bk is None else bk.row_kind


def has_absent(ev: dict, names: tuple[str, ...]) -> bool:
    """True when a row of batch ``ev`` lacks one of ``names`` (its column holds a
    placeholder there): such a batch is expanded where those fields are read."""
    absent = ev.get(ABSENT)
    return type(absent) is dict and any(name in absent for name in names)


def subset(ev: dict, idxs: list[int]) -> list[dict]:
    """Rows ``idxs`` of batch ``ev``, as events: the batch itself when that is all of
    them, a batch cut by ``take`` for a kind without nested entries, else the rows."""
    bk = BATCH_KINDS[ev["kind"]]
    n = len(ev[bk.row_key])
    if not idxs:
        return []
    if len(idxs) == n:
        return [ev]
    if bk.nested is None:
        return [take(ev, idxs)]
    rows = expand(ev)
    return [rows[i] for i in idxs]


class Row:
    """Row ``i`` of a batch kept whole, made into its per-rank event only when needed
    (compared with another record at its de-duplication mark, or digested in a
    snapshot); the batch's rows are made once for all its ``Row``s (``cache``)."""

    __slots__ = ("batch", "i", "cache")

    def __init__(self, batch: dict, i: int, cache: list) -> None:
        self.batch, self.i, self.cache = batch, i, cache

    def event(self) -> dict:
        if not self.cache:
            self.cache.append(expand(self.batch))
        rows: list[dict] = self.cache[0]
        return rows[self.i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Row):
            other = other.event()
        return self.event() == other

    __hash__ = None  # type: ignore[assignment]


def event_of(ev: Any) -> dict:
    """A per-rank event, or a ``Row`` made into one."""
    return ev.event() if isinstance(ev, Row) else ev
