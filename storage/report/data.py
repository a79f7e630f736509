"""What a report shows, read from ClickHouse: an incident's rows, its job's step times
around the onset (peers as quantiles per step, the culprit's own), the culprit's device
telemetry against its peers', and a job's incidents.

Peers are summarized in SQL (quantiles per step or per time bucket), so the data a page
holds grows with time, not with ranks: a 1,024-rank job costs what a 16-rank one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.storage.client import Client
from failslow.storage.errors import StorageError

SMALL_JOB = 32          # up to this many ranks every rank gets its own line
MAX_STEPS = 400         # more steps than this are averaged in groups of consecutive steps
BEFORE_S = 60.0         # an incident's window starts this long before the onset
AFTER_S = 60.0          # ... and ends this long after it resolved (or its last update)
MAX_WINDOW_S = 3600.0   # at most this much after the onset is shown
BUCKETS = 150           # telemetry is summarized in about this many time buckets
_OWN = "avg(duration_s - ifNull(comm_s, 0))"    # a rank's own work in a step, seconds


class ReportError(StorageError):
    """No such incident or job, or nothing to draw."""


@dataclass
class Table:
    columns: list[str]
    rows: list[tuple]

    def col(self, name: str) -> np.ndarray:
        i = self.columns.index(name)
        return np.array([np.nan if r[i] is None else r[i] for r in self.rows], dtype=float)

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


@dataclass
class Steps:
    """Per step: the job's step time, and each rank's own work (step time minus the time
    blocked in collectives, which is what tells the culprit: in synchronous training
    every rank's step lasts as long as the slowest one's) as peers' quantiles, the
    highlighted ranks' own, and every rank's in a small job."""
    world: int
    t: np.ndarray                   # epoch s of each step (mean over ranks)
    step_s: np.ndarray              # median step time
    p10: np.ndarray                 # own work quantiles over ranks (and the steps of a group)
    p50: np.ndarray
    p90: np.ndarray
    ranks: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # rank -> t, s
    every: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # small jobs


@dataclass
class Series:
    """One telemetry measure: the culprit's values and its peers' quantiles per bucket."""
    name: str
    unit: str
    t: np.ndarray
    p10: np.ndarray
    p50: np.ndarray
    p90: np.ndarray
    mine_t: np.ndarray
    mine: np.ndarray


class Reader:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.db = client.database

    def _q(self, sql: str, **params: Any) -> Table:
        columns, rows = self.client.query(sql.replace("{db}", self.db), params or None)
        return Table(columns, rows)

    def _has(self, table: str, column: str) -> bool:
        t = self._q("SELECT count() FROM system.columns WHERE database = {d:String} "
                    "AND table = {t:String} AND name = {c:String}", d=self.db, t=table, c=column)
        return bool(t.rows and t.rows[0][0])

    # -- incidents ------------------------------------------------------------------------

    def incident_rows(self, incident_id: str) -> list[dict[str, Any]]:
        """Every row of one incident, oldest first (ReportError when there is none)."""
        cost = ", gpu_hours_lost" if self._has("incidents", "gpu_hours_lost") else ""
        t = self._q("SELECT DISTINCT toFloat64(ts) AS ts, incident_id, job_id, status, fault, "
                    "severity, toFloat64(onset_ts) AS onset_ts, toFloat64(detected_ts) AS "
                    "detected_ts, slowdown_pct, rank, host, gpu, peer_rank, peer_host, "
                    "toFloat64(resolved_ts) AS resolved_ts, root_cause, mitigation, "
                    f"evidence{cost} FROM {{db}}.incidents WHERE incident_id = {{i:String}} "
                    "ORDER BY ts, status = 'resolved'", i=incident_id)
        if not t.rows:
            raise ReportError(f"no incident {incident_id!r} in {self.db}.incidents (list them: "
                              "failslow query \"SELECT incident_id, job_id, status FROM "
                              "incidents_current\")")
        return t.dicts()

    def job_incidents(self, job_id: str) -> list[dict[str, Any]]:
        cost = ", gpu_hours_lost" if self._has("incidents_current", "gpu_hours_lost") else ""
        t = self._q("SELECT incident_id, status, fault, severity, rank, host, gpu, peer_rank, "
                    "root_cause, mitigation, slowdown_pct, toFloat64(onset_ts) AS onset_ts, "
                    "toFloat64(detected_ts) AS detected_ts, toFloat64(resolved_ts) AS "
                    f"resolved_ts, changes{cost} FROM {{db}}.incidents_current "
                    "WHERE job_id = {j:String} ORDER BY onset_ts, incident_id", j=job_id)
        return t.dicts()

    def job_span(self, job_id: str) -> tuple[float, float, int]:
        """(first ts, last ts, world size) of a job's steps (ReportError when none)."""
        t = self._q("SELECT toFloat64(min(ts)), toFloat64(max(ts)), max(world_size), count() "
                    "FROM {db}.steps WHERE job_id = {j:String}", j=job_id)
        first, last, world, n = t.rows[0]
        if not n:
            raise ReportError(f"no steps of job {job_id!r} in {self.db}.steps (list jobs: "
                              "failslow query \"SELECT DISTINCT job_id FROM steps\")")
        return float(first), float(last), int(world)

    # -- step times -----------------------------------------------------------------------

    def steps(self, job_id: str, t0: float, t1: float, ranks: list[int]) -> Steps:
        """Step times of ``job_id`` between t0 and t1 (epoch s): peers' p10/p50/p90 per
        step (groups of consecutive steps when there are many), ``ranks`` on their own,
        and every rank when the job is small."""
        span = self._q("SELECT min(step), max(step), max(world_size) FROM {db}.steps "
                       "WHERE job_id = {j:String} AND ts BETWEEN toDateTime64({a:Float64}, 3) "
                       "AND toDateTime64({b:Float64}, 3)", j=job_id, a=t0, b=t1)
        lo, hi, world = span.rows[0]
        if lo is None or world is None or not world:
            return Steps(0, *(np.array([]),) * 5)
        group = max(1, -(-(int(hi) - int(lo) + 1) // MAX_STEPS))
        where = ("job_id = {j:String} AND ts BETWEEN toDateTime64({a:Float64}, 3) "
                 "AND toDateTime64({b:Float64}, 3)")
        # One pass over the rows (every rank has the same steps, so each weighs the same):
        # a per-(group, rank) pass first took twice as long on 3M rows.
        q = self._q(f"SELECT intDiv(step, {group}) AS g, avg(toFloat64(ts)) AS t, "
                    "median(duration_s) AS d, quantiles(0.1, 0.5, 0.9)(duration_s - "
                    f"ifNull(comm_s, 0)) AS q FROM {{db}}.steps WHERE {where} "
                    "GROUP BY g ORDER BY g", j=job_id, a=t0, b=t1)
        qs = np.array([r[3] for r in q.rows], dtype=float).reshape(-1, 3)
        out = Steps(int(world), q.col("t"), q.col("d"), qs[:, 0], qs[:, 1], qs[:, 2])
        wanted = sorted(set(ranks)) if int(world) > SMALL_JOB else list(range(int(world)))
        if wanted:
            own = self._q(f"SELECT rank, intDiv(step, {group}) AS g, avg(toFloat64(ts)) AS t, "
                          f"{_OWN} AS w FROM {{db}}.steps WHERE {where} "
                          "AND has({r:Array(Int32)}, rank) GROUP BY rank, g ORDER BY rank, g",
                          j=job_id, a=t0, b=t1, r=wanted)
            by: dict[int, list[tuple[float, float]]] = {}
            for rank, _, t, d in own.rows:
                by.setdefault(int(rank), []).append((t, d))
            for rank, pts in by.items():
                arr = np.array(pts, dtype=float)
                pair = (arr[:, 0], arr[:, 1])
                if rank in ranks:
                    out.ranks[rank] = pair
                if int(world) <= SMALL_JOB:
                    out.every[rank] = pair
        return out

    # -- telemetry ------------------------------------------------------------------------

    def gpu_of(self, job_id: str, rank: int) -> tuple[str, int] | None:
        t = self._q("SELECT any(host), any(gpu) FROM {db}.steps WHERE job_id = {j:String} "
                    "AND rank = {r:Int32} AND gpu IS NOT NULL", j=job_id, r=rank)
        host, gpu = t.rows[0] if t.rows else (None, None)
        return None if host in (None, "") or gpu is None else (str(host), int(gpu))

    def job_hosts(self, job_id: str, t0: float, t1: float) -> list[str]:
        t = self._q("SELECT DISTINCT host FROM {db}.steps WHERE job_id = {j:String} AND ts "
                    "BETWEEN toDateTime64({a:Float64}, 3) AND toDateTime64({b:Float64}, 3)",
                    j=job_id, a=t0, b=t1)
        return sorted(str(r[0]) for r in t.rows)

    def gpu_series(self, hosts: list[str], host: str, gpu: int | None, t0: float,
                   t1: float) -> list[Series]:
        """SM clock, temperature and power of the culprit GPU (every GPU of ``host`` when
        ``gpu`` is None) against every GPU of ``hosts``, per time bucket."""
        b = _bucket(t0, t1)
        measures = [("sm_clock_mhz", "SM clock", "MHz"), ("temp_c", "GPU temperature", "°C"),
                    ("power_w", "GPU power", "W")]
        sel = ", ".join(f"quantiles(0.1, 0.5, 0.9)({c}) AS q_{c}" for c, _, _ in measures)
        where = ("ts BETWEEN toDateTime64({a:Float64}, 3) AND toDateTime64({b:Float64}, 3)")
        peers = self._q(f"SELECT intDiv(toUInt64(toFloat64(ts)), {b}) * {b} + {b / 2} AS t, "
                        f"{sel} FROM {{db}}.gpu WHERE has({{h:Array(String)}}, host) "
                        f"AND {where} GROUP BY t ORDER BY t", h=hosts, a=t0, b=t1)
        mine_sql = ", ".join(f"avg({c}) AS {c}" for c, _, _ in measures)
        gpu_filter = "" if gpu is None else " AND gpu = {g:Int32}"
        params: dict[str, Any] = {"host": host, "a": t0, "b": t1}
        if gpu is not None:
            params["g"] = gpu
        mine = self._q(f"SELECT round(toFloat64(ts), 1) AS t, {mine_sql} FROM {{db}}.gpu "
                       f"WHERE host = {{host:String}}{gpu_filter} AND {where} "
                       "GROUP BY t ORDER BY t", **params)
        return [_series(peers, mine, c, name, unit) for c, name, unit in measures]

    def nic_series(self, hosts: list[str], host: str, t0: float, t1: float) -> list[Series]:
        """Per host: NIC throughput (tx + rx, Gbit/s) and pause + CNP frames per second,
        from the counters' growth inside each time bucket, summed over the host's ports."""
        b = _bucket(t0, t1, minimum=5)
        rate = ("if(max(toFloat64(ts)) > min(toFloat64(ts)), ({x}) / "
                "(max(toFloat64(ts)) - min(toFloat64(ts))), NULL)")
        gbps = rate.format(x="(max(tx_bytes_total) - min(tx_bytes_total) + max(rx_bytes_total) "
                           "- min(rx_bytes_total)) * 8 / 1e9")
        storms = rate.format(x="max(ifNull(tx_pause_total, 0) + ifNull(rx_pause_total, 0) + "
                             "ifNull(cnp_sent_total, 0)) - min(ifNull(tx_pause_total, 0) + "
                             "ifNull(rx_pause_total, 0) + ifNull(cnp_sent_total, 0))")
        per_host = self._q(
            f"SELECT t, host, sum(gbps) AS gbps, sum(storms) AS storms FROM ("
            f"SELECT intDiv(toUInt64(toFloat64(ts)), {b}) * {b} + {b / 2} AS t, host, nic, "
            f"port, {gbps} AS gbps, {storms} AS storms FROM {{db}}.nic "
            "WHERE has({h:Array(String)}, host) AND ts BETWEEN toDateTime64({a:Float64}, 3) "
            "AND toDateTime64({b:Float64}, 3) GROUP BY t, host, nic, port) "
            "GROUP BY t, host ORDER BY t, host", h=sorted({*hosts, host}), a=t0, b=t1)
        out = []
        for col, name, unit in (("gbps", "NIC throughput (tx + rx)", "Gbit/s"),
                                ("storms", "NIC pause + CNP frames", "per s")):
            out.append(_host_series(per_host, host, col, name, unit))
        return out


def _bucket(t0: float, t1: float, minimum: int = 1) -> int:
    return max(minimum, int(round((t1 - t0) / BUCKETS)))


def _series(peers: Table, mine: Table, col: str, name: str, unit: str) -> Series:
    qs = np.array([[np.nan if v is None else v for v in (r[peers.columns.index(f"q_{col}")]
                                                         or (None,) * 3)]
                   for r in peers.rows], dtype=float).reshape(-1, 3)
    return Series(name, unit, peers.col("t"), qs[:, 0], qs[:, 1], qs[:, 2],
                  mine.col("t"), mine.col(col))


def _host_series(per_host: Table, host: str, col: str, name: str, unit: str) -> Series:
    by_t: dict[float, list[float]] = {}
    mine_t, mine = [], []
    ti, hi, ci = (per_host.columns.index(c) for c in ("t", "host", col))
    for r in per_host.rows:
        v = np.nan if r[ci] is None else float(r[ci])
        if r[hi] == host:
            mine_t.append(float(r[ti]))
            mine.append(v)
        else:
            by_t.setdefault(float(r[ti]), []).append(v)
    ts = np.array(sorted(by_t), dtype=float)
    qs = np.array([np.nanquantile(by_t[t], [0.1, 0.5, 0.9]) if np.isfinite(by_t[t]).any()
                   else [np.nan] * 3 for t in ts], dtype=float).reshape(-1, 3)
    return Series(name, unit, ts, qs[:, 0], qs[:, 1], qs[:, 2],
                  np.array(mine_t, dtype=float), np.array(mine, dtype=float))
