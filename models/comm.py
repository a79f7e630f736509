"""``comm`` windows as evidence: who each group waits for, its transfer cost, link pairs.

A ``comm`` record (CONTRACT.md) sums one rank's ops per (group, op, peer) over a window;
durations are the rank's own, so nothing here needs the hosts' clocks to agree. Per job
step and per (group, kind of op), ``CommWindows`` adds up each member's blocked seconds
and bytes over the windows of the step; when the step is judged it hands the same
evidence the per-op path derives from ``collective`` events (``models.alignment``), as
one collective per (group, kind of op) and step:

- who the group waits for: the member that blocked least. A member is given
  ``start_ts = -blocked_s``, so ``alignment.lags`` charges the least-blocked member the
  gap to the next one — the per-op arrival lag summed over the step, when the same member
  arrives last;
- transfer cost: the shortest op (``min_s``) of any member, times the ops of a member:
  an op takes its transfer time on the member that arrived last (it waits for nobody),
  and the shortest one is the one least inflated by waiting — also on a pipeline link,
  whose blocked time is mostly the wait for the other stage. Members end together, so
  ``alignment.transfer`` (last start to first end) returns exactly that, and the link
  evaluation (``models.links``) divides it by the bytes; no clock offsets (all 0);
- link pairs: ``send``/``recv`` entries of a two-member group are one point-to-point
  collective of the pair, as the ``collective`` events of a pipeline link are;
- time inside collectives per rank and step (own work when steps lack ``compute_s`` and
  ``comm_s``): the sum of the rank's ``blocked_s``.

A window without ``step`` (a producer that does not know steps) belongs to the rank's next
step. A record's entries are kept per step as columns ((group, op) and the four numbers
of each entry, the rank and entry count of each record), taken by C-level maps when the
record arrives, while its dicts are still in the CPU cache (read back a step later they
cost a cache miss each: 2x the time on a 1,024-rank job), until the step is judged,
``max_age`` steps at most; the sums are made once, when the step is judged, with numpy
reductions over the columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from itertools import accumulate, chain
from operator import itemgetter, methodcaller
from typing import Any

import numpy as np

from failslow.models.alignment import CollArrays, Collective, StepColls, listed
from failslow.models.config import LinkConfig
from failslow.schema.batches import ABSENT, ROWS_MAX
from failslow.schema.events import SchemaError

KIND = {"send": "p2p", "recv": "p2p"}      # a pair's sends and recvs are one link
_KEY = itemgetter("group", "op")
_NUMS = itemgetter("blocked_s", "bytes", "n", "min_s")
_PEER = methodcaller("get", "peer")
_ENTRY_KEYS = ("group", "op", "group_size", "n", "blocked_s", "bytes", "min_s", "max_s")
_ENTRY = itemgetter(*_ENTRY_KEYS)


def step_runs(steps: Sequence[int], lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """The runs ``(a, b)`` of rows ``lo:hi`` that belong to one step (``steps[i]``: row
    ``i``'s), in order."""
    a = lo
    while a < hi:
        step = steps[a]
        b = a + 1
        while b < hi and steps[b] == step:
            b += 1
        yield a, b
        a = b


class CommRows:
    """``comm`` windows as columns: one host agent's ``comm_batch`` (schema.batches) read
    as it is, without a dict per rank or per entry, or a run of per-rank ``comm`` events
    (``of_events``: the same columns, so both inputs take one path through the models).

    Per row (window): ``rank``, ``ts``, ``w0`` (window_start_ts), ``step`` (None: the
    window names none), ``end`` (step_end), ``world`` (world_size or None), ``gpu``,
    ``host``; per entry of the rows' ``ops``, flattened in row order: ``group``, ``op``,
    ``size`` (group_size), ``n``, ``blocked``, ``nbytes``, ``min_s``, ``max_s``, ``peer``
    (None: none named); ``at``: row i's entries are ``at[i]:at[i + 1]``. Plain sequences,
    not arrays: a batch's columns are lists already, the models read a few values of a
    row by index, and numpy's fixed cost per call is more than a host's rows cost."""

    __slots__ = ("n", "job_id", "rank", "ts", "w0", "step", "end", "world", "gpu", "host",
                 "at", "group", "op", "size", "cnt", "blocked", "nbytes", "min_s", "max_s",
                 "peer", "seg", "_sums")

    n: int
    job_id: Any
    rank: list[int]
    ts: list[float]
    w0: list[float]
    step: list[int | None]
    end: list[Any]
    world: list[int | None]
    gpu: list[int | None]
    host: list[Any]
    at: list[int]
    group: Sequence[str]
    op: Sequence[str]
    size: Sequence[int]
    cnt: Sequence[int]
    blocked: Sequence[float]
    nbytes: Sequence[int]
    min_s: Sequence[float]
    max_s: Sequence[float]
    peer: list[int | None]
    seg: list[int] | None
    _sums: tuple[list[float], list[float], list[bool]] | None

    @classmethod
    def of_events(cls, evs: list[dict[str, Any]]) -> CommRows:
        """Per-rank ``comm`` events (of one job) as columns."""
        c = cls()
        c.n = len(evs)
        c.job_id = evs[0].get("job_id")
        if c.n == 1:      # one rank's window (the per-rank kind): no loops to set up
            e = evs[0]
            c.rank, c.ts, c.w0 = [e["rank"]], [e["ts"]], [e["window_start_ts"]]
            g = e.get
            c.step, c.end, c.world, c.gpu, c.host = [g("step")], [g("step_end")], \
                [g("world_size")], [g("gpu")], [g("host")]
            ops = e["ops"]
            c.at = [0, len(ops)]
        else:
            c.rank = [e["rank"] for e in evs]
            c.ts = [e["ts"] for e in evs]
            c.w0 = [e["window_start_ts"] for e in evs]
            c.step = [e.get("step") for e in evs]
            c.end = [e.get("step_end") for e in evs]
            c.world = [e.get("world_size") for e in evs]
            c.gpu = [e.get("gpu") for e in evs]
            c.host = [e.get("host") for e in evs]
            opss = [e["ops"] for e in evs]
            at = [0]
            for x in opss:
                at.append(at[-1] + len(x))
            c.at = at
            ops = list(chain.from_iterable(opss))
        if ops:
            # one C-level pass over the entries, then columns (tuples: read, never changed)
            try:
                entries = list(map(_ENTRY, ops))
            except KeyError:    # a field none of the models reading it needs here: None
                entries = [tuple(e.get(k) for k in _ENTRY_KEYS) for e in ops]
            (c.group, c.op, c.size, c.cnt, c.blocked, c.nbytes, c.min_s,
             c.max_s) = zip(*entries, strict=True)
        else:
            c.group = c.op = c.size = c.cnt = c.blocked = c.nbytes = c.min_s = c.max_s = ()
        c.peer = list(map(_PEER, ops))
        c.seg = None
        c._sums = None
        return c

    @classmethod
    def of_batch(cls, obj: dict[str, Any]) -> CommRows:
        """A ``comm_batch`` as columns; ``SchemaError`` when its layout is wrong (a column
        of the wrong length, a required field absent), before anything is taken."""
        rank = obj["rank"]
        if type(rank) is not list or not rank or len(rank) > ROWS_MAX:
            raise SchemaError("comm_batch.rank: expected a non-empty list, one value a row")
        n = len(rank)
        c = cls()
        c.n = n
        c.job_id = obj["job_id"]
        absent = obj.get(ABSENT) or {}
        if type(absent) is not dict:
            raise SchemaError("comm_batch.absent: expected an object")
        for name in ("ts", "window_start_ts", "host", "job_id", "rank", "ops"):
            if name in absent:
                raise SchemaError(f"comm_batch.{name}: a required field is absent")
        c.rank = rank
        c.ts, c.w0 = _columns(obj, _ROW_TIMES, n, absent, required=True)
        c.step, c.end, c.world, c.gpu = _columns(obj, _ROW_OPTIONAL, n, absent)
        c.host, = _columns(obj, _ROW_HOST, n, absent, required=True)
        lens = obj["ops_len"]
        if type(lens) is int and lens >= 0:     # one count for every row (most batches)
            at = list(range(0, lens * (n + 1), lens)) if lens else [0] * (n + 1)
        else:
            if type(lens) is not list or len(lens) != n:
                raise SchemaError("comm_batch.ops_len: expected one count a row")
            if set(map(type, lens)) != _INT_ONLY or min(lens) < 0:
                raise SchemaError("comm_batch.ops_len: expected counts >= 0")
            at = list(accumulate(lens, initial=0))
        c.at = at
        cols = obj["ops"]
        if type(cols) is not dict:
            raise SchemaError("comm_batch.ops: expected an object of columns")
        total = at[-1]
        oabs = obj.get(f"ops_{ABSENT}") or {}
        if type(oabs) is not dict:
            raise SchemaError("comm_batch.ops_absent: expected an object")
        if not total:       # rows without entries: the batch need not write their columns
            c.group = c.op = c.size = c.cnt = c.blocked = c.nbytes = c.min_s = c.max_s = ()
            c.peer = []
            c.seg = None
            c._sums = None
            return c
        (c.group, c.op, c.size, c.cnt, c.blocked, c.nbytes, c.min_s,
         c.max_s) = _columns(cols, _OP_COLUMNS, total, oabs, required=True)
        c.peer = _column(cols, "peer", total, oabs)
        c.seg = None
        c._sums = None
        return c

    @classmethod
    def of_batches(cls, objs: list[dict[str, Any]]) -> tuple[CommRows | None, int]:
        """``joined`` of the ``of_batch`` of each of ``objs`` (consecutive batches of one
        job), and how many ``of_batch`` refuses (left out; None: all of them). A batch
        written the usual way (no absent field but ``peer`` entries, one entry count for
        every row, columns of the right lengths) is read straight into the joined columns:
        ``of_batch`` and ``joined`` cost 15 us a host, as much as the models took of its
        rows; anything else is read by ``of_batch``."""
        rows: list[list[Any]] = [[] for _ in _ROW_JOINED]
        ents: list[list[Any]] = [[] for _ in _ENTRY_JOINED]
        rank, ts, w0, step, end, world, gpu, host = rows
        peer = ents[-1]
        entry_cols = ents[:-1]
        at, seg = [0], [0]
        bad = 0
        job_id = None
        for obj in objs:
            g: Any = obj.get
            r, lens, cols, oabs = g("rank"), g("ops_len"), g("ops"), g(_OPS_ABSENT)
            n = len(r) if type(r) is list else 0
            if type(lens) is int:
                total = lens * n if lens > 0 else 0
            elif type(lens) is list and len(lens) == n and set(map(type, lens)) == _INT_ONLY \
                    and min(lens) >= 0:
                total = sum(lens)
            else:
                total = 0
            vals: Any = None
            ops: Any = None
            pv: Any = None
            if 0 < n <= ROWS_MAX and total and type(cols) is dict and not g(ABSENT) \
                    and "job_id" in obj:
                # a column a list of one value a row (entry), or one value for all
                vals = list(map(g, _ROW_NAMES))
                ops = list(map(cols.get, _OP_COLUMNS))
                pv = cols.get("peer")
                # (plain loops: a sixth of of_batches' instructions fewer than a chain of
                # map, compress and set per batch over these 15 columns)
                if vals[0] is None or vals[1] is None or vals[-1] is None or None in ops \
                        or type(pv) is list and len(pv) != total:
                    vals = None
                else:
                    for v in vals:
                        if type(v) is list and len(v) != n:
                            vals = None
                            break
                    for v in ops:
                        if type(v) is list and len(v) != total:
                            vals = None
                            break
            if vals is not None and oabs:
                idxs = oabs.get("peer") if type(oabs) is dict and len(oabs) == 1 else None
                if type(idxs) is not list or set(map(type, idxs)) - _INT_ONLY or idxs and (
                        min(idxs) < 0 or max(idxs) >= total):
                    vals = None
            if vals is None:        # the rare layouts, and the wrong ones: ``of_batch``
                try:
                    p = cls.of_batch(obj)
                except (SchemaError, KeyError, TypeError, ValueError):
                    bad += 1
                    continue
                for col, name in zip(rows, _ROW_JOINED, strict=True):
                    col += getattr(p, name)
                for col, name in zip(ents, _ENTRY_JOINED, strict=True):
                    col += getattr(p, name)
                off = at[-1]
                at += [x + off for x in p.at[1:]]
                if job_id is None:
                    job_id = p.job_id
                seg.append(seg[-1] + p.n)
                continue
            if job_id is None:
                job_id = obj["job_id"]
            rank += r
            for col, v in zip(rows[1:], vals, strict=True):
                col += v if type(v) is list else [v] * n
            for col, v in zip(entry_cols, ops, strict=True):
                col += v if type(v) is list else [v] * total
            off = at[-1]
            at += range(off + lens, off + total + 1, lens) if type(lens) is int \
                else list(accumulate(lens, initial=off))[1:]
            peer += pv if type(pv) is list else [pv] * total
            if oabs:
                idxs = oabs["peer"]
                if type(pv) is not list or list(map(pv.__getitem__, idxs)).count(None) != len(idxs):
                    for i in idxs:
                        peer[off + i] = None
            seg.append(seg[-1] + n)
        if len(seg) == 1:
            return None, bad
        c = cls()
        c.n = seg[-1]
        c.job_id = job_id
        c.seg = seg
        for name, col in zip(_ROW_JOINED, rows, strict=True):
            setattr(c, name, col)
        for name, col in zip(_ENTRY_JOINED, ents, strict=True):
            setattr(c, name, col)
        c.at = at
        c._sums = None
        return c, bad

    @classmethod
    def joined(cls, parts: list[CommRows]) -> CommRows:
        """The rows of ``parts`` (consecutive batches of one job, in order) as one
        ``CommRows``, so that the models take a run of a few dozen hosts' batches in one
        call instead of one each; ``seg``: the first row of each part, then ``n``: the
        pipeline still takes each part's rows the way it would take that part alone
        (``Detector._comm_windows``)."""
        c = cls()
        c.job_id = parts[0].job_id
        rows = list(accumulate((p.n for p in parts), initial=0))
        c.n = rows[-1]
        c.seg = rows
        for name in _JOINED:
            setattr(c, name, list(chain.from_iterable(getattr(p, name) for p in parts)))
        at = [0]
        for p in parts:
            off = at[-1]
            at += [x + off for x in p.at[1:]]
        c.at = at
        c._sums = None
        return c

    def event(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a ``comm`` event (the fields the models read): for the few paths
        that keep a window whole (a job without step events learning its clock)."""
        a, b = self.at[i], self.at[i + 1]
        ops = []
        for j in range(a, b):
            e = {"group": self.group[j], "group_size": self.size[j], "op": self.op[j],
                 "n": self.cnt[j], "blocked_s": self.blocked[j], "min_s": self.min_s[j],
                 "max_s": self.max_s[j], "bytes": self.nbytes[j]}
            if self.peer[j] is not None:
                e["peer"] = self.peer[j]
            ops.append(e)
        ev = {"v": 1, "kind": "comm", "ts": self.ts[i], "job_id": self.job_id,
              "rank": self.rank[i], "host": self.host[i], "window_start_ts": self.w0[i],
              "ops": ops}
        for name, col in (("step", self.step), ("step_end", self.end),
                          ("world_size", self.world), ("gpu", self.gpu)):
            if col[i] is not None:
                ev[name] = col[i]
        return ev

    def sums(self) -> tuple[list[float], list[float], list[bool]]:
        """Per row, the seconds blocked in any group and in send/recv, each added from 0.0
        in entry order (the same floats as a loop of ``+=`` over the row's entries); per
        entry, whether it is a send/recv. Computed once, for all rows."""
        if self._sums is None:
            isp = list(map(KIND.__contains__, self.op))
            if len(self.blocked) < 1024:
                # one pass for both (numpy's fixed cost is more than a host's entries cost)
                at, values = self.at, self.blocked
                every, p2p = [], []
                for i in range(self.n):
                    acc = accp = 0.0
                    for j in range(at[i], at[i + 1]):
                        x = values[j]
                        acc += x
                        if isp[j]:
                            accp += x
                    every.append(acc)
                    p2p.append(accp)
                self._sums = (every, p2p, isp)
            else:
                self._sums = (self._row_sums(None), self._row_sums(isp) if True in isp
                              else [0.0] * self.n, isp)
        return self._sums

    def _row_sums(self, keep: list[bool] | None) -> list[float]:
        at, n, values = self.at, self.n, self.blocked
        if len(values) < 1024:
            # numpy's fixed cost (~10 us) is more than a host's few dozen entries cost
            out = []
            for i in range(n):
                acc = 0.0
                if keep is None:
                    for x in values[at[i]:at[i + 1]]:
                        acc += x
                else:
                    for j in range(at[i], at[i + 1]):
                        if keep[j]:
                            acc += values[j]
                out.append(acc)
            return out
        v = np.array(values, dtype=np.float64)
        if keep is not None:
            v = np.where(np.array(keep, dtype=bool), v, 0.0)
        lens = np.diff(np.array(at))
        width = int(lens.max())
        if width * n == len(values):        # every row the same entries (most batches)
            grid = v.reshape(n, width)
        else:
            grid = np.zeros((n, width))
            grid[np.repeat(np.arange(n), lens),
                 np.arange(len(values)) - np.repeat(np.array(at[:-1]), lens)] = v
        tot = np.zeros(n)
        for j in range(width):      # column by column: each row's entries in order
            tot = tot + grid[:, j]
        sums: list[float] = tot.tolist()
        return sums


# the columns ``CommRows.joined`` chains (``at`` and ``seg`` it makes): the rows', the entries'
_ROW_JOINED = ("rank", "ts", "w0", "step", "end", "world", "gpu", "host")
_ENTRY_JOINED = ("group", "op", "size", "cnt", "blocked", "nbytes", "min_s", "max_s", "peer")
_JOINED = _ROW_JOINED + _ENTRY_JOINED
# a batch's fields of the rows after ``rank``, as ``_ROW_JOINED`` names them
_ROW_NAMES = ("ts", "window_start_ts", "step", "step_end", "world_size", "gpu", "host")
_OPS_ABSENT = f"ops_{ABSENT}"
_LIST_ONLY = {list}
_ROW_TIMES = ("ts", "window_start_ts")
_ROW_OPTIONAL = ("step", "step_end", "world_size", "gpu")
_ROW_HOST = ("host",)
_OP_COLUMNS = ("group", "op", "group_size", "n", "blocked_s", "bytes", "min_s", "max_s")
_INT_ONLY = {int}


def _columns(obj: dict[str, Any], names: tuple[str, ...], n: int, absent: dict[str, Any],
             required: bool = False) -> list[list[Any]]:
    """``_column`` of each of ``names``, in order: a list of ``n`` that no row lacks taken
    as it is (most columns of a batch) without a call per column."""
    out = []
    get = obj.get
    for name in names:
        v = get(name)
        if type(v) is list and len(v) == n and name not in absent:
            out.append(v)
        else:
            out.append(_column(obj, name, n, absent, required))
    return out


def _column(obj: dict[str, Any], name: str, n: int, absent: dict[str, Any],
            required: bool = False) -> list[Any]:
    """A batch column as a list of ``n`` values: a list as it is, a value written once
    repeated; rows named in ``absent`` (or all, when the batch lacks the field) None."""
    if name not in obj:
        if required:
            raise SchemaError(f"comm_batch.{name}: required field is missing")
        return [None] * n
    v = obj[name]
    if type(v) is list:
        if len(v) != n:
            raise SchemaError(f"comm_batch.{name}: {len(v)} values for {n}")
    else:
        v = [v] * n
    idxs = absent.get(name)
    if idxs:
        if required:
            raise SchemaError(f"comm_batch.{name}: a required field is absent")
        v = list(v)
        for i in idxs:
            v[i] = None
    return v


class _Columns:
    """The entries of one step's windows, as columns taken when each record arrives (its
    dicts are then still in the CPU cache; read back a step later, they cost a cache miss
    each): per entry its group, op, blocked_s, bytes, n and min_s, per window its rank,
    number of entries and ts. Plain lists of strings and numbers: taking a batch's rows is
    a few list extends, with no object per entry for the garbage collector to track."""

    __slots__ = ("groups", "ops", "blocked", "nbytes", "cnt", "min_s", "ranks", "counts", "ts")

    def __init__(self) -> None:
        self.groups: list[str] = []
        self.ops: list[str] = []
        self.blocked: list[float] = []
        self.nbytes: list[int] = []
        self.cnt: list[int] = []
        self.min_s: list[float] = []
        self.ranks: list[int] = []
        self.counts: list[int] = []
        self.ts: list[float] = []

    def __len__(self) -> int:
        """Windows (records) taken."""
        return len(self.ranks)

    def __setstate__(self, state: Any) -> None:
        slots = state[1] if isinstance(state, tuple) else state
        if "keys" in slots:     # pickled as (group, op) and (blocked, bytes, n, min_s) tuples
            self.__init__()     # type: ignore[misc]
            self.take_entries(slots["keys"], slots["nums"])
            self.ranks, self.counts = slots["ranks"], slots["counts"]
            return
        for k, v in slots.items():
            setattr(self, k, v)
        if "ts" not in slots:   # pickled before windows kept their ts: taken in arrival order
            self.ts = []

    def take_entries(self, keys: list[tuple[str, str]], nums: list[tuple]) -> None:
        """Entries given as (group, op) and (blocked_s, bytes, n, min_s) tuples."""
        if keys:
            g, o = zip(*keys, strict=True)
            self.groups += g
            self.ops += o
            b, nb, n, m = zip(*nums, strict=True)
            self.blocked += b
            self.nbytes += nb
            self.cnt += n
            self.min_s += m


class CommWindows:
    """One job's ``comm`` windows per step, and their sums per group, kind of op and member."""

    __slots__ = ("max_age", "steps", "_step", "_time", "_colls")

    def __init__(self, max_age: int = LinkConfig.pending_steps) -> None:
        self.max_age = max_age
        # step -> its windows' entries as columns, in arrival order
        self.steps: dict[int, _Columns] = {}
        self._step: int | None = None      # the step whose sums are below
        self._time: dict[int, float] = {}  # rank -> seconds in ops
        self._colls: list[Collective] = []

    def add(self, ev: dict[str, Any], step: int) -> None:
        """Take one ``comm`` record of a rank; ``step`` is the step it belongs to."""
        self.add_rows(CommRows.of_events([ev]), [step], 0, 1)

    def add_rows(self, c: CommRows, steps: list[int], lo: int, hi: int) -> None:
        """Take rows ``lo:hi`` of ``c``; ``steps[i]``: the step row ``i`` belongs to."""
        at = c.at
        # a run of rows of one step (a host's batch: all of them), taken at once
        for i, j in step_runs(steps, lo, hi):
            step = steps[i]
            a, b = at[i], at[j]
            if b > a:
                cols = self.steps.get(step)
                if cols is None:
                    cols = self.steps[step] = _Columns()
                cols.groups += c.group[a:b]
                cols.ops += c.op[a:b]
                cols.blocked += c.blocked[a:b]
                cols.nbytes += c.nbytes[a:b]
                cols.cnt += c.cnt[a:b]
                cols.min_s += c.min_s[a:b]
                counts = [b - a] if j == i + 1 else [at[k + 1] - at[k] for k in range(i, j)]
                if 0 in counts:     # a window with no entries is no member of any group
                    cols.ranks += [r for r, m in zip(c.rank[i:j], counts, strict=True) if m]
                    cols.ts += [t for t, m in zip(c.ts[i:j], counts, strict=True) if m]
                    cols.counts += [m for m in counts if m]
                else:
                    cols.ranks += c.rank[i:j]
                    cols.ts += c.ts[i:j]
                    cols.counts += counts

    def take_time(self, rank: int, step: int) -> float | None:
        """Pop the seconds a rank spent in collectives in a step (None if none counted)."""
        if step != self._step:
            self._sum(step)
        return self._time.pop(rank, None)

    def take_step(self, step: int) -> list[Collective]:
        """Pop a step's groups as collectives in ``models.alignment``'s layout."""
        return listed(self.take_colls(step))

    def take_colls(self, step: int) -> list[Collective]:
        """``take_step``, the lists built only once read: a ``StepColls`` (its arrays
        are what ``models.links`` and ``lags`` read; ``listed`` gives the lists)."""
        if step != self._step:
            self._sum(step, times=False)     # the step's times are not read (taken whole)
        out = self._colls
        self._step, self._time, self._colls = None, {}, []
        return out

    def _sum(self, step: int, times: bool = True) -> None:
        """The step's windows summed: per link its members (``take_colls``) and, with
        ``times``, per rank its seconds in ops (``take_time``)."""
        self._step = step
        self._time, self._colls = {}, []
        cols = self.steps.pop(step, None)
        if cols is None:
            return
        if type(cols) is list:     # a snapshot from before columns: (rank, ts, ops) windows
            old, cols = cols, _Columns()
            for r, _, ops in old:
                cols.take_entries(list(map(_KEY, ops)), list(map(_NUMS, ops)))
                cols.ranks.append(r)
                cols.counts.append(len(ops))
        groups, ops, k = cols.groups, cols.ops, len(cols.groups)
        # (group, op) -> its id, in first-seen order (no tuple per entry: group and op ids)
        gname = list(dict.fromkeys(groups))
        oname = list(dict.fromkeys(ops))
        gix = {g: i for i, g in enumerate(gname)}
        oix = {o: i for i, o in enumerate(oname)}
        pair = (np.fromiter(map(gix.__getitem__, groups), dtype=np.int64, count=k)
                * len(oname) + np.fromiter(map(oix.__getitem__, ops), dtype=np.int64, count=k))
        uniq, first_at, inv_key = np.unique(pair, return_index=True, return_inverse=True)
        first_at = _first_in_time(cols, first_at, inv_key.reshape(-1), len(uniq))
        order = np.argsort(first_at, kind="stable")
        key_id = np.empty(len(uniq), dtype=np.int64)
        key_id[order] = np.arange(len(uniq))
        # (group, op) -> its link: one per (group, kind of op), named by its first op;
        # links numbered in the order of their first (group, op), on arrays
        kinds = {kd: i for i, kd in enumerate(dict.fromkeys(KIND.get(o, o) for o in oname))}
        okind = np.array([kinds[KIND.get(o, o)] for o in oname], dtype=np.int64)
        keys = uniq[order]
        lk, lfirst, linv = np.unique(keys // len(oname) * len(kinds) + okind[keys % len(oname)],
                                     return_index=True, return_inverse=True)
        lorder = np.argsort(lfirst, kind="stable")
        lid = np.empty(len(lk), dtype=np.int64)
        lid[lorder] = np.arange(len(lk))
        to_link = lid[linv.reshape(-1)]
        name_key = keys[lfirst[lorder]].tolist()     # link -> its first (group, op)
        rank = np.repeat(np.array(cols.ranks, dtype=np.int64), cols.counts)
        v = np.empty((k, 4))
        v[:, 0] = cols.blocked
        v[:, 1] = cols.nbytes
        v[:, 2] = cols.cnt
        v[:, 3] = cols.min_s
        blocked = v[:, 0]
        if times:
            self._time = _by_rank(rank, blocked)
        gid = to_link[key_id[inv_key.reshape(-1)]]
        # one member per (link, rank): sums, and the shortest op
        span = int(rank.max()) + 1
        member, inv = np.unique(gid * span + rank, return_inverse=True)
        m = len(member)
        sums = np.zeros((m, 3))
        np.add.at(sums, inv, v[:, :3])
        shortest = np.full(m, np.inf)
        np.minimum.at(shortest, inv, v[:, 3])
        mg = member // span
        mr = member % span
        cut = np.flatnonzero(np.diff(mg)) + 1
        first = np.concatenate([[0], cut])
        size = np.diff(np.concatenate([first, [m]]))
        least = np.minimum.reduceat(sums[:, 0], first)
        # Members end together: last start (-least) to first end is the transfer.
        end = (np.maximum.reduceat(sums[:, 2], first) * np.minimum.reduceat(shortest, first)
               - least)
        nbytes = np.maximum.reduceat(sums[:, 1], first)
        # per member (rank, -blocked, transfer end + blocked)
        b = sums[:, 0]
        colls = self._colls = StepColls()
        keep = np.flatnonzero(size >= 2)       # the links of two members or more
        if not keep.size:
            return
        ks = size[keep]
        at = first[keep]
        idx = np.repeat(at - np.concatenate(([0], np.cumsum(ks)[:-1])), ks) \
            + np.arange(int(ks.sum()))
        x = np.array(name_key, dtype=np.int64)[mg[at]]
        no = len(oname)
        nb = nbytes[keep]
        arr = colls.arrays = CollArrays(x // no, gname, x % no, oname, np.trunc(nb), ks,
                                        mr[idx], -b[idx], (np.repeat(end, size) + b)[idx])
        # the ``Collective`` lists once a reader needs them (``StepColls.full``: most steps
        # none does, ``models.links`` and ``lags`` read the arrays)
        colls.make = partial(_lists, step, arr, nb)
        if not arr.finite:
            colls.full()        # as before: a byte count that is not finite raises here

    def expire(self, step: int) -> None:
        """Forget the windows of steps older than ``step - max_age`` (never judged)."""
        horizon = step - self.max_age
        for s in [s for s in self.steps if s < horizon]:
            del self.steps[s]


def _lists(step: int, arr: CollArrays, nbytes: np.ndarray) -> list[Collective]:
    """The ``Collective`` lists of a step's arrays: the same values (Python floats of the
    same doubles; bytes as ``int``)."""
    trip = list(zip(arr.rank.tolist(), arr.start.tolist(), arr.dur.tolist(), strict=True))
    groups, ops = arr.groups, arr.ops
    out: list[Collective] = []
    for a, k, g, o, nb in zip(arr.at.tolist(), arr.size.tolist(), arr.gid.tolist(),
                              arr.oid.tolist(), nbytes.tolist(), strict=True):
        c: Collective = [step, groups[g], ops[o], int(nb)]
        c.extend(trip[a:a + k])
        out.append(c)
    return out


def _first_in_time(cols: _Columns, first_at: np.ndarray, inv_key: np.ndarray, n: int
                   ) -> np.ndarray:
    """Each (group, op)'s first entry in the order its windows closed (ts, then rank),
    not in the order they arrived (``first_at``): per-rank input arrives in ts order, a
    host's batch holds that host's windows together. The order of the step's groups
    (``models.links`` breaks a tie between equal culprits by it; a link is named by its
    first op) is then the same for both."""
    ranks, ts = cols.ranks, cols.ts
    if len(ts) != len(ranks) or len(ranks) < 2:
        return first_at      # windows taken before they kept their ts: arrival order
    w = np.lexsort((np.array(ranks), np.array(ts)))
    if not (np.diff(w) < 0).any():
        return first_at      # they arrived in that order
    pos = np.empty(len(w), dtype=np.int64)
    pos[w] = np.arange(len(w))
    # entries in their windows' time order, a window's entries kept in theirs
    eo = np.argsort(np.repeat(pos, cols.counts), kind="stable")
    at = np.empty(len(eo), dtype=np.int64)
    at[eo] = np.arange(len(eo))
    first = np.full(n, len(eo), dtype=np.int64)
    np.minimum.at(first, inv_key, at)
    return first


def _by_rank(rank: np.ndarray, seconds: np.ndarray) -> dict[int, float]:
    """Seconds summed per rank."""
    ranks, inv = np.unique(rank, return_inverse=True)
    return dict(zip(ranks.tolist(), np.bincount(inv, weights=seconds).tolist(), strict=True))
