"""Bayesian online change-point detection (Adams & MacKay 2007) on one series.

Used on the job's step time (FALCON's test). Each run is a Gaussian with
unknown mean and variance (Normal-Gamma prior, Student-t predictive); the
hazard is constant; the run-length posterior is truncated at ``max_run``. A
small outlier mixture (``outlier``) keeps one wild sample from ending a long
run, so single-step spikes (a checkpoint, a GC pause) do not look like changes.
Feed it ``log(step_time)`` so every threshold is relative (scale-free).

A change is *confirmed* (``drift_detected``) when more than ``threshold`` of
the posterior sits on runs that started between ``min_run`` and ``window``
samples ago, and the mean of those samples differs from the baseline (an
exponentially weighted mean learned only while no change is in progress) by at
least ``min_shift`` in input units (0.049 on log step time = a 5% slowdown).
The baseline learns a sample only once it is ``window`` samples old and still
inside the current run, so it never learns the first steps of a change.

>>> import math
>>> d = BOCPD()
>>> for i in range(40):
...     d.update(0.01 * (i % 3))
>>> d.update(math.log(1.3)); d.drift_detected
False
>>> d.update(math.log(1.3)); d.drift_detected, d.run_length
(True, 2)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import fields

import numpy as np
from scipy.special import gammaln

from failslow.models.config import ChangepointConfig
from failslow.models.stats import EWMeanVar


class BOCPD:
    """Online change-point detector: ``update(x)``, then read ``drift_detected``,
    ``change_prob``, ``run_length`` (samples since the most likely change) and
    ``shift`` (recent mean minus the baseline, input units). Its settings ``p``:
    ``ChangepointConfig`` (``[rules.changepoint]``), kept as attributes of their own."""

    def __init__(self, p: ChangepointConfig | None = None) -> None:
        p = p or ChangepointConfig()
        self.hazard = p.hazard
        self.max_run = p.max_run
        self.prior_scale = p.prior_scale
        self.prior_kappa = p.prior_kappa
        self.outlier = p.outlier
        self.outlier_scale = p.outlier_scale
        self.threshold = p.threshold
        self.window = p.window
        self.min_run = p.min_run
        self.min_shift = p.min_shift
        self.baseline_alpha = p.baseline_alpha
        self.n = 0
        self.probs = np.ones(1)
        self.mu = np.zeros(1)
        self.kappa = np.full(1, p.prior_kappa)
        self.alpha = np.ones(1)
        self.beta = np.full(1, p.prior_scale ** 2)
        self.recent: deque[float] = deque(maxlen=p.window)
        self.baseline = EWMeanVar(p.baseline_alpha)
        self.drift_detected = False
        self.change_prob = 0.0
        self.run_length = 0
        self.shift = 0.0

    @property
    def p(self) -> ChangepointConfig:
        """The settings it runs with (those of a detector pickled before they were
        configurable included)."""
        return ChangepointConfig(**{f.name: getattr(self, f.name) for f in fields(
            ChangepointConfig)})

    def clone(self) -> BOCPD:
        return BOCPD(self.p)

    def update(self, x: float) -> None:
        if self.n == 0:
            self.mu[0] = x
        mu, kappa, alpha, beta = self.mu, self.kappa, self.alpha, self.beta
        scale2 = beta * (kappa + 1.0) / (alpha * kappa)
        z2 = (x - mu) ** 2 / (2.0 * alpha * scale2)
        inlier = (1.0 - self.outlier) * np.exp(
            gammaln(alpha + 0.5) - gammaln(alpha) - 0.5 * np.log(2.0 * math.pi * alpha * scale2)
            - (alpha + 0.5) * np.log1p(z2))
        wide = self.outlier * math.exp(-0.5 * ((x - self.mu[-1]) / self.outlier_scale) ** 2) \
            / (math.sqrt(2.0 * math.pi) * self.outlier_scale)
        pred = inlier + wide
        joint = self.probs * pred
        probs = np.concatenate(([joint.sum() * self.hazard], joint * (1.0 - self.hazard)))
        # Each run learns x weighted by the chance that x is no outlier for it, so a
        # spike neither ends a long run nor inflates its variance.
        w = inlier / pred
        mu0 = self.mu[0] if self.n else x
        new_mu = np.concatenate(([mu0], (kappa * mu + w * x) / (kappa + w)))
        new_beta = np.concatenate(([self.prior_scale ** 2],
                                   beta + kappa * w * (x - mu) ** 2 / (2.0 * (kappa + w))))
        new_kappa = np.concatenate(([self.prior_kappa], kappa + w))
        new_alpha = np.concatenate(([1.0], alpha + 0.5 * w))
        if probs.size > self.max_run + 1:
            # Fold the oldest run into its neighbour: a long run's statistics barely move.
            probs[-2] += probs[-1]
            probs, new_mu, new_beta = probs[:-1], new_mu[:-1], new_beta[:-1]
            new_kappa, new_alpha = new_kappa[:-1], new_alpha[:-1]
        total = probs.sum()
        self.probs = probs / total if total > 0 else np.ones(1)
        self.mu, self.beta, self.kappa, self.alpha = new_mu, new_beta, new_kappa, new_alpha
        self.n += 1
        if len(self.recent) == self.window and self.run_length > self.window:
            # The sample leaving the window belongs to the current, established run.
            self.baseline.update(self.recent[0])
        self.recent.append(x)
        self._judge()

    def _judge(self) -> None:
        p = self.probs
        self.run_length = r = int(np.argmax(p))
        self.change_prob = float(p[self.min_run:self.window + 1].sum())
        if self.baseline.n and 0 < r <= len(self.recent):
            tail = list(self.recent)[-r:]
            self.shift = sum(tail) / r - self.baseline.mean
        else:
            self.shift = 0.0
        self.drift_detected = (self.change_prob > self.threshold
                               and self.min_run <= r <= self.window
                               and abs(self.shift) >= self.min_shift)
