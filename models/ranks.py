"""Per-rank state, columnar: protected baselines of every rank's own step and how long
it has stood out from its peers, as numpy arrays over the job's ranks (``RankTable``).

A judged step updates every rank at once (``models.job``); per-rank Python runs only for
the few ranks that stand out, through a ``RankState`` view of one row (the same fields
as attributes), which is also what localization and the incident evidence read.

The baselines are updated once per step and only from steps where the rank was *not*
flagged, so they never drift to the fault and the alarm never clears itself:

- ``work``: own work as a position against the job-wide level (a ratio): rolling
  median and IQR sigma of the last ``baseline_window`` (32) learned steps (numpy's linear
  quantiles, as river's ``RollingQuantile`` / ``RollingIQR`` compute them), so warm-up
  steps and one-off pauses do not move it; the self-relative score of ``models.job``
  reads it;
- ``step``, ``own``, ``comm``, ``data``: exponentially weighted mean and variance of the
  step time and its parts (seconds; river's ``EWMean`` / ``EWVar`` arithmetic, bit for
  bit): own work, time blocked in collectives, input wait. Input wait above the rank's
  own usual (and above its peers') is what counts as an input stall, and the incident
  evidence shows each part against its usual value.

``cusum`` accumulates the evidence that the rank stands out (robust z-scores above a
reference), so a large slowdown confirms in two steps and a small one in a few more,
while a one-step spike adds a bounded amount.

>>> r = RankState()
>>> r.observe(1.0, 0.9, 0.01, 1.0, flagged=False)
>>> r.observe(2.0, 1.8, 0.01, 2.0, flagged=True)
>>> r.work.median, r.step.mean
(1.0, 1.0)
>>> t = RankTable()
>>> rows = t.slots_for([0, 1, 2])
>>> t.observe(rows, np.array([1.0, 1.1, 0.9]), np.ones(3), np.zeros(3), np.ones(3),
...           np.array([False, True, False]), delay=0)
>>> t.work.n[rows].tolist(), t[1].work.n, t[2].work.median
([1, 0, 1], 0, 0.9)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from failslow.models.config import RankConfig
from failslow.models.stats import RollingMedians

# ``window`` and ``alpha``: ``RankConfig.baseline_window`` (32 steps in the rolling median of
# own work) and ``baseline_alpha`` (0.05: ~20 steps of memory), ``[rules.ranks]``.

# Scalar fields of a rank, by dtype; ``kind`` is coded (KINDS) and read as a string.
FLOATS = ("cusum", "onset_ts", "excess_s", "own_rel", "data_excess_s", "rel", "z", "self_rel",
          "base_job_s", "lost_s", "c_onset_ts", "mean_excess", "mean_z", "recent",
          "imb_onset_ts", "imb_rel", "imb_excess_s", "imb_lost_s", "since_s", "waited_share",
          "waited_lag")
INTS = ("streak", "clear", "onset_step", "quiet", "c_onset_step", "mean_n", "imb_quiet",
        "imb_onset_step", "since_n")
BOOLS = ("imb",)
# An active finding: "change" (against its own past) or "far" (far outside its peers);
# None (code 0) while the rank is clean; it ends after ``clean_steps`` clean steps.
KINDS: tuple[str | None, ...] = (None, "change", "far")
KIND_CODE = {k: i for i, k in enumerate(KINDS)}
EW_STATS = ("step", "own", "comm", "data")


class RankTable:
    """Every rank of one job, one row each (``slots``: rank -> row), in arrays.

    Reads like a mapping of rank -> ``RankState`` (``table[r]``, ``r in table``,
    ``items()``, ``values()``), which localization and the evidence use for the few ranks
    that stand out."""

    # the arrays (one value per row), made in __init__ from the names above
    cusum: np.ndarray
    onset_ts: np.ndarray
    excess_s: np.ndarray
    own_rel: np.ndarray
    data_excess_s: np.ndarray
    rel: np.ndarray
    z: np.ndarray
    self_rel: np.ndarray
    base_job_s: np.ndarray
    lost_s: np.ndarray
    c_onset_ts: np.ndarray
    mean_excess: np.ndarray
    mean_z: np.ndarray
    recent: np.ndarray
    imb_onset_ts: np.ndarray
    imb_rel: np.ndarray
    imb_excess_s: np.ndarray
    imb_lost_s: np.ndarray
    since_s: np.ndarray
    waited_share: np.ndarray
    waited_lag: np.ndarray
    streak: np.ndarray
    clear: np.ndarray
    onset_step: np.ndarray
    quiet: np.ndarray
    c_onset_step: np.ndarray
    mean_n: np.ndarray
    imb_quiet: np.ndarray
    imb_onset_step: np.ndarray
    since_n: np.ndarray
    imb: np.ndarray
    kind: np.ndarray
    step_m: np.ndarray
    step_q: np.ndarray
    step_n: np.ndarray
    own_m: np.ndarray
    own_q: np.ndarray
    own_n: np.ndarray
    comm_m: np.ndarray
    comm_q: np.ndarray
    comm_n: np.ndarray
    data_m: np.ndarray
    data_q: np.ndarray
    data_n: np.ndarray
    pend_n: np.ndarray

    def __init__(self, window: int | None = None, alpha: float | None = None) -> None:
        self.window = RankConfig().baseline_window if window is None else window
        self.alpha = RankConfig().baseline_alpha if alpha is None else alpha
        self.slots: dict[int, int] = {}
        self.size = 0
        cap = 0
        for name in FLOATS:
            setattr(self, name, np.zeros(cap))
        for name in INTS:
            setattr(self, name, np.zeros(cap, dtype=np.int64))
        self.imb = np.zeros(cap, dtype=bool)
        self.kind = np.zeros(cap, dtype=np.int8)
        for name in EW_STATS:          # mean, mean of squares, samples
            setattr(self, f"{name}_m", np.zeros(cap))
            setattr(self, f"{name}_q", np.zeros(cap))
            setattr(self, f"{name}_n", np.zeros(cap, dtype=np.int64))
        self.work = RollingMedians(self.window)      # learned positions, per row
        self.pend = np.zeros((cap, 0, 4))            # steps not learned yet (delay)
        self.pend_n = np.zeros(cap, dtype=np.int64)

    # -- rows ------------------------------------------------------------------------------

    def _arrays(self) -> list[str]:
        return [*FLOATS, *INTS, *BOOLS, "kind", "pend_n",
                *(f"{n}_{s}" for n in EW_STATS for s in "mqn")]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the room kept for ranks yet to come (``_grow`` doubles)."""
        d = dict(self.__dict__)
        n = self.size
        for name in (*self._arrays(), "pend"):
            d[name] = d[name][:n].copy()
        d["work"] = self.work.trimmed(n)
        return d

    def _grow(self, need: int) -> None:
        cap = self.kind.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap, 8)
        for name in self._arrays():
            a = getattr(self, name)
            b = np.zeros(new, dtype=a.dtype)
            b[:cap] = a
            setattr(self, name, b)
        b = np.zeros((new, *self.pend.shape[1:]))
        b[:cap] = self.pend
        self.pend = b
        self.work.grow(new)

    def slots_for(self, ranks: list[int]) -> np.ndarray:
        """The rows of ``ranks`` (made for ranks seen the first time)."""
        slots = self.slots
        new = [r for r in ranks if r not in slots]
        if new:
            self._grow(self.size + len(new))
            for r in new:
                slots[r] = self.size
                self.size += 1
        return np.fromiter(map(slots.__getitem__, ranks), dtype=np.int64, count=len(ranks))

    def __getitem__(self, rank: int) -> RankState:
        return RankState(self, self.slots[rank])

    def get(self, rank: int, default: Any = None) -> Any:
        i = self.slots.get(rank)
        return default if i is None else RankState(self, i)

    def __contains__(self, rank: object) -> bool:
        return rank in self.slots

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        return iter(self.slots)

    def items(self) -> Iterator[tuple[int, RankState]]:
        return ((r, RankState(self, i)) for r, i in self.slots.items())

    def values(self) -> Iterator[RankState]:
        return (RankState(self, i) for i in self.slots.values())

    # -- baselines ---------------------------------------------------------------------------

    def observe(self, rows: np.ndarray, pos: np.ndarray, own_s: np.ndarray,
                data_s: np.ndarray, step_s: np.ndarray, flagged: np.ndarray,
                delay: int = 0) -> None:
        """Learn one step of each row (position, own work, input wait and step time,
        seconds) unless it was flagged. With ``delay``, a step is learned only once
        ``delay`` later steps were not flagged either: a flagged step drops the steps
        still pending before it (on a noisy rank, a fault's first steps are seldom
        flagged one by one, but rarely ``delay`` steps in a row pass clean)."""
        flagged = np.asarray(flagged, dtype=bool)
        self.pend_n[rows[flagged]] = 0
        ok = ~flagged
        rows = rows[ok]
        if not rows.size:
            return
        new = np.stack([pos[ok], own_s[ok], data_s[ok], step_s[ok]], axis=1)
        if delay <= 0:
            self._learn(rows, new)
            return
        if self.pend.shape[1] < delay:
            grown = np.zeros((self.pend.shape[0], delay, 4))
            grown[:, :self.pend.shape[1]] = self.pend
            self.pend = grown
        n = self.pend_n[rows]
        full = n >= delay
        if full.any():
            fr = rows[full]
            old = self.pend[fr, 0].copy()
            self.pend[fr, :delay - 1] = self.pend[fr, 1:delay]
            self.pend[fr, delay - 1] = new[full]
            self._learn(fr, old)
        part = ~full
        if part.any():
            pr = rows[part]
            self.pend[pr, n[part]] = new[part]
            self.pend_n[pr] = n[part] + 1

    def _learn(self, rows: np.ndarray, x: np.ndarray) -> None:
        """Learned steps (columns: position, own, data, step), one per row."""
        self.work.update(rows, x[:, 0])
        a = self.alpha
        step, own = x[:, 3], x[:, 1]
        for name, v in (("step", step), ("own", own), ("comm", np.maximum(step - own, 0.0)),
                        ("data", x[:, 2])):
            m, q, n = (getattr(self, f"{name}_{s}") for s in "mqn")
            first = n[rows] == 0
            m[rows] = np.where(first, v, a * v + (1 - a) * m[rows])
            q[rows] = np.where(first, v * v, a * (v * v) + (1 - a) * q[rows])
            n[rows] += 1

    def ew_mean(self, name: str, rows: Any) -> Any:
        n = getattr(self, f"{name}_n")[rows]
        return np.where(n > 0, getattr(self, f"{name}_m")[rows], 0.0)


