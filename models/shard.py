"""One large job judged as shards (issue 16): the shard plan is a property of the job.

A job's ranks are cut into blocks of ``SHARD_RANKS`` consecutive ranks (shard
``rank // SHARD_RANKS``); a job of at most ``SHARD_RANKS`` ranks is one shard and is
judged exactly as before. Each shard of a larger job is judged on its own, as if it
were a job of its ranks: per-rank judging, peer comparison within its pipeline stages,
its groups' comm windows, the device state of its hosts and its own incidents. The plan
depends on the job alone (its ranks), never on how many workers or partitions run it,
so ``failslow detect`` (one process, every shard in one ``ShardedDetector``) and the
worker (each shard on its own partition, ``streams.sharding``) take the same decisions.

Why blocks of ranks: with the usual rank order (tensor parallel fastest, then data
parallel, then pipeline: Megatron's, and the simulator's) a block of ``SHARD_RANKS``
ranks holds whole hosts and, while a pipeline stage has at most ``SHARD_RANKS`` ranks,
whole stages with their tensor- and data-parallel groups; a stage larger than that is
cut in blocks of whole tensor-parallel groups, each block still with thousands of peers.
The shard of an event is found from its ``rank`` alone, so the worker's route stage can
send a comm window to its shard without knowing the job's layout.

What the job level keeps (``ShardedDetector._job_out``, applied to every incident event):

- incident ids and ``job_id`` are the job's (a shard is ``job_id`` inside the models,
  shard ``k > 0`` is ``job_id + SEP + k``; its culprits, ranks and hosts, are its own, so
  ids never collide across shards);
- the cost: ``gpu_hours_lost`` (and a link's ``world_size``) are priced on the whole
  job's world size, not the shard's, and the paging policy weighs that cost
  (``_price_world``): a culprit of a job in 32 shards is not graded on 1/32 of it;
- the job-wide change point (``job_slowdown``) is shard 0's: in synchronous training
  every rank's step time is the job's, so shard 0's median step time is the job's; the
  other shards' are not reported (one incident per job).

Not judged across shards: pipeline point-to-point pairs whose two ends are in two
shards (a send/recv pair needs both ends' windows), and a data-parallel group cut by a
block boundary judges its members in each block separately (sub-step ticks need every
member: they stay off for such groups).

>>> det = ShardedDetector(shard_ranks=4)
>>> det.shard_event({"kind": "step", "job_id": "j", "rank": 5, "world_size": 10})
{'kind': 'step', 'job_id': 'j\\x1f1', 'rank': 5, 'world_size': 4}
>>> det.shard_event({"kind": "step", "job_id": "j", "rank": 9, "world_size": 10})["world_size"]
2
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from failslow.models.pipeline import Detector
from failslow.schema.batches import expand

# Ranks per shard; FAILSLOW_SHARD_RANKS sets it, for failslow detect and the workers alike
# (they must agree, as on --telemetry-delay).
SHARD_RANKS = max(1, int(os.environ.get("FAILSLOW_SHARD_RANKS") or 4096))
SEP = "\x1f"          # job_id + SEP + shard: a shard k > 0 inside the models (never emitted)
JOB_KINDS = frozenset(("step", "comm", "collective"))


def shard_of(rank: int, shard_ranks: int = SHARD_RANKS) -> int:
    """The shard of a rank: its block of ``shard_ranks`` consecutive ranks."""
    return rank // shard_ranks if rank >= 0 else 0


def shards_of(world: int, shard_ranks: int = SHARD_RANKS) -> int:
    """How many shards a job of ``world`` ranks has."""
    return max(1, -(-world // shard_ranks))


class ShardedDetector(Detector):
    """A ``Detector`` that judges each shard of a large job as a job of its own and
    gives its incidents back to the job (module docstring). Jobs of at most
    ``shard_ranks`` ranks pass through unchanged."""

    shard_ranks = SHARD_RANKS     # class defaults: snapshots of a plain Detector restore
    _worlds: dict[str, int] = {}

    def __init__(self, *args: Any, shard_ranks: int = SHARD_RANKS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if shard_ranks < 1:
            raise ValueError("shard_ranks must be at least 1")
        self.shard_ranks = shard_ranks
        self._worlds = {}        # job -> its world size, for the jobs cut into shards

    def clone(self) -> ShardedDetector:
        det = ShardedDetector(self.min_rel, self.z_min, self.confirm_steps,
                              self.resolve_steps, self.critical_pct, self.planner.clone(),
                              self.telemetry_delay_s, self.job_idle_s, self.config,
                              shard_ranks=self.shard_ranks)
        return det

    # -- events in: each to its shard ------------------------------------------------

    def shard_event(self, ev: dict[str, Any]) -> dict[str, Any]:
        """``ev`` as its shard sees it (itself when the job is one shard)."""
        n = self.shard_ranks
        r = ev.get("rank")
        w = ev.get("world_size")
        big_w = type(w) is int and w > n
        if not (type(r) is int and r >= n) and not big_w:
            return ev
        job = ev.get("job_id")
        if type(job) is not str:
            return ev
        k = shard_of(r, n) if type(r) is int else 0
        out = dict(ev)
        if k:
            out["job_id"] = f"{job}{SEP}{k}"
        if big_w:
            assert isinstance(w, int)
            if self._worlds.get(job) != w:
                self._worlds[job] = w
            out["world_size"] = max(1, min(n, w - k * n))
        return out

    def _split(self, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        n = self.shard_ranks
        out: list[dict[str, Any]] = []
        for ev in events:
            if ev.get("kind") in ("comm_batch", "step_batch"):
                # a batch of a job cut in shards: its rows, each to its shard (one host's
                # ranks: mostly one shard)
                rs, w = ev["rank"], ev.get("world_size")
                if max(rs) >= n or any(type(x) is int and x > n
                                      for x in (w if type(w) is list else [w])):
                    out += map(self.shard_event, expand(ev))
                    continue
            if ev.get("kind") in JOB_KINDS:
                r = ev.get("rank")
                w = ev.get("world_size")
                if (type(r) is int and r >= n) or (type(w) is int and w > n):
                    ev = self.shard_event(ev)
            out.append(ev)
        return out

    # -- incidents out: the job's ---------------------------------------------------------

    def _price_world(self, job_id: str) -> int:
        return self._worlds.get(job_id.partition(SEP)[0], 0) if self._worlds else 0

    def _job_out(self, incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self._worlds:
            return incidents
        out = []
        for inc in incidents:
            vjob = inc.get("job_id", "")
            job, sep, k = vjob.partition(SEP)
            world = self._worlds.get(job)
            if world is None:
                out.append(inc)
                continue
            if sep:
                if inc.get("fault") == "job_slowdown":
                    continue           # the job-wide change point is shard 0's
                inc = dict(inc)
                inc["job_id"] = job
                iid = inc.get("incident_id", "")
                if iid.startswith(vjob + ":"):
                    inc["incident_id"] = job + iid[len(vjob):]
            out.append(self._price(inc, world))
        return out

    @staticmethod
    def _price(inc: dict[str, Any], world: int) -> dict[str, Any]:
        """The cost on the job's world size (the shard priced it on its own)."""
        ev = inc.get("evidence")
        if not isinstance(ev, dict) or ("lost_s" not in ev and "world_size" not in ev):
            return inc
        inc = dict(inc)
        ev = dict(ev)
        if "world_size" in ev:
            ev["world_size"] = world
        lost = ev.get("lost_s")
        if "gpu_hours_lost" in ev and isinstance(lost, (int, float)):
            ev["gpu_hours_lost"] = inc["gpu_hours_lost"] = round(world * lost / 3600.0, 6)
        inc["evidence"] = ev
        return inc

    # -- device state of other shards' hosts --------------------------------------------

    def device_hosts(self) -> set[str]:
        """The hosts whose device state (GPU, NIC, host samples) this detector holds."""
        st = self.store
        return {h for h, _ in st.gpus} | {k[0] for k in st.nics} | set(st.hosts)

    def forget_hosts(self, hosts: Iterable[str]) -> int:
        """Drop the device state of ``hosts`` unless one of this detector's jobs (shards)
        runs on them; returns how many hosts were dropped.

        A worker's partition gets the telemetry of a host the route has not placed yet
        (every partition does, at a job's start), and keeps the host's device state
        although no shard of its own runs there: once the host map says which partitions
        hold the host (``streams.sharding.prune_foreign_hosts``), that state is dead weight
        (it made a shard's snapshot 4x a lone job's, issue 16). No decision of this
        detector reads it: root causes look at the devices of the job's own hosts, and a
        host a step of a job here has used (``_cut``) is never dropped."""
        used = set(self._cut)
        for job in self.jobs.values():
            used.update(job.rank_host.values())
        drop = set(hosts) - used
        if not drop:
            return 0
        st = self.store
        held = self.device_hosts()
        drop &= held
        if not drop:
            return 0
        st.gpus = {k: d for k, d in st.gpus.items() if k[0] not in drop}
        st.nics = {k: d for k, d in st.nics.items() if k[0] not in drop}
        st.hosts = {h: d for h, d in st.hosts.items() if h not in drop}
        st.gpu_rank = {k: r for k, r in st.gpu_rank.items() if k[0] not in drop}
        return len(drop)

    # -- the Detector's entry points ---------------------------------------------------

    def process_batch(self, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return self._job_out(super().process_batch(self._split(events)))

    def flush(self, now_ts: float | None = None) -> list[dict[str, Any]]:
        return self._job_out(super().flush(now_ts))

    def end_jobs(self) -> list[dict[str, Any]]:
        return self._job_out(super().end_jobs())
