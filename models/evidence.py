"""Evidence that accumulates: a test on each rank's MEAN excess over recent steps.

Per-step scores of own work cannot single out a rank that is steadily 15-50 %
slower on a noisy job (4 ranks sharing 2 CPU cores: own work varies tens of
per cent from step to step), yet the mean over a dozen steps does. For every
rank ``Windows`` keeps the last ``width`` values of a relative-excess series
(own work over a reference, minus one; NaN where the rank was not judged) and
``test`` asks, over trailing windows of ``scales`` steps, whether the mean
excess is at least ``delta`` and above ``delta / 2`` by ``z_crit`` standard
errors of that mean. The standard error is the larger of the per-step noise
learned from clean steps (``sigma``, many samples) and the window's own sample
deviation (a fault that comes and goes, a spike inside the window), over
sqrt(n): a short window needs a large excess, a long one only a moderate one,
and one spike never confirms anything (its own deviation swamps it).

Everything is numpy over the ranks of a job, once per judged step.

>>> import numpy as np
>>> w = Windows(width=12)
>>> rows = w.rows_for([0, 1])
>>> for k in range(12):
...     w.push(rows, np.array([0.0, 0.5 + 0.1 * (k % 2)]))
>>> ok, mean, z, n = w.test(rows, np.array([0.1, 0.1]), delta=0.05, z_crit=4.0)
>>> ok.tolist(), round(float(mean[1]), 2), int(n[1])
([False, True], 0.55, 12)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.models.config import EvidenceConfig, JobConfig
from failslow.models.cusum import capped_increment

# Every threshold of these tests is a setting of ``EvidenceConfig`` (``[rules.evidence]``,
# models/config.py, documented in docs/detection.md): ``Windows(width, p)``.
#
# The far verdict's bar over windows holding ``long_n`` (24) values or more, ``long_z``
# (3): its evidence is its size (a mean of at least 0.9 far_rel, twice the largest steady
# difference between healthy parts); the winsorized mean of 24 values or more is close to
# normal, so its z only has to show that mean is not noise at the usual one-sided 3 sigma
# (p ~ 1e-3). Shorter windows keep z_min for the heavy tails of a few steps' mean (bursts).
# Over 106 kept real traces, healthy ranks' far z at 24 and 32 steps peaked at 2.3 (at 6
# steps: 5.7).
ROBUST_MAD = 1.4826          # MAD of normal noise -> its sigma (a property of the normal law)


def _rowmedian(w: np.ndarray) -> np.ndarray:
    """Median of each row, NaN ignored (NaN for a row of NaN): ``np.median`` where no
    value is missing (the middle value, or the mean of the two middle ones).

    With values missing: the rows sorted (NaN last), the mean of the two middle values
    of each row's count (the middle one twice for an odd count), what ``np.nanmedian``
    computes for rows this short (a masked sort, then (low + high) / 2), without its
    masked arrays and warnings: ~10x faster at 1,024 ranks."""
    missing = np.isnan(w)
    if not w.shape[1]:
        return np.median(w, axis=1)
    # Rows sorted whole (NaN last): numpy sorts a few dozen values a row several times
    # faster than its median's partition (1,024 x 32: ~0.1 vs ~0.9 ms) and the order
    # statistics are the same values, so the medians are identical bit for bit.
    s = np.sort(w, axis=1)
    if not missing.any():
        k = w.shape[1] // 2
        return s[:, k].copy() if w.shape[1] % 2 else (s[:, k - 1] + s[:, k]) / 2.0
    cnt = w.shape[1] - missing.sum(axis=1)
    hi = cnt // 2
    lo = np.where(cnt % 2 == 1, hi, hi - 1)
    rows = np.arange(w.shape[0])
    if cnt.size and cnt[0] > 0 and (cnt == cnt[0]).all():
        # Every row holds as many values (the usual case: ranks get their values at the
        # same steps): the two order statistics are the same columns of every row.
        return (s[:, lo[0]] + s[:, hi[0]]) / 2.0
    med = (s[rows, np.maximum(lo, 0)] + s[rows, np.minimum(hi, w.shape[1] - 1)]) / 2.0
    med[cnt == 0] = np.nan
    return med


class Windows:
    """The last ``width`` values of one series for every rank of a job; ``p`` the
    thresholds of its tests.

    Within one judged step (``begin``), what the tests ask of the step's rows again and
    again is computed once: window statistics until the next ``push``, statistics of the
    learned moments until the next ``learn`` (memos, never pickled)."""

    _rows_key: Any = None      # the step's rows (``begin``): the memos hold for them only
    _vm: dict | None = None    # memo of what depends on the values
    _mm: dict | None = None    # memo of what depends on the learned moments
    # the ranks of the last ``rows_for`` and their rows (a step's ranks come again and
    # again: one list comparison, not a lookup per rank); never pickled
    _last: tuple[list[int], np.ndarray] | None = None
    # job-wide statistics of the learned moments (``_pools``), for ``mom`` as it is until
    # the next ``learn`` (whatever rows a test reads): (that ``mom``, the memo); never pickled
    _pool: tuple[np.ndarray, dict] | None = None

    # What a Windows unpickled from before its settings were stored ran with.
    p: EvidenceConfig = EvidenceConfig()

    def __init__(self, width: int, p: EvidenceConfig | None = None) -> None:
        self.width = width
        if p is not None:
            self.p = p
        self.rows: dict[int, int] = {}
        self.vals = np.full((0, width), np.nan)
        # Per row: exponentially weighted mean, variance and lag-1 covariance of the
        # series over clean steps, and how many steps they learned.
        self.mom = np.zeros((0, 5))

    def rows_for(self, ranks: list[int]) -> np.ndarray:
        """Row index of each rank, adding rows for ranks seen for the first time."""
        last = self._last
        if last is not None and type(ranks) is list and last[0] == ranks:
            return last[1].copy()       # the ranks of the last call (rows are never taken out)
        new = [r for r in ranks if r not in self.rows]
        if new:
            for r in new:
                self.rows[r] = len(self.rows)
            grow = np.full((len(self.rows) - self.vals.shape[0], self.width), np.nan)
            self.vals = np.vstack([self.vals, grow])
            self.mom = np.vstack([self.mom, np.zeros((grow.shape[0], 5))])
        out = np.fromiter(map(self.rows.__getitem__, ranks), dtype=np.int64, count=len(ranks))
        self._last = (list(ranks), out.copy())
        return out

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for name in ("_rows_key", "_vm", "_mm", "_last", "_pool"):
            d.pop(name, None)
        return d

    def _pools(self) -> dict:
        """The memo of job-wide statistics of the learned moments (medians over every
        row whose noise is learned): they hold until ``mom`` changes (``learn``, or new
        rows), for the step's tests and for tests of a few rows alike."""
        got = self._pool
        if got is None or got[0] is not self.mom:
            got = self._pool = (self.mom, {})
        return got[1]

    def _known(self) -> tuple[np.ndarray, bool]:
        """Per row: its noise learned (``noise_min`` steps); whether enough rows' are to
        pool them (``pool_min_ranks``)."""
        memo = self._pools()
        got = memo.get("known")
        if got is None:
            known = self.mom[:, 3] >= self.p.noise_min
            got = memo["known"] = (known, bool(known.sum() >= self.p.pool_min_ranks))
        return got

    def begin(self, rows: np.ndarray) -> None:
        """A judged step's tests of ``rows`` start (memos for them from now on)."""
        self._rows_key, self._vm, self._mm = rows, {}, {}

    def _memo(self, rows: np.ndarray, moments: bool) -> dict | None:
        if rows is not self._rows_key:
            return None
        return self._mm if moments else self._vm

    def push(self, rows: np.ndarray, values: np.ndarray) -> None:
        """One judged step: ``values`` for ``rows`` (NaN: no value), NaN for the others."""
        if self._vm:
            self._vm = {}
        v = self.vals
        v[:, :-1] = v[:, 1:]
        v[:, -1] = np.nan
        v[rows, -1] = values

    def learn(self, rows: np.ndarray, mask: np.ndarray) -> None:
        """Learn the noise of ``rows`` where ``mask``: its variance, its step-to-step
        correlation (noise that persists a few steps, a rank that keeps losing the same
        core, makes a window's mean vary more than independent steps would) and the
        variance of block means. From the value ``noise_delay`` steps old: ``mask``
        says that no drift was suspected since, so a fault's first steps are never
        taken for noise before the test had a chance to see them."""
        p = self.p
        d = p.noise_delay
        if self._mm:
            self._mm = {}
        self._pool = None
        x, y = self.vals[rows, -1 - d], self.vals[rows, -2 - d]
        ok = mask & ~np.isnan(x)
        pair = ~np.isnan(y[ok])         # the correlation needs the step before, too
        r = rows[ok]
        if not r.size:
            return
        m = self.mom[r]
        a = np.maximum(p.rho_alpha, 1.0 / (m[:, 3] + 1.0))    # a plain mean while few
        # Winsorized at ``winsor`` noise sigmas once known: the first steps of a fault (or a
        # one-off pause) must not pass for noise and mask the steps that follow.
        known = m[:, 3] >= p.noise_min
        cap = np.where(known, p.winsor * np.sqrt(np.maximum(m[:, 1], 0.0)), np.inf)
        dx = np.clip(x[ok] - m[:, 0], -cap, cap)
        dy = np.clip(np.where(pair, y[ok], m[:, 0]) - m[:, 0], -cap, cap)
        mu = m[:, 0] + a * dx
        m[:, 1] += a * (dx ** 2 - m[:, 1])
        m[:, 2] += np.where(pair, a * (dx * dy - m[:, 2]), 0.0)
        m[:, 0] = mu
        # The variance of a ``block_n``-step mean, measured: whatever the correlation
        # structure of the noise (persistent contention plus white reference noise),
        # this is what a window's mean really does on a clean rank.
        cnt, mean, _ = self.stats(r, p.block_n, d)
        full = cnt >= p.min_fill * p.block_n
        bcap = np.where(known, p.winsor * np.sqrt(np.maximum(m[:, 1], 0.0)), np.inf)
        db = np.clip(mean - mu, -bcap, bcap)
        m[:, 4] += np.where(full, a * (db ** 2 - m[:, 4]), 0.0)
        m[:, 3] += 1
        self.mom[r] = m

    @staticmethod
    def learn_many(items: list[tuple[Windows, np.ndarray, np.ndarray]]) -> None:
        """``w.learn(rows, mask)`` for each (w, rows, mask) of ``items``, each ``w`` at most
        once (its own rows, its own moments: the order does not matter), in one pass of
        numpy over all their rows (a sub-step tick learns eight rows: numpy's fixed cost
        per call, not the rows, was the cost). Every value is the one ``learn`` computes:
        the same element-wise operations, and each row's block mean summed over that row's
        own values (a fresh array of ``block_n`` columns, as ``stats``), bit for bit."""
        if len(items) < 2 or any(w.p is not items[0][0].p or w.width != items[0][0].width
                                 for w, _, _ in items):
            for w, rows, mask in items:
                w.learn(rows, mask)
            return
        p = items[0][0].p
        d = p.noise_delay
        width = items[0][0].width
        for w, _, _ in items:
            if w._mm:
                w._mm = {}
            w._pool = None
        vals = np.concatenate([w.vals[rows] for w, rows, _ in items])
        mom = np.concatenate([w.mom[rows] for w, rows, _ in items])
        x, y = vals[:, -1 - d], vals[:, -2 - d]
        ok = np.concatenate([mask for _, _, mask in items]) & ~np.isnan(x)
        if not ok.any():
            return
        x, y = x[ok], y[ok]
        pair = ~np.isnan(y)
        m = mom[ok]
        a = np.maximum(p.rho_alpha, 1.0 / (m[:, 3] + 1.0))
        known = m[:, 3] >= p.noise_min
        cap = np.where(known, p.winsor * np.sqrt(np.maximum(m[:, 1], 0.0)), np.inf)
        dx = np.clip(x - m[:, 0], -cap, cap)
        dy = np.clip(np.where(pair, y, m[:, 0]) - m[:, 0], -cap, cap)
        mu = m[:, 0] + a * dx
        m[:, 1] += a * (dx ** 2 - m[:, 1])
        m[:, 2] += np.where(pair, a * (dx * dy - m[:, 2]), 0.0)
        m[:, 0] = mu
        # ``stats(r, block_n, noise_delay)``'s count and mean (its deviation is not read)
        n = p.block_n
        b = vals[ok, -n - d:width - d]
        has = ~np.isnan(b)
        cnt = has.sum(axis=1)
        mean = np.where(has, b, 0.0).sum(axis=1) / np.maximum(cnt, 1)
        full = cnt >= p.min_fill * n
        bcap = np.where(known, p.winsor * np.sqrt(np.maximum(m[:, 1], 0.0)), np.inf)
        db = np.clip(mean - mu, -bcap, bcap)
        m[:, 4] += np.where(full, a * (db ** 2 - m[:, 4]), 0.0)
        m[:, 3] += 1
        mom[ok] = m
        at = 0
        for w, rows, _ in items:
            w.mom[rows] = mom[at:at + rows.size]
            at += rows.size

    def inflation(self, rows: np.ndarray, n: int) -> np.ndarray:
        """Variance of an ``n``-step mean over that of independent steps, for AR(1)
        noise with each row's learned correlation (shrunk to a prior while few steps
        were learned): 1 + 2 sum_k (1 - k/n) rho^k."""
        memo = self._memo(rows, True)
        if memo is not None and ("inflation", n) in memo:
            return memo["inflation", n]
        rho = memo.get("rho") if memo is not None else None
        if rho is None:
            rho = self._rho(rows)
            if memo is not None:
                memo["rho"] = rho
        lag = np.arange(1, n)
        if memo is None:
            power = rho[:, None] ** lag
        else:
            # rho ** k for every lag of the longest window, once: each test's window takes
            # its first n - 1 (the same powers, element by element)
            power = memo.get("power")
            if power is None or power.shape[1] < n - 1:
                power = memo["power"] = rho[:, None] ** np.arange(1, max(n, self.width))
            power = power[:, :n - 1]
        out = 1.0 + 2.0 * ((1.0 - lag / n) * power).sum(axis=1)
        if memo is not None:
            memo["inflation", n] = out
        return out

    def _rho(self, rows: np.ndarray) -> np.ndarray:
        """Each row's step-to-step correlation (``inflation``)."""
        p = self.p
        m = self.mom[rows]
        rho = np.where(m[:, 1] > 0, m[:, 2] / np.maximum(m[:, 1], 1e-12), 0.0)
        rho = (m[:, 3] * rho + p.rho_prior_n * p.rho_prior) / (m[:, 3] + p.rho_prior_n)
        known, enough = self._known()
        if enough:
            pools = self._pools()
            med = pools.get("rho")
            if med is None:
                k = self.mom[known]
                med = pools["rho"] = float(np.median(k[:, 2] / np.maximum(k[:, 1], 1e-12)))
            rho = np.maximum(rho, med)
        return np.clip(rho, 0.0, p.rho_max)

    def learned(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row's noise is known: learned over enough clean steps, its own
        or (``_pooled``) that of three or more peers."""
        known, enough = self._known()
        return known[rows] | enough

    def _pooled(self, rows: np.ndarray, col: int) -> np.ndarray:
        """Column ``col`` of the learned moments of ``rows``, between the median over the
        job's rows and ``pool_cap`` times it (in sigma): ranks doing the same work have
        about the same noise; one whose estimate came out low by chance is not
        trusted below its peers', and a fault that slipped into one rank's estimate
        cannot blind it."""
        memo = self._memo(rows, True)
        if memo is not None and ("pooled", col) in memo:
            return memo["pooled", col]
        m, p = self.mom, self.p
        known, enough = self._known()
        own = np.where(known[rows], np.maximum(m[rows, col], 0.0), 0.0)
        if enough:
            # A rank whose noise is not learned yet (new, or slow since before it
            # could be) takes its peers'.
            pools = self._pools()
            pool = pools.get(("pool", col))
            if pool is None:
                pool = pools["pool", col] = float(np.median(m[known, col]))
            own = np.where(known[rows], np.clip(own, p.pool_floor ** 2 * pool, p.pool_cap ** 2 * pool), pool)
        if memo is not None:
            memo["pooled", col] = own
        return own

    def noise(self, rows: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """Per-step noise of the series: the larger of ``sigma`` (robust, from the
        caller) and the standard deviation learned over clean steps, tails included
        (a mean feels every spike that a robust sigma ignores). Until one is learned,
        twice ``sigma``: a robust sigma misses the tails of noisy jobs."""
        learned = self._pooled(rows, 1)
        return np.where(learned > 0, np.maximum(sigma, np.sqrt(learned)), self.p.unlearned * sigma)

    def mean_se(self, rows: np.ndarray, sigma: np.ndarray, sd: np.ndarray, cnt: np.ndarray,
                n: int) -> np.ndarray:
        """Standard error of an ``n``-step mean: per-step noise (``sigma`` or the
        window's own ``sd``) inflated for step-to-step correlation, or the measured
        variance of ``block_n``-step means scaled to n steps, whichever is larger."""
        se = np.maximum(sigma, sd) * np.sqrt(self.inflation(rows, n) / np.maximum(cnt, 1))
        return np.maximum(se, np.sqrt(self._pooled(rows, 4) * self.p.block_n / n))

    def stats(self, rows: np.ndarray, n: int, skip: int = 0
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(count, mean, sample std) of the last ``n`` values of ``rows`` (before the
        newest ``skip``)."""
        memo = self._memo(rows, False)
        if memo is not None and ("stats", n, skip) in memo:
            return memo["stats", n, skip]
        w = self.vals[rows, -n - skip:self.width - skip]
        ok = ~np.isnan(w)
        cnt = ok.sum(axis=1)
        x = np.where(ok, w, 0.0)
        c = np.maximum(cnt, 1)
        mean = x.sum(axis=1) / c
        var = np.where(ok, (w - mean[:, None]) ** 2, 0.0).sum(axis=1) / np.maximum(cnt - 1, 1)
        out = cnt, mean, np.sqrt(var)
        if memo is not None:
            memo["stats", n, skip] = out
        return out

    def robust_stats(self, rows: np.ndarray, n: int, sigma: np.ndarray,
                     pool: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(count, winsorized mean, robust spread) of the last ``n`` values of ``rows``.

        The spread is the window's MAD (as a normal sigma, 1.4826 MAD), at least
        ``sigma``; values are clipped at ``robust_clip`` spreads from the window's
        median before the mean, so a spike moves the mean by at most ``robust_clip``
        spreads / n whatever its size, and the mean's noise is that of values
        within a few spreads: spread / sqrt(n). A sample standard deviation would
        count a fault's own step-to-step swings (a straggler whose slowdown comes on
        most steps, not all) as noise and never confirm it."""
        w = self.vals[rows, -n:]
        ok = ~np.isnan(w)
        cnt = ok.sum(axis=1)
        if not w.size:
            return cnt, np.zeros(rows.size), sigma
        memo = self._memo(rows, False) if n == self.width else None
        got = memo.get("row_mad") if memo is not None else None
        if got is not None:
            med, mad = got[0], ROBUST_MAD * got[1]
        else:
            med = _rowmedian(w)
            mad = ROBUST_MAD * _rowmedian(np.abs(w - med[:, None]))
        med = np.nan_to_num(med)
        mad = np.nan_to_num(mad)
        # The job's usual spread now (``_mad_pool``): ranks doing the same work share
        # the machine's noise; one whose window came out tight by chance is not
        # trusted below its peers.
        if pool is None:
            pool = self._mad_pool(rows)
        spread = np.maximum(np.maximum(mad, pool), sigma)
        clip = self.p.robust_clip
        c = np.clip(w, (med - clip * spread)[:, None], (med + clip * spread)[:, None])
        mean = np.where(ok, c, 0.0).sum(axis=1) / np.maximum(cnt, 1)
        # A median and MAD of a few values are no estimate: rows with fewer than
        # ``robust_min_n`` values keep the plain mean and the larger of sigma and their
        # sample deviation (a job's first steps, a rank that just joined).
        few = np.flatnonzero(cnt < self.p.robust_min_n)
        if few.size:
            # their plain statistics only (a row's are its own: the same bits in any subset)
            _, m0, sd0 = self.stats(rows[few], n)
            mean[few] = m0
            spread[few] = np.maximum(np.broadcast_to(sigma, rows.shape)[few], sd0)
        return cnt, mean, spread

    def _mad_pool(self, rows: np.ndarray) -> float:
        """The job's usual spread now: the median over its ranks of each one's MAD
        spread over the whole window (ranks with half a window or more; three such
        ranks at least, else 0)."""
        memo = self._memo(rows, False)
        if memo is not None and "mad_pool" in memo:
            return memo["mad_pool"]
        out = self._mad_pool_of(rows)
        if memo is not None:
            memo["mad_pool"] = out
        return out

    def _mad_pool_of(self, rows: np.ndarray) -> float:
        w = self.vals[rows]
        cnt = (~np.isnan(w)).sum(axis=1)
        full = cnt >= self.p.min_fill * self.width
        if full.sum() < self.p.pool_min_ranks:
            return 0.0
        memo = self._memo(rows, False)
        if memo is None:
            w = w[full]
            mad = _rowmedian(np.abs(w - _rowmedian(w)[:, None]))
        else:
            # every row's median and MAD over the whole window, which ``robust_stats``
            # takes again this step (a row's are its own: the same bits in any subset)
            med = _rowmedian(w)
            mad_all = _rowmedian(np.abs(w - med[:, None]))
            memo["row_mad"] = (med, mad_all)
            mad = mad_all[full]
        return float(ROBUST_MAD * np.median(mad))

    def test(self, rows: np.ndarray, sigma: np.ndarray, delta: float, z_crit: float,
             scales: tuple[int, ...] | None = None, robust: bool = False,
             z_long: float | None = None, memo: dict | None = None,
             hits_only: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per row: (confirmed, mean excess, z, window) of the best trailing window,
        ``z = (mean - delta / 2) / (max(sigma, sample std) / sqrt(count))``;
        confirmed where some window holds mean >= 0.9 delta and z >= z_crit.
        ``robust``: the window's winsorized mean and MAD spread (``robust_stats``)
        instead of its mean and sample deviation. ``scales``: the windows (``p.scales``
        unless given). ``z_long``: the bar for windows holding ``p.long_n`` values or more, where lower than ``z_crit``. ``memo``: a dict shared by
        tests of the same rows, ``sigma`` and ``robust`` this step (only ``delta`` and the
        bars differ): each window's count, mean and standard error are computed once.

        ``hits_only`` (no ``memo``): the caller reads a row's mean, z and window only
        where it is confirmed. Only the rows that can confirm (``_may_reach``: a window's
        mean is at most its largest value) are tested; the others are not confirmed
        either way, and take mean 0, z -inf, window 0 (the full test's may differ:
        unread). A tested row's values are the full test's, bit for bit (a row's
        statistics are its own; the job's spread ``_mad_pool`` is taken over every row)."""
        p = self.p
        k = rows.size
        best_z = np.full(k, -np.inf)
        best_m = np.zeros(k)
        best_n = np.zeros(k, dtype=np.int64)
        ok = np.zeros(k, dtype=bool)
        floor = p.mean_floor * delta
        if hits_only and memo is None and floor > 0:
            at = np.flatnonzero(self._may_reach(rows, floor))
            if at.size:
                got = self.test(rows[at], np.broadcast_to(sigma, rows.shape)[at], delta, z_crit,
                                scales, robust, z_long,
                                memo={"pool": self._mad_pool(rows) if robust else 0.0})
                for out, part in zip((ok, best_m, best_z, best_n), got, strict=True):
                    out[at] = part
            return ok, best_m, best_z, best_n
        memo = {} if memo is None else memo
        if "sigma" not in memo:
            memo["sigma"] = self.noise(rows, sigma)
        if "pool" not in memo:
            memo["pool"] = self._mad_pool(rows) if robust else 0.0
        sigma, pool = memo["sigma"], memo["pool"]
        for n in p.scales if scales is None else scales:
            if n > self.width:
                break
            if n not in memo:
                rob = robust and n >= p.robust_min_n
                cnt, mean, sd = self.robust_stats(rows, n, sigma, pool) if rob \
                    else self.stats(rows, n)
                # robust: ``sd`` is the robust spread, floored by the learned noise already
                memo[n] = (cnt, mean, self.mean_se(rows, sd if rob else sigma, sd, cnt, n))
            cnt, mean, se = memo[n]
            z = np.where(cnt >= p.min_fill * n, (mean - delta / 2) / np.maximum(se, 1e-9), -np.inf)
            # the long bar where the window holds long_n values or more (near-normal mean)
            bar = np.where(cnt >= p.long_n, min(z_crit, z_long), z_crit) \
                if z_long is not None and n >= p.long_n else z_crit
            hit = (z >= bar) & (mean >= floor)
            # The confirming window wins over a longer, stronger-looking one that did not.
            take = (hit & ~ok) | ((hit == ok) & (z > best_z))
            best_z = np.where(take, z, best_z)
            best_m = np.where(take, mean, best_m)
            best_n = np.where(take, n, best_n)
            ok |= hit
        return ok, best_m, best_z, best_n

    def _may_reach(self, rows: np.ndarray, level: float) -> np.ndarray:
        """Rows whose window mean (plain, ``stats``, or robust, ``robust_stats``), over
        any trailing window, can be ``level`` (> 0) or more: those holding a value that high.

        A bound, never a guess: a value clipped from below is raised to at most the
        window's median, which is at most its largest value, and one clipped from above
        lowers; a plain mean is at most that largest value, too. A sum of values each at
        most M > 0, divided by their count, is at most M (1 + count eps) in floating point
        (rounding is monotone; adding the 0 of a missing value is exact), so a margin of
        1e-9 of ``level`` covers any window of fewer than 1e6 values. NaN (no value) is
        skipped; a row of NaN has no window (count 0, never confirmed); +inf reaches."""
        top = np.fmax.reduce(self.vals[rows], axis=1) if self.width else np.full(rows.size, np.nan)
        least = level * (1.0 - 1e-9)     # a float tolerance (rounding), not a bar
        return top >= least

    def present(self, rows: np.ndarray, sigma: np.ndarray, delta: float,
                memo: dict | None = None) -> np.ndarray:
        """Still there: over the last 8, 16 or 32 steps (``present_scales``) the mean excess is at least
        ``delta / 2`` and one standard error above zero, and so is the mean of that
        window's newest quarter (``present_recent``: the excess has not left the recent
        steps). Looser than ``test``, so an open incident outlives noisy steps, and
        clears once the recent steps are clean: a long window's mean alone would keep
        an episode that ended alive for most of its length (a 12-step stall, over, in a
        32-step window).

        ``memo``: a dict shared by calls for the same rows and ``sigma`` (only ``delta``
        differs): each window's statistics are computed once."""
        out = np.zeros(rows.size, dtype=bool)
        memo = {} if memo is None else memo
        if "sigma" not in memo:
            memo["sigma"] = self.noise(rows, sigma)
        sigma = memo["sigma"]
        for n in self.p.present_scales:
            got = memo.get(n)
            if got is None:
                cnt, mean, sd = self.stats(rows, n)
                se = self.mean_se(rows, sigma, sd, cnt, n)
                _, recent, _ = self.stats(rows, max(n // self.p.present_recent,
                                                     self.p.present_recent_min))
                got = memo[n] = (cnt, mean, se, recent)
            cnt, mean, se, recent = got
            out |= (cnt >= self.p.min_fill * n) & (mean >= delta / 2) & (mean >= se) \
                & (recent >= delta / 2)
        return out

    def onset_back(self, row: int, mean: float) -> int:
        """Steps back (1 = the newest step) where a shift to ``mean`` most likely began:
        the start of the suffix maximizing the sum of (value - mean / 2), the classic
        CUSUM change-point estimate, over the whole window."""
        v = self.vals[row]
        gain = np.where(np.isnan(v), 0.0, v - mean / 2)
        suffix = np.cumsum(gain[::-1])       # suffix[j]: sum of the newest j + 1 values
        return int(np.argmax(suffix)) + 1


@dataclass
class Verdict:
    """One step's evidence, arrays over the step's ranks (see ``RankEvidence.judge``)."""

    inc: np.ndarray           # per-step evidence increment (z-units) of the fast path
    weak: np.ndarray          # weakly above its own past this step
    confirmed: np.ndarray     # a windowed test confirmed (own past, or far from peers)
    self_driven: np.ndarray   # the evidence is a change against its own past
    present: np.ndarray       # evidence still there (keeps a finding alive)
    suspect: np.ndarray       # possibly drifting: learn nothing from this step
    back: np.ndarray          # steps back to the estimated onset
    warm: np.ndarray          # its own past is learned
    imbalance: np.ndarray     # steadily off its peers with no change of its own
    imb_present: np.ndarray
    peer_mean: np.ndarray     # mean excess over peers, the longest window
    peer_n: np.ndarray
    mean: np.ndarray          # the best window's mean excess, its z, its length
    z: np.ndarray
    n: np.ndarray
    # "waited for by its group" (``WaitedFor``; ``RankEvidence.judge_waited``)
    waited: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    waited_present: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    waited_share: np.ndarray = field(default_factory=lambda: np.zeros(0))
    waited_lag: np.ndarray = field(default_factory=lambda: np.zeros(0))


class RankEvidence:
    """The evidence of every rank of one job, step after step.

    Two series per rank: ``rel`` (own work over its peers' reference, minus one;
    peers are the ranks of the same pipeline stage, none for a rank alone in its
    stage) and ``rel2`` (its position against the job over its own usual, minus
    one; only once its own past is learned). Three ways to stand out:

    - a change against its own past: the mean of ``rel2`` at least ``min_rel``
      (``Windows.test``), or per-step z-scores that accumulate fast (a CUSUM,
      for large excesses: two or three steps);
    - far outside its peers, whatever step it began: the mean of ``rel`` at
      least ``far_rel`` (see ``JobConfig``);
    - a steady imbalance: the mean of ``rel`` at least ``min_rel`` over the
      whole window with no change against its own past: recorded, never paged.

    A rank whose excess in seconds is under ``min_rel / 2`` of the job's step
    time cannot have slowed the job by ``min_rel``: a victim whose own work
    collapsed while it waited (its noise is large against a collapsed
    reference) never stands out.
    """

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.peer = Windows(cfg.evidence.width, cfg.evidence)
        self.own = Windows(cfg.evidence.width, cfg.evidence)
        self.calm = np.zeros(0, dtype=np.int64)   # per row: steps clean and unsuspected
        self.waited = WaitedFor(cfg.evidence)

    def judge_waited(self, v: Verdict, ranks: list[int], top: np.ndarray, lag: np.ndarray,
                     other: np.ndarray, job_s: float) -> None:
        """Add this step's "waited for by its group" evidence (``WaitedFor``) to ``v``:
        ``top`` 1 where the rank's group waited for it, 0 where it was a member of a group
        of three or more and was not, NaN where it was in none (or the step is not judged
        yet); ``lag`` the seconds charged to it; ``other`` another rank had a finding.
        A rank confirmed this way is a change against its own past (``self_driven``),
        its onset where its run of waited-for steps began."""
        w = self.waited
        rows = w.rows_for(ranks)
        w.push(rows, top, lag, other, job_s)
        ok, present, share, mean, back, steady, before = w.judge(rows, self.cfg.min_rel)
        v.waited, v.waited_present, v.waited_share, v.waited_lag = ok, present, share, mean
        v.self_driven = v.self_driven | ok
        v.back = np.where(ok & ~v.confirmed, back, v.back)
        # Waited for now and before the window too: the layout, recorded as a steady
        # imbalance (info, never a page) with the share of the step charged to it.
        rel = mean / (1.0 - np.minimum(mean, self.cfg.evidence.wait_share_max))
        new = steady & ~v.confirmed & ~ok & ~v.imbalance
        held = present & (before > self.cfg.evidence.wait_prior_max)
        v.imbalance = v.imbalance | new
        v.peer_mean = np.where(new | held, np.maximum(v.peer_mean, rel), v.peer_mean)
        v.peer_n = np.where(new, self.waited.width, v.peer_n)
        v.imb_present = v.imb_present | held

    def onset_back(self, row: int, lo: float, shift: float | None) -> int:
        """Steps back to the most likely start of the rank's excess (log ``shift``, or
        the last 6 steps' mean): on its own-past series where it has one (a change),
        else on its peer series."""
        ep = self.cfg.evidence
        least, recent_n = ep.onset_own_min, ep.onset_recent
        w = self.own if (~np.isnan(self.own.vals[row, -recent_n:])).sum() >= least \
            else self.peer
        if shift is None:
            _, recent, _ = w.stats(np.array([row]), recent_n)
            shift = float(recent[0])
        return w.onset_back(row, max(shift, lo))

    def judge(self, ranks: list[int], rel: np.ndarray, z: np.ndarray, rel2: np.ndarray,
              z2: np.ndarray, sig2: np.ndarray, peers: np.ndarray, warm: np.ndarray,
              early: bool, recent: np.ndarray, job_s: float, floor: float,
              clean: np.ndarray, need: np.ndarray | None = None) -> Verdict:
        """This step's evidence of each of ``ranks``. ``need``: the rows whose ``present``
        and ``imb_present`` are read (the others' are False), else every row's."""
        cfg = self.cfg
        p = cfg.evidence
        k = cfg.z_min / 2
        nan = np.nan
        rows = self.peer.rows_for(ranks)
        self.own.rows_for(ranks)                    # the same rows: ranks come in order
        self.peer.begin(rows)
        self.own.begin(rows)
        # Per step: only an excess of at least min_rel (far_rel against peers) counts
        # in full, and one step adds at most z_min, so a confirmation (cusum >= 2 z_min)
        # always spans two steps or more.
        sig_p = np.where(warm, sig2, floor)
        lrel = np.log1p(np.maximum(rel, -p.fast_max))
        lrel2 = np.log1p(np.maximum(rel2, -p.fast_max))
        # A step counts in noise units of the larger of the peers' spread and the
        # rank's own step-to-step spread, tails included (known once its past is).
        z = np.minimum(z, lrel / np.maximum(self.peer.noise(rows, sig_p), 1e-9))
        z2 = np.minimum(z2, lrel2 / np.maximum(self.own.noise(rows, sig2), 1e-9))
        # The one evidence rule (models.cusum): the larger of the peer verdict's and the
        # own-past verdict's capped increments.
        inc = np.maximum(capped_increment(np.where(peers, rel, -np.inf), z, cfg.far_rel, cfg),
                         capped_increment(rel2, z2, cfg.min_rel, cfg))
        top = np.maximum(np.maximum(rel, rel2), 0.0)
        gate = recent * top / (1.0 + top) >= cfg.min_rel / 2 * job_s
        inc = np.where(gate & (not early), inc, np.minimum(inc, 0.0))
        # The windows hold log(1 + excess): own work is a product of factors (clock,
        # contention, input), so its noise is about symmetric in log, not in ratio.
        self.peer.push(rows, np.where(peers & (not early), lrel, nan))
        self.own.push(rows, np.where(warm, lrel2, nan))

        def share(m: np.ndarray) -> np.ndarray:
            m = np.maximum(m, 0.0)
            return recent * m / (1.0 + m) >= cfg.min_rel / 2 * job_s

        lo, far = math.log1p(cfg.min_rel), math.log1p(cfg.far_rel)
        zc = cfg.z_min + p.window_z_extra   # several windows are tested each step
        own_memo: dict = {}     # the two own-past tests share their windows' statistics
        ok_s, m_s, z_s, n_s = self.own.test(rows, sig2, lo, zc, robust=True, memo=own_memo)
        ok_f, m_f, z_f, n_f = self.peer.test(rows, sig_p, far, zc, robust=True, z_long=p.long_z,
                                              hits_only=True)
        # A large change against its own past (far_rel, as large as the far verdict's
        # offset) over a long window: the far verdict's bar (long_z), its evidence its size.
        ok_l, m_l, z_l, n_l = self.own.test(rows, sig2, far, zc, scales=p.long_scales,
                                            robust=True, z_long=p.long_z, memo=own_memo)
        # Imbalance never pages: the plain bar, over the whole window.
        ok_i, m_i, _, n_i = self.peer.test(rows, sig_p, lo, cfg.z_min, scales=(self.peer.width,))
        m_s, m_f, m_i, m_l = np.expm1(m_s), np.expm1(m_f), np.expm1(m_i), np.expm1(m_l)
        ok_s &= share(m_s)
        ok_l &= share(m_l) & ~ok_s
        ok_f &= share(m_f)
        ok_i &= self.peer.learned(rows)
        # Steps where the rank may be drifting away (a window's mean stands three
        # standard errors above the allowance) do not teach its baseline: a slow fault
        # that has not confirmed yet must not become its usual.
        # Only a drift against its own past: a rank always that far from its peers
        # still has a noise to learn, around its offset.
        suspect = z_s >= p.suspect_z
        if ok_l.any():
            ok_s = ok_s | ok_l
            m_s, z_s, n_s = (np.where(ok_l, m_l, m_s), np.where(ok_l, z_l, z_s),
                             np.where(ok_l, n_l, n_s))
        if self.calm.size < len(self.peer.rows):
            self.calm = np.concatenate([self.calm, np.zeros(len(self.peer.rows) - self.calm.size,
                                                            dtype=np.int64)])
        # Noise is learned from steps outside a finding, ``noise_delay`` steps late so that a
        # fault confirms before it is learned, and not around a strong drift (z >= 3 is
        # rare enough on a clean rank that its excursions are still learned).
        calm = np.where(clean & ~suspect, self.calm[rows] + 1, 0)
        self.calm[rows] = calm
        learn = calm > p.noise_delay
        self.peer.learn(rows, learn)
        self.own.learn(rows, learn)
        if need is None:
            peer_memo: dict = {}     # the two peer tests share their windows' statistics
            present = self.own.present(rows, sig2, lo) | self.peer.present(rows, sig_p, far,
                                                                           peer_memo)
            imb_present = self.peer.present(rows, sig_p, cfg.min_rel, peer_memo)
        else:
            # Only the rows whose "still there" is read (``need``: an open finding or
            # imbalance); a row's tests are its own, so theirs are the same values.
            present = np.zeros(rows.size, dtype=bool)
            imb_present = np.zeros(rows.size, dtype=bool)
            at = np.flatnonzero(need)
            if at.size:
                r_at, sp_at = rows[at], sig_p[at]
                peer_memo = {}
                present[at] = self.own.present(r_at, np.broadcast_to(sig2, rows.shape)[at], lo) \
                    | self.peer.present(r_at, sp_at, far, peer_memo)
                imb_present[at] = self.peer.present(r_at, sp_at, cfg.min_rel, peer_memo)
        confirmed = ok_s | ok_f
        back = np.zeros(rows.size, dtype=np.int64)
        # read only where a finding opens (``models.attribution``: a rank without one,
        # ``clean``), so found only there
        for i in np.flatnonzero((confirmed | (inc > 0)) & clean):
            # The shift is the confirming window's mean (the last steps' for the fast path).
            shift = np.log1p(m_s[i]) if ok_s[i] else np.log1p(m_f[i]) if ok_f[i] else None
            back[i] = self.onset_back(int(rows[i]), lo, shift)
        mean = np.where(ok_s | ~ok_f, m_s, m_f)
        # A change against its own past, or a rank that has always been that far out:
        # over the last steps, is its excess over its own past like that over its peers?
        ep = cfg.evidence
        _, own4, _ = self.own.stats(rows, ep.self_driven_steps)
        _, own32, _ = self.own.stats(rows, self.own.width)   # no change of that size
        _, peer4, _ = self.peer.stats(rows, ep.self_driven_steps)
        self_driven = ok_s | (own4 >= ep.self_driven_share * np.maximum(peer4, lo))
        return Verdict(inc=inc, weak=(rel2 >= cfg.min_rel / 2) & (z2 >= k),
                       confirmed=confirmed, self_driven=self_driven, present=present,
                       suspect=suspect,
                       back=back, warm=warm,
                       imbalance=ok_i & share(m_i) & warm & ~confirmed & (own32 < p.mean_floor * lo),
                       imb_present=imb_present,
                       peer_mean=m_i, peer_n=n_i, mean=mean,
                       z=np.where(ok_s | ~ok_f, z_s, z_f), n=np.where(ok_s | ~ok_f, n_s, n_f))


# "Waited for by its group" (``WaitedFor``): in a synchronous collective the group waits
# for the member that arrives last (``models.alignment.waited_for``). A healthy member of
# an n-member group is the one waited for in a step with probability about 1/n, so being
# it in ``wait_k`` (12) or more of the last ``wait_n`` (16) judged steps is a binomial tail: for n = 4,
# P(X >= 12 | 16, 1/4) ~ 1e-4 (n = 3: ~3e-3 before the other bars; n = 8: ~1e-8), while
# a straggler is it nearly every step. wait_n = 16 outlasts the correlated disturbances
# measured on a shared 2-core VM (another tenant slowing one rank for 8-9 steps: healthy
# shares reach 0.88 over 8 steps, at most 0.81 over 16 in 144 healthy real-job series).
# It is a change against the rank's own past: over the steps before the window (at least
# ``wait_prior_min`` of them, the job's steps while no other rank had a finding) its share is
# at most ``wait_prior_max`` (a rank waited for since the first steps is the layout: steady
# imbalance, never a page). And the wait costs the job: the lag charged to it over the
# window is on average at least ``min_rel`` of the job's step, and the job's step time
# over the window is at least ``min_rel / 2`` above that over the steps before (a member
# that became the last because the others sped up cost nothing: victims are not culprits).
# (Settings of ``EvidenceConfig``: wait_n, wait_k, wait_prior_n, wait_prior_min,
# wait_prior_max, wait_present.)


class WaitedFor:
    """Per rank and judged step: whether its group waited for it, and the lag charged to
    it (a fraction of the job's step); per step the job's step time. Numpy over the
    job's ranks, once per judged step."""

    # What a WaitedFor unpickled from before its settings were stored ran with.
    p: EvidenceConfig = EvidenceConfig()

    def __init__(self, p: EvidenceConfig | None = None) -> None:
        if p is not None:
            self.p = p
        self.width = self.p.wait_n + self.p.wait_prior_n
        self.rows: dict[int, int] = {}
        self.top = np.full((0, self.width), np.nan)    # 1 waited for, 0 not, NaN no group
        self.lag = np.zeros((0, self.width))
        self.other = np.zeros((0, self.width), dtype=bool)   # another rank had a finding
        self.job = np.full(self.width, np.nan)

    # as ``Windows._last``; never pickled
    _last: tuple[list[int], np.ndarray] | None = None

    def rows_for(self, ranks: list[int]) -> np.ndarray:
        last = self._last
        if last is not None and type(ranks) is list and last[0] == ranks:
            return last[1].copy()
        new = [r for r in ranks if r not in self.rows]
        if new:
            for r in new:
                self.rows[r] = len(self.rows)
            k = len(self.rows) - self.top.shape[0]
            self.top = np.vstack([self.top, np.full((k, self.width), np.nan)])
            self.lag = np.vstack([self.lag, np.zeros((k, self.width))])
            self.other = np.vstack([self.other, np.zeros((k, self.width), dtype=bool)])
        out = np.fromiter(map(self.rows.__getitem__, ranks), dtype=np.int64, count=len(ranks))
        self._last = (list(ranks), out.copy())
        return out

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("_last", None)
        return d

    def push(self, rows: np.ndarray, top: np.ndarray, lag: np.ndarray, other: np.ndarray,
             job_s: float) -> None:
        """One judged step: ``top`` (1 / 0 / NaN), ``lag`` (seconds) and whether another
        rank had a finding, for ``rows``; ``job_s`` the step's time."""
        for a in (self.top, self.lag, self.other, self.job):
            a[..., :-1] = a[..., 1:]
        self.top[:, -1] = np.nan
        self.lag[:, -1] = 0.0
        self.other[:, -1] = False
        self.top[rows, -1] = top
        self.lag[rows, -1] = lag / job_s if job_s > 0 else 0.0
        self.other[rows, -1] = other
        self.job[-1] = job_s

    def now(self, rank: int) -> float:
        """The lag charged to ``rank`` in the newest judged step (fraction of the job's
        step), 0 when its group did not wait for it then: the step's own excess, where
        ``judge``'s mean spans ``wait_n`` steps."""
        row = self.rows.get(rank)
        if row is None or self.top[row, -1] != 1.0:
            return 0.0
        return float(self.lag[row, -1])

    def judge(self, rows: np.ndarray, min_rel: float) -> tuple[np.ndarray, ...]:
        """Per row: (confirmed, present, share of the last wait_n steps, mean lag charged
        over them as a fraction of the job's step, steps back to the onset, steady: as
        confirmed but waited for before the window too, its share before the window)."""
        p = self.p
        wn = p.wait_n
        top = self.top[rows]
        win = top[:, -wn:]
        hit = np.nan_to_num(win).sum(axis=1)
        share = hit / wn
        lag = self.lag[rows, -wn:].mean(axis=1)
        prior = np.where(self.other[rows, :-wn], np.nan, top[:, :-wn])
        pn = (~np.isnan(prior)).sum(axis=1)
        pshare = np.nan_to_num(prior).sum(axis=1) / np.maximum(pn, 1)
        jw, jp = self.job[-wn:], self.job[:-wn]
        jw, jp = jw[~np.isnan(jw)], jp[~np.isnan(jp)]
        rise = float(np.median(jw)) / float(np.median(jp)) - 1.0 \
            if jw.size and jp.size and np.median(jp) > 0 else 0.0
        confirmed = (hit >= p.wait_k) & (pn >= p.wait_prior_min) & (pshare <= p.wait_prior_max) \
            & (lag >= min_rel) & (rise >= min_rel / 2)
        present = (share >= p.wait_present) & (lag >= min_rel / 2)
        back = np.zeros(rows.size, dtype=np.int64)
        for i in np.flatnonzero(confirmed):
            # the CUSUM change-point of the 0/1 series: the suffix that gains the most
            v = np.nan_to_num(top[i, -wn:]) - (share[i] + pshare[i]) / 2
            back[i] = int(np.argmax(np.cumsum(v[::-1]))) + 1
        steady = (hit >= p.wait_k) & (pn >= p.wait_prior_min) & (pshare > p.wait_prior_max) \
            & (lag >= min_rel)
        return confirmed, present, share, lag, back, steady, np.where(pn > 0, pshare, 0.0)
