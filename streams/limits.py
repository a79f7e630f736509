"""Caps on what one home partition tracks, so hostile or buggy input stays cheap.

A producer that invents job ids, hosts, groups or ranks (a bug in someone's collector,
or someone else's traffic on a shared broker) would otherwise grow the worker's state
without bound: every new source gets its own ordering slot, de-duplication mark and
baselines in the Detector. ``InputLimits.admit`` stands before all of that:

- a new job is on probation until its events span ``probation_s`` of event time or two
  steps (a training job does within its first steps; a made-up id sending one event
  never does); its events wait here, in a pool bounded in jobs and events that drops
  the job heard from least recently. Then it is tracked, up to ``max_jobs``.
- device samples of a host that no tracked job runs on wait here (the newest few per
  host, a bounded pool of hosts) and go on once a tracked job's event names the host;
  at most ``max_hosts`` hosts are tracked. Samples of a host the route placed on this
  partition (``admit(placed=True)``: the host runs ranks of a job homed or sharded here)
  go on at once: at a large job's start, and all the more while a backlog is read, a
  shard's hosts (512 for a 4,096-rank shard) send telemetry long before the partition
  has any step of the job, more than the pool holds (issue 16: a 131,072-rank run dropped
  1.95 M samples there, and a dropped own host's sample is device state that `failslow
  detect` has). The pool and its bound stay for the hosts nobody placed.
- a tracked job may have at most ``max_ranks_per_job`` ranks, ``max_groups_per_job``
  collective groups and ``max_hosts_per_job`` hosts; events naming more are dropped.

The jobs already tracked (the rest of the cluster) keep being judged. Each cap says once
(per job for per-job caps) that it was hit, in a log line, and counts what it dropped in
``counts`` (a metric in the worker). Jobs and hosts silent for the ``prune`` horizon leave,
freeing their room.

>>> lim = InputLimits(max_jobs=1)
>>> step = {"kind": "step", "rank": 0, "host": "h"}
>>> lim.admit([{**step, "job_id": "a", "ts": 1.0, "step": 0}])  # on probation
[]
>>> [e["step"] for e in lim.admit([{**step, "job_id": "a", "ts": 2.0, "step": 1}])]
[0, 1]
>>> lim.admit([{**step, "job_id": "b", "ts": 2.0, "step": s} for s in (0, 1)])
[]
>>> lim.counts["jobs"], lim.jobs
(0, 1)
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import orjson

from failslow.schema.batches import ABSENT, BATCH_KINDS, BatchKind, expand
from failslow.schema.codec import pack
from failslow.streams.rows import column, has_absent, max_ts

log = logging.getLogger("failslow.worker")
CAPS = ("jobs", "hosts", "ranks_per_job", "groups_per_job", "hosts_per_job")
_TELEMETRY = frozenset(("gpu", "nic", "host"))
_LOGGED_MAX = 1000  # subjects whose cap hit was logged; beyond it only the counters tell


@dataclass
class _Job:
    last_ts: float
    ranks: set = field(default_factory=set)
    groups: set = field(default_factory=set)
    hosts: set = field(default_factory=set)


@dataclass
class _Pending:
    first_ts: float
    last_ts: float = -math.inf
    events: list = field(default_factory=list)
    steps: set = field(default_factory=set)


def _unpack(held: list[tuple[float, bytes | dict]]) -> list[dict]:
    return [orjson.loads(ev) if isinstance(ev, bytes) else ev for _, ev in held]


class InputLimits:
    """The caps of one home partition: distinct jobs (``max_jobs``) and telemetry hosts
    (``max_hosts``), and per job distinct ranks, collective groups and hosts."""

    def __init__(self, max_jobs: int = 1_000, max_hosts: int = 16_384,
                 max_ranks_per_job: int = 32_768, max_groups_per_job: int = 65_536,
                 max_hosts_per_job: int = 8_192, partition: int = 0,
                 probation_s: float = 1.0, max_pending_jobs: int = 256,
                 max_pending_events: int = 200_000, max_unknown_hosts: int = 1_024,
                 held_samples_per_host: int = 2_048, max_held_samples: int = 50_000) -> None:
        self.max_jobs = max_jobs
        self.max_hosts = max_hosts
        self.max_ranks_per_job = max_ranks_per_job
        self.max_groups_per_job = max_groups_per_job
        self.max_hosts_per_job = max_hosts_per_job
        self.partition = partition
        self.probation_s = probation_s
        self.max_pending_jobs = max_pending_jobs
        self.max_pending_events = max_pending_events
        self.max_unknown_hosts = max_unknown_hosts
        self.held_samples_per_host = held_samples_per_host
        self.max_held_samples = max_held_samples
        self._held_samples = 0
        self.counts = dict.fromkeys(CAPS, 0)
        self._jobs: dict[str, _Job] = {}
        self._hosts: dict[str, float] = {}  # host of a tracked job -> newest ts
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # jobs on probation
        self._pending_events = 0
        # samples of other hosts, (ts, sample as JSON bytes): up to ``max_held_samples`` of
        # them wait here, most never go on (their hosts run jobs homed elsewhere), and a
        # decoded sample costs 3x its JSON (a 131,072-rank job's 16 partitions per worker
        # held 800,000, issue 16)
        self._unknown: OrderedDict[str, list[tuple[float, bytes | dict]]] = OrderedDict()
        self._logged: set[tuple[str, str]] = set()

    @property
    def jobs(self) -> int:
        return len(self._jobs)

    @property
    def hosts(self) -> int:
        return len(self._hosts)

    @property
    def pooled(self) -> int:
        """Events waiting here: of jobs on probation and samples of unknown hosts."""
        return self._pending_events + self._held_samples

    def _hit(self, cap: str, job_id: str, what: str, dropped: int = 1) -> None:
        """Count dropped events; log the first hit of each cap (per job for per-job caps),
        saying ``what`` was exceeded, until ``prune`` finds the partition below it again."""
        self.counts[cap] += dropped
        key = (cap, job_id)
        if key not in self._logged and len(self._logged) < _LOGGED_MAX:
            self._logged.add(key)
            where = f"job {job_id!r}: " if job_id else ""
            log.warning("partition %d: input cap hit: %smore than %s; events of further "
                        "ones are dropped and counted (failslow_stream_capped_events_total"
                        "{cap=\"%s\"}); what is already tracked is still judged",
                        self.partition, where, what, cap)

    def _jobs_full(self) -> str:
        return f"{self.max_jobs:,} jobs (--max-jobs)"

    def _pool_full(self) -> str:
        # The pool of new jobs is not --max-jobs: name both, and how many are tracked.
        return (f"{self.max_pending_jobs:,} new jobs (or {self.max_pending_events:,} of "
                f"their events) waiting at once to qualify as jobs; {len(self._jobs):,} of "
                f"--max-jobs {self.max_jobs:,} tracked")

    def _hosts_full(self) -> str:
        return f"{self.max_hosts:,} hosts (--max-hosts)"

    def _unknown_full(self) -> str:
        return (f"{self.max_unknown_hosts:,} hosts no tracked job runs on (or "
                f"{self.max_held_samples:,} of their samples, {self.held_samples_per_host:,} "
                f"per host) held; {len(self._hosts):,} of --max-hosts {self.max_hosts:,} "
                "tracked")

    def admit(self, events: list[dict], placed: bool = False) -> list[dict]:
        """The events that may go on, in order; events of a job on probation or samples of
        a host no tracked job runs on are held here and come out once they qualify.
        ``placed``: the samples' host was placed on this partition by the route (host map),
        so they go on at once, up to ``max_hosts`` hosts."""
        out: list[dict] = []
        for ev in events:
            bk = BATCH_KINDS.get(ev["kind"])
            if bk is not None:
                # issue 31: a host's batch goes on whole when nothing in it is new to
                # the caps; else its rows are taken one by one
                if not self._batch(ev, bk, out, placed):
                    rows = expand(ev)
                    got = self.admit(rows, placed)
                    n = len(rows)
                    if len(got) >= n and all(a is b for a, b in zip(got[-n:], rows,
                                                                    strict=True)):
                        # all its rows admitted (a job's new ranks): on whole after
                        # what was held of its host
                        got[-n:] = [ev]
                    out.extend(got)
                continue
            if ev["kind"] in _TELEMETRY:
                self._sample(ev, out, placed)
            elif ev["job_id"] in self._jobs:
                self._job_event(self._jobs[ev["job_id"]], ev, out)
            else:
                self._probation(ev, out)
        return out

    def _batch(self, ev: dict, bk: BatchKind, out: list[dict], placed: bool) -> bool:
        """Batch ``ev`` admitted whole into ``out`` (True) when its host is tracked (or
        placed here) and, for a job's batch, its job is tracked and its ranks, host and
        groups are already known; False: nothing done, the caller takes its rows."""
        host = ev.get("host")
        if type(host) is not str or "host" not in bk.shared:
            return False
        if bk.row_kind in _TELEMETRY:
            return self._tracked_host(host, max_ts(ev), ev, out, placed)
        job_id = ev.get("job_id")
        job = self._jobs.get(job_id) if type(job_id) is str else None
        if job is None or host not in job.hosts or host not in self._hosts:
            return False
        n = len(ev[bk.row_key])
        if not job.ranks.issuperset(column(ev, "rank", n)):
            return False
        if bk.nested is not None:
            nabsent = ev.get(f"{bk.nested}_{ABSENT}")
            if type(nabsent) is dict and "group" in nabsent:
                return False
            groups = ev[bk.nested].get("group")
        else:
            if has_absent(ev, ("group",)):
                return False
            groups = ev.get("group")
        if groups is not None and not job.groups.issuperset(
                groups if type(groups) is list else (groups,)):
            return False
        ts = max_ts(ev)
        if ts > job.last_ts:
            job.last_ts = ts
        out.append(ev)
        return True

    def track(self, job_id: str, ts: float) -> None:
        """Count ``job_id`` as tracked without probation (a job restored from a snapshot)."""
        if job_id not in self._jobs and len(self._jobs) < self.max_jobs:
            self._jobs[job_id] = _Job(ts)

    def _tracked_host(self, host: str, ts: float, ev: dict, out: list[dict],
                      placed: bool) -> bool:
        """A sample (or a host's batch of them, ``ts`` its newest) admitted into ``out``
        (True) when its host is tracked, or placed here by the route: tracked from now
        on, with what was held of it. False: the host is unknown here."""
        if host in self._hosts:
            if ts > self._hosts[host]:
                self._hosts[host] = ts
            out.append(ev)
            return True
        if placed and len(self._hosts) < self.max_hosts:
            self._hosts[host] = ts
            held = self._unknown.pop(host, None)
            if held:
                self._held_samples -= len(held)
                out.extend(_unpack(held))
            out.append(ev)
            return True
        return False

    def _sample(self, ev: dict, out: list[dict], placed: bool = False) -> None:
        host, ts = ev["host"], ev["ts"]
        if self._tracked_host(host, ts, ev, out, placed):
            return
        held = self._unknown.pop(host, None) or []
        held.append((ts, pack(ev)))
        self._held_samples += 1
        if len(held) > self.held_samples_per_host:
            del held[0]
            self._held_samples -= 1
            self._hit("hosts", "", self._unknown_full())
        self._unknown[host] = held  # most recently heard from last
        while self._unknown and (len(self._unknown) > self.max_unknown_hosts
                                 or self._held_samples > self.max_held_samples):
            _, dropped = self._unknown.popitem(last=False)
            self._held_samples -= len(dropped)
            self._hit("hosts", "", self._unknown_full(), len(dropped))

    def _probation(self, ev: dict, out: list[dict]) -> None:
        job_id = ev["job_id"]
        p = self._pending.pop(job_id, None)
        if p is None:
            p = _Pending(ev["ts"])
        self._pending[job_id] = p  # most recently heard from last
        p.events.append(ev)
        self._pending_events += 1
        p.first_ts = min(p.first_ts, ev["ts"])
        p.last_ts = max(p.last_ts, ev["ts"])
        if ev["kind"] == "step":
            p.steps.add(ev["step"])
        if len(p.steps) >= 2 or p.last_ts - p.first_ts >= self.probation_s:
            if len(self._jobs) < self.max_jobs:
                del self._pending[job_id]
                self._pending_events -= len(p.events)
                job = self._jobs[job_id] = _Job(p.last_ts)
                for held in p.events:
                    self._job_event(job, held, out)
                return
            self._hit("jobs", "", self._jobs_full(), 0)
        while self._pending and (len(self._pending) > self.max_pending_jobs
                                 or self._pending_events > self.max_pending_events):
            _, dropped = self._pending.popitem(last=False)
            self._pending_events -= len(dropped.events)
            self._hit("jobs", "", self._pool_full(), len(dropped.events))

    def _job_event(self, job: _Job, ev: dict, out: list[dict]) -> None:
        job_id, host = ev["job_id"], ev["host"]
        if not self._member(job, job.ranks, ev["rank"], "ranks_per_job", job_id,
                            self.max_ranks_per_job):
            return
        if not self._member(job, job.hosts, host, "hosts_per_job", job_id,
                            self.max_hosts_per_job):
            return
        # a comm record names its groups in its ops entries
        for group in ((e["group"] for e in ev["ops"]) if ev["kind"] == "comm"
                      else (ev.get("group"),)):
            if group is not None and not self._member(job, job.groups, group,
                                                      "groups_per_job", job_id,
                                                      self.max_groups_per_job):
                return
        if ev["ts"] > job.last_ts:
            job.last_ts = ev["ts"]
        if host not in self._hosts:
            if len(self._hosts) >= self.max_hosts:
                self._hit("hosts", "", self._hosts_full(), 0)
            else:
                # The host's samples count from now on, with those held while it was unknown.
                self._hosts[host] = ev["ts"]
                held = self._unknown.pop(host, [])
                self._held_samples -= len(held)
                out.extend(_unpack(held))
        out.append(ev)

    def _member(self, job: _Job, seen: set, value: object, cap: str, job_id: str,
                limit: int) -> bool:
        if value in seen:
            return True
        if len(seen) >= limit:
            flag = "--max-" + cap.replace("_", "-")
            self._hit(cap, job_id, f"{limit:,} {cap.removesuffix('_per_job')} ({flag})")
            return False
        seen.add(value)
        return True

    def prune(self, horizon_ts: float) -> None:
        """Forget jobs, hosts and held events with nothing newer than ``horizon_ts``."""
        self._jobs = {j: s for j, s in self._jobs.items() if s.last_ts >= horizon_ts}
        self._hosts = {h: t for h, t in self._hosts.items() if t >= horizon_ts}
        for job_id in [j for j, p in self._pending.items() if p.last_ts < horizon_ts]:
            self._pending_events -= len(self._pending.pop(job_id).events)
        for host in [h for h, held in self._unknown.items() if held[-1][0] < horizon_ts]:
            self._held_samples -= len(self._unknown.pop(host))
        # A cap is logged once per crossing: a partition-wide one again only once a prune
        # finds the partition below it (every prune re-armed it before: 38 lines in one
        # steady flood, issue 33); a per-job one is forgotten with its job.
        below = {"jobs": len(self._jobs) < self.max_jobs
                 and len(self._pending) < self.max_pending_jobs
                 and self._pending_events < self.max_pending_events,
                 "hosts": len(self._hosts) < self.max_hosts
                 and len(self._unknown) < self.max_unknown_hosts
                 and self._held_samples < self.max_held_samples}
        self._logged = {k for k in self._logged
                        if (k[1] in self._jobs if k[1] else not below[k[0]])}
