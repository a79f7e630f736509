"""The training side of ``failslow.actions`` (issue 32): each data-parallel rank's share of
the global batch, switched at the same step on every rank, never a hang.

How an action reaches a rank: an ``ActionSource`` whose ``poll()`` never blocks. A
``FileActionSource`` tails a JSON Lines file (the host agent writes its jobs' actions to
one, so the training process holds no broker connection; tests and benches write it
directly); a ``KafkaActionSource`` runs a consumer of its own in a background thread.

How every rank switches at the same step, whoever learned late: ``Mitigation.share`` is
called once per step on every data-parallel rank, at the same point of the loop. Every
``sync_every`` calls it all-reduces two integers over its own gloo group: the newest
action version this rank holds (``apply`` mode, not expired, for this job and world), and
its negation, with MAX. When the maximum equals the minimum every rank holds the same
newest version and each schedules it for ``max(apply_at_step, this call + 1)``: the same
step everywhere, because every rank saw the same two numbers. When they differ, a rank has
not heard yet and nobody switches; an action one rank never receives is never applied,
anywhere (the job keeps its shares: safe, and ``stats["disagreed"]`` counts it). The
collective happens on every rank at every sync whether or not anything is pending, so no
rank ever waits in a collective its peers do not enter; its cost is one 16-byte
all-reduce per ``sync_every`` steps, kept out of the hook's comm windows.

Exact gradients with uneven local batches: DDP averages gradients over the ranks, so a
rank whose loss is the mean over its ``b`` samples of a global batch ``B`` multiplies it
by ``loss_scale() = world x b / B``; the average then is the mean over the global batch.

>>> hook.enable_actions(FileActionSource("/run/failslow/actions-job7.jsonl"))  # doctest: +SKIP
>>> for step in range(steps):                                           # doctest: +SKIP
...     part = hook.batch_share(global_batch)   # a slice of the global batch
...     x, y = X[step][part], Y[step][part]
...     with hook.step():
...         loss = loss_fn(model(x), y) * hook.loss_scale(); loss.backward(); opt.step()
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from failslow.collectors.action_sources import (  # noqa: F401 - re-exported for jobs
    ActionRelay,
    FileActionSource,
    KafkaActionSource,
)
from failslow.models.actions import whole_counts

log = logging.getLogger(__name__)


class Mitigation:
    """One data-parallel rank's view of its job's actions: its share of each global batch.

    source: an ActionSource. job_id: actions of other jobs are ignored. dp_rank / dp_size:
    this rank's place among the data-parallel ranks (default: the group's). group: the
    process group that agrees on switches (default: a new gloo group over ``ranks``, all
    ranks by default; creating it is a collective call, like any ``new_group``).
    sync_every: steps between agreements (1: every step). floor: the least share, as in
    ``models.actions.whole_counts``. first_step: the step number of the first call.
    quiet: a callable the agreement runs inside, so a training hook does not count it.
    """

    def __init__(self, source: Any, job_id: str, dp_rank: int | None = None,
                 dp_size: int | None = None, group: Any = None, sync_every: int = 1,
                 floor: float = 0.25, first_step: int = 0,
                 ranks: list[int] | None = None, quiet: Any = None) -> None:
        if group is None:
            group = dist.new_group(ranks=ranks, backend="gloo")
        self.group = group
        self.source, self.job_id = source, job_id
        self.dp_rank = dist.get_rank(group) if dp_rank is None else dp_rank
        self.dp_size = dist.get_world_size(group) if dp_size is None else dp_size
        self.sync_every, self.floor = sync_every, floor
        self._quiet = quiet or contextlib.nullcontext
        self.step = first_step
        self.version = 0                  # the version in effect (0: equal shares)
        self.shares: list[float] | None = None
        self.count: int | None = None     # this rank's units of the last global batch
        self.global_batch: int | None = None
        self._held: dict[int, dict[str, Any]] = {}
        self._pending: tuple[int, dict[str, Any]] | None = None
        self.switches: list[dict[str, Any]] = []   # what was applied, at which step
        self.stats = {"received": 0, "dry_run": 0, "rejected": 0, "disagreed": 0, "syncs": 0}

    def _take(self, actions: list[dict[str, Any]]) -> None:
        for a in actions:
            if a.get("kind") != "action" or a.get("job_id") != self.job_id \
                    or a.get("type") != "rebalance_microbatches":
                continue
            self.stats["received"] += 1
            if a.get("mode") != "apply":
                self.stats["dry_run"] += 1
                continue
            shares, version = a.get("shares"), a.get("version")
            if not (isinstance(version, int) and version > 0 and isinstance(shares, list)
                    and len(shares) == self.dp_size
                    and all(isinstance(s, int | float) and math.isfinite(s) and s > 0
                            for s in shares)):
                self.stats["rejected"] += 1
                log.warning("failslow: action %s ignored: shares do not fit %d ranks",
                            a.get("action_id"), self.dp_size)
                continue
            self._held[version] = a

    def _proposal(self) -> int:
        now = time.time()
        valid = [v for v, a in self._held.items()
                 if v > self.version and (a.get("expires_ts") or math.inf) > now]
        return max(valid, default=self.version)

    def _agree(self, k: int) -> None:
        mine = self._proposal()
        t = torch.tensor([mine, -mine], dtype=torch.int64)
        with self._quiet():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        self.stats["syncs"] += 1
        hi, lo = int(t[0]), -int(t[1])
        if hi != lo:
            self.stats["disagreed"] += 1
        elif hi != self.version and (self._pending is None or self._pending[1]["version"] != hi):
            a = self._held[hi]
            self._pending = (max(int(a.get("apply_at_step") or 0), k + 1), a)

    def share(self, global_batch: int) -> slice:
        """This rank's part of this step's global batch (``global_batch`` units: samples or
        micro-batches), as a slice; a collective call: every data-parallel rank calls it
        once per step, in step order."""
        k = self.step
        self.step += 1
        self._take(self.source.poll())
        if (k - 0) % self.sync_every == 0:
            self._agree(k)
        if self._pending is not None and k >= self._pending[0]:
            _, a = self._pending
            self._pending = None
            self.version, self.shares = a["version"], list(a["shares"])
            self._held = {v: h for v, h in self._held.items() if v > self.version}
            self.switches.append({"step": k, "version": self.version,
                                  "action_id": a.get("action_id"), "shares": self.shares})
        counts = self.counts(global_batch)
        start = sum(counts[:self.dp_rank])
        self.count, self.global_batch = counts[self.dp_rank], global_batch
        return slice(start, start + self.count)

    def counts(self, global_batch: int) -> list[int]:
        """Every rank's units of ``global_batch`` under the shares in effect."""
        if self.shares is None:
            base, extra = divmod(global_batch, self.dp_size)
            return [base + (1 if r < extra else 0) for r in range(self.dp_size)]
        return whole_counts(self.shares, global_batch, self.floor)

    def loss_scale(self, local: int | None = None, global_batch: int | None = None) -> float:
        """The factor on a rank's mean loss over its ``local`` samples (default: the last
        share) so that DDP's average of the gradients is the global batch's mean."""
        b = self.count if local is None else local
        g = self.global_batch if global_batch is None else global_batch
        if b is None or not g:
            return 1.0
        return self.dp_size * b / g


