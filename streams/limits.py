"""Caps on what one home partition tracks, so hostile or buggy input stays cheap.

A producer that invents job ids, hosts, groups or ranks (a bug in someone's collector,
or someone else's traffic on a shared broker) would otherwise grow the worker's state
without bound: every new source gets its own ordering slot, de-duplication mark and
baselines in the Detector. ``InputLimits.admit`` lets through the events of what is
already tracked, admits new jobs / hosts / ranks / groups while there is room, and
drops the rest before they reach any state: the jobs already tracked (the rest of the
cluster) keep being judged. Each cap says once, per job or per partition, that it was
hit (a log line), and counts every dropped event (``counts``; a metric in the worker).
Jobs and hosts silent for the ``prune`` horizon leave, freeing their room.

>>> lim = InputLimits(max_jobs=1)
>>> ev = {"kind": "step", "ts": 1.0, "rank": 0, "host": "h"}
>>> [e["job_id"] for e in lim.admit([{**ev, "job_id": "a"}, {**ev, "job_id": "b"}])]
['a']
>>> lim.counts
{'jobs': 1, 'hosts': 0, 'ranks_per_job': 0, 'groups_per_job': 0, 'hosts_per_job': 0}
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

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


class InputLimits:
    """The caps of one home partition: distinct jobs (``max_jobs``) and telemetry hosts
    (``max_hosts``), and per job distinct ranks, collective groups and hosts."""

    def __init__(self, max_jobs: int = 1_000, max_hosts: int = 16_384,
                 max_ranks_per_job: int = 32_768, max_groups_per_job: int = 65_536,
                 max_hosts_per_job: int = 8_192, partition: int = 0) -> None:
        self.max_jobs = max_jobs
        self.max_hosts = max_hosts
        self.max_ranks_per_job = max_ranks_per_job
        self.max_groups_per_job = max_groups_per_job
        self.max_hosts_per_job = max_hosts_per_job
        self.partition = partition
        self.counts = dict.fromkeys(CAPS, 0)
        self._jobs: dict[str, _Job] = {}
        self._hosts: dict[str, float] = {}  # telemetry host -> newest ts
        self._logged: set[tuple[str, str]] = set()

    @property
    def jobs(self) -> int:
        return len(self._jobs)

    @property
    def hosts(self) -> int:
        return len(self._hosts)

    def _hit(self, cap: str, job_id: str, limit: int) -> None:
        """Count a dropped event; log the first drop of each cap (per job for per-job caps)."""
        self.counts[cap] += 1
        key = (cap, job_id)
        if key not in self._logged and len(self._logged) < _LOGGED_MAX:
            self._logged.add(key)
            where = f"job {job_id!r}: " if job_id else ""
            log.warning("partition %d: input cap hit: %smore than %d %s; events of further "
                        "ones are dropped and counted (failslow_stream_capped_events_total"
                        "{cap=\"%s\"}); what is already tracked is still judged",
                        self.partition, where, limit, cap.replace("_per_job", ""), cap)

    def admit(self, events: list[dict]) -> list[dict]:
        """The events that stay within the caps, in order."""
        out = []
        for ev in events:
            if self._admit(ev):
                out.append(ev)
        return out

    def _admit(self, ev: dict) -> bool:
        kind = ev["kind"]
        ts = ev["ts"]
        if kind in _TELEMETRY:
            host = ev["host"]
            if host not in self._hosts:
                if len(self._hosts) >= self.max_hosts:
                    self._hit("hosts", "", self.max_hosts)
                    return False
            self._hosts[host] = max(ts, self._hosts.get(host, ts))
            return True
        job_id = ev["job_id"]
        job = self._jobs.get(job_id)
        if job is None:
            if len(self._jobs) >= self.max_jobs:
                self._hit("jobs", "", self.max_jobs)
                return False
            job = self._jobs[job_id] = _Job(ts)
        if not self._member(job, job.ranks, ev["rank"], "ranks_per_job", job_id,
                            self.max_ranks_per_job):
            return False
        if not self._member(job, job.hosts, ev["host"], "hosts_per_job", job_id,
                            self.max_hosts_per_job):
            return False
        group = ev.get("group")
        if group is not None and not self._member(job, job.groups, group, "groups_per_job",
                                                  job_id, self.max_groups_per_job):
            return False
        if ts > job.last_ts:
            job.last_ts = ts
        return True

    def _member(self, job: _Job, seen: set, value: object, cap: str, job_id: str,
                limit: int) -> bool:
        if value in seen:
            return True
        if len(seen) >= limit:
            self._hit(cap, job_id, limit)
            return False
        seen.add(value)
        return True

    def prune(self, horizon_ts: float) -> None:
        """Forget jobs and telemetry hosts with no event newer than ``horizon_ts``."""
        self._jobs = {j: s for j, s in self._jobs.items() if s.last_ts >= horizon_ts}
        self._hosts = {h: t for h, t in self._hosts.items() if t >= horizon_ts}
        # A partition-wide cap hit again after room was freed is worth a new line.
        self._logged = {k for k in self._logged if k[1] in self._jobs}