class _Work:
    """A row's own-work window: ``median``, ``sigma`` (IQR / 1.349), ``n``."""

    __slots__ = ("_t", "_i")

    def __init__(self, table: RankTable, i: int) -> None:
        self._t, self._i = table, i

    @property
    def n(self) -> int:
        return int(self._t.work.n[self._i])

    @property
    def median(self) -> float:
        return float(self._t.work.med[self._i])

    @property
    def sigma(self) -> float:
        return float(self._t.work.sig[self._i])


class _EW:
    """A row's exponentially weighted ``mean`` / ``var`` / ``std`` of one part, ``n``."""

    __slots__ = ("_t", "_i", "_name")

    def __init__(self, table: RankTable, i: int, name: str) -> None:
        self._t, self._i, self._name = table, i, name

    @property
    def n(self) -> int:
        return int(getattr(self._t, f"{self._name}_n")[self._i])

    @property
    def mean(self) -> float:
        return float(getattr(self._t, f"{self._name}_m")[self._i]) if self.n else 0.0

    @property
    def var(self) -> float:
        if not self.n:
            return 0.0
        m = float(getattr(self._t, f"{self._name}_m")[self._i])
        return float(getattr(self._t, f"{self._name}_q")[self._i]) - m * m

    @property
    def std(self) -> float:
        return math.sqrt(max(self.var, 0.0))