class BalancedSampler:
    """A batch sampler over the same epoch order as a ``DistributedSampler`` (its
    dataset, ``shuffle``, ``seed``, ``set_epoch``), yielding this rank's share of every
    global batch of ``global_batch`` samples: hand it to ``DataLoader(batch_sampler=)``.
    Every rank iterates all of the epoch's global batches (``drop_last``), so the
    ranks' ``share`` calls stay in step. With a prefetching loader the batch in hand may
    predate the latest share: scale its loss with ``loss_scale(len(batch))``."""

    def __init__(self, sampler: Any, global_batch: int, mitigation: Mitigation) -> None:
        self.sampler, self.global_batch, self.mitigation = sampler, global_batch, mitigation

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def _order(self) -> list[int]:
        n = len(self.sampler.dataset)
        if getattr(self.sampler, "shuffle", False):
            g = torch.Generator()
            g.manual_seed(self.sampler.seed + self.sampler.epoch)
            return torch.randperm(n, generator=g).tolist()
        return list(range(n))

    def __len__(self) -> int:
        return len(self.sampler.dataset) // self.global_batch

    def __iter__(self) -> Iterator[list[int]]:
        order = self._order()
        for i in range(len(self)):
            part = self.mitigation.share(self.global_batch)
            yield order[i * self.global_batch:(i + 1) * self.global_batch][part]


class ActionsMixin:
    """What ``TrainingHook`` offers a training loop: ``enable_actions``, ``batch_share``,
    ``loss_scale``; step events then carry ``samples`` (this rank's share)."""

    mitigation: Mitigation | None = None

    def enable_actions(self, source: Any, global_batch: int | None = None,
                       **kwargs: Any) -> Mitigation:
        """Start receiving this job's actions from ``source`` (collective: every rank)."""
        seams = getattr(self, "_seams", None)

        @contextlib.contextmanager
        def quiet() -> Iterator[None]:
            local = seams.local if seams is not None else None
            inside = getattr(local, "inside", False)
            if local is not None:
                local.inside = True
            try:
                yield
            finally:
                if local is not None:
                    local.inside = inside

        kwargs.setdefault("dp_rank", getattr(self, "dp_rank", None))
        self.mitigation = Mitigation(source, getattr(self, "job_id", ""), quiet=quiet,
                                     **kwargs)
        return self.mitigation

    def batch_share(self, global_batch: int) -> slice:
        """This rank's slice of the step's global batch (equal shares without actions)."""
        if self.mitigation is None:
            raise RuntimeError("batch_share() needs enable_actions(source) first")
        part = self.mitigation.share(global_batch)
        step = getattr(self, "_step", None)
        if step is not None:
            step.event["samples"] = self.mitigation.count
        return part

    def loss_scale(self, local: int | None = None) -> float:
        """See ``Mitigation.loss_scale``; 1.0 without actions."""
        return 1.0 if self.mitigation is None else self.mitigation.loss_scale(local)

    def _stamp_share(self, event: dict[str, Any]) -> None:
        if self.mitigation is not None and self.mitigation.count is not None:
            event["samples"] = self.mitigation.count