_SCALARS = {**{n: float for n in FLOATS}, **{n: int for n in INTS}, **{n: bool for n in BOOLS}}


class RankState:
    """One rank's row of a ``RankTable``, read and written as attributes (``kind`` as
    None / "change" / "far"); ``RankState()`` alone is a one-rank table's row."""

    __slots__ = ("_t", "_i")

    def __init__(self, table: RankTable | None = None, i: int | None = None) -> None:
        if table is None:
            table = RankTable()
            i = int(table.slots_for([0])[0])
        object.__setattr__(self, "_t", table)
        object.__setattr__(self, "_i", i)

    def __getattr__(self, name: str) -> Any:
        cast = _SCALARS.get(name)
        t, i = self._t, self._i
        if cast is not None:
            return cast(getattr(t, name)[i])
        if name == "kind":
            return KINDS[int(t.kind[i])]
        if name == "work":
            return _Work(t, i)
        if name in EW_STATS:
            return _EW(t, i, name)
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "kind":
            self._t.kind[self._i] = KIND_CODE[value]
        elif name in _SCALARS:
            getattr(self._t, name)[self._i] = value
        else:
            raise AttributeError(name)

    def observe(self, pos: float, own_s: float, data_s: float, step_s: float,
                flagged: bool, delay: int = 0) -> None:
        """``RankTable.observe`` of this one row."""
        self._t.observe(np.array([self._i]), np.array([pos]), np.array([own_s]),
                        np.array([data_s]), np.array([step_s]), np.array([flagged]), delay)

    def usual(self) -> dict[str, float]:
        """The learned parts of a normal step (seconds), for incident evidence."""
        return {name: round(getattr(self, name).mean, 4) for name in EW_STATS
                if getattr(self, name).n}


class LegacyRankState:
    """A rank as snapshots before version 9 pickled it (one object, river statistics):
    ``models.migrate`` turns a job's into its ``RankTable``."""

    def __setstate__(self, state: Any) -> None:
        # slotted objects pickle as (None, {slot: value})
        d = state[1] if isinstance(state, tuple) else state
        self.__dict__.update(d or {})
