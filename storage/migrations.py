"""The ClickHouse schema as versioned migrations, applied by `failslow migrate`.

Each migration is a list of idempotent statements (IF NOT EXISTS), so a run that
died half-way is simply run again; `schema_migrations` records what is applied.
Placeholders: ``{db}`` (database), ``{ttl_days}`` (raw tables), ``{rollup_ttl_days}``.

Design (why the tables look like this):
- Every CONTRACT.md field is a column of its kind's table, under the same name;
  optional fields are Nullable; strings with few distinct values (ids, hosts,
  enums) are LowCardinality. Times are DateTime64(3, 'UTC'); durations stay Float64
  seconds, so sub-millisecond timing is kept where it is measured.
- Raw tables are ReplacingMergeTree ordered by their natural key, so a batch
  redelivered after a crash (the sink is at-least-once) collapses on merge
  (`FINAL` when a query must be exact before the merge).
- TTL counts from `ingest_ts` (arrival), not from the event's `ts`: a replayed
  old trace must not vanish on the first merge.
- Codecs: DoubleDelta for timestamps and Delta for cumulative counters (both
  nearly monotonic inside the sort order), then ZSTD.
- `incidents` keeps every change; `incidents_current` picks each incident's
  latest row with argMax over a tuple (argMax on a Nullable column alone skips
  NULLs, which would resurrect a cleared field), so it is exact right after the
  insert, with no wait for merges, and duplicate deliveries change nothing.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from failslow.storage.client import Client
from failslow.storage.errors import StorageError
from failslow.storage.url import check_identifier

MIN_SERVER = (23, 3)
DEFAULT_TTL_DAYS = 30
DEFAULT_ROLLUP_TTL_DAYS = 365
RAW_TABLES = ("steps", "collectives", "comm", "gpu", "nic", "host")

_TS = "DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1))"
# DateTime64 rather than DateTime: chdb's Arrow output turns DateTime into bare integers.
_INGEST = "ingest_ts DateTime64(0, 'UTC') DEFAULT now64(0) CODEC(DoubleDelta, ZSTD(1))"
_CTR = "Nullable(Int64) CODEC(Delta, ZSTD(1))"
_RAW = ("ENGINE = ReplacingMergeTree ORDER BY ({order}) "
        "TTL ingest_ts + INTERVAL {{ttl_days}} DAY")

_STEPS = f"""CREATE TABLE IF NOT EXISTS {{db}}.steps (
    ts {_TS}, job_id LowCardinality(String), rank Int32, world_size Int32,
    host LowCardinality(String), step Int64, duration_s Float64,
    gpu Nullable(Int32), compute_s Nullable(Float64), comm_s Nullable(Float64),
    data_s Nullable(Float64), tokens Nullable(Int64),
    dp_rank Nullable(Int32), pp_rank Nullable(Int32), tp_rank Nullable(Int32),
    {_INGEST}
) {_RAW.format(order="job_id, rank, ts, step")}"""

_COLLECTIVES = f"""CREATE TABLE IF NOT EXISTS {{db}}.collectives (
    ts {_TS}, job_id LowCardinality(String), rank Int32, host LowCardinality(String),
    `group` LowCardinality(String), group_size Int32, op LowCardinality(String),
    seq Int64, start_ts {_TS}, duration_s Float64, bytes Int64,
    step Nullable(Int64), peer Nullable(Int32), gpu Nullable(Int32),
    {_INGEST}
) {_RAW.format(order="job_id, `group`, seq, rank, ts")}"""

_GPU = f"""CREATE TABLE IF NOT EXISTS {{db}}.gpu (
    ts {_TS}, host LowCardinality(String), gpu Int32, uuid LowCardinality(String),
    sm_clock_mhz Nullable(Float64), max_sm_clock_mhz Nullable(Float64),
    mem_clock_mhz Nullable(Float64), util_pct Nullable(Float64),
    mem_util_pct Nullable(Float64), power_w Nullable(Float64),
    power_limit_w Nullable(Float64), temp_c Nullable(Float64),
    clocks_event_reasons Nullable(Int64),
    pcie_gen Nullable(Int32), pcie_width Nullable(Int32),
    pcie_max_gen Nullable(Int32), pcie_max_width Nullable(Int32),
    pcie_tx_bytes_s Nullable(Float64), pcie_rx_bytes_s Nullable(Float64),
    pcie_replay_total {_CTR}, ecc_sbe_total {_CTR}, ecc_dbe_total {_CTR},
    xid Array(Int64), nvlink_crc_errors_total {_CTR}, mem_used_bytes Nullable(Int64),
    job_id LowCardinality(Nullable(String)), rank Nullable(Int32),
    {_INGEST}
) {_RAW.format(order="host, gpu, ts")}"""

_NIC = f"""CREATE TABLE IF NOT EXISTS {{db}}.nic (
    ts {_TS}, host LowCardinality(String), nic LowCardinality(String), port Int32,
    tx_bytes_total Int64 CODEC(Delta, ZSTD(1)), rx_bytes_total Int64 CODEC(Delta, ZSTD(1)),
    state LowCardinality(Nullable(String)), speed_gbps Nullable(Float64),
    tx_packets_total {_CTR}, rx_packets_total {_CTR}, rx_errors_total {_CTR},
    tx_errors_total {_CTR}, rx_drops_total {_CTR}, tx_pause_total {_CTR},
    rx_pause_total {_CTR}, cnp_sent_total {_CTR}, cnp_handled_total {_CTR},
    ecn_marked_total {_CTR}, out_of_sequence_total {_CTR}, link_downed_total {_CTR},
    symbol_errors_total {_CTR}, xmit_wait_total {_CTR},
    {_INGEST}
) {_RAW.format(order="host, nic, port, ts")}"""

_HOST = f"""CREATE TABLE IF NOT EXISTS {{db}}.host (
    ts {_TS}, host LowCardinality(String),
    cpu_util_pct Nullable(Float64), cpu_iowait_pct Nullable(Float64),
    cpu_steal_pct Nullable(Float64), load1 Nullable(Float64),
    mem_available_bytes Nullable(Int64), procs_running Nullable(Int32),
    {_INGEST}
) {_RAW.format(order="host, ts")}"""

# Every change of an incident; exact duplicates (redelivery) collapse on merge
# because the whole row's hash is part of the sort key.
_INCIDENTS = f"""CREATE TABLE IF NOT EXISTS {{db}}.incidents (
    ts {_TS}, incident_id String, job_id LowCardinality(String),
    status LowCardinality(String), fault LowCardinality(String),
    severity LowCardinality(String), onset_ts DateTime64(3, 'UTC'),
    detected_ts DateTime64(3, 'UTC'), slowdown_pct Float64,
    rank Nullable(Int32), host LowCardinality(Nullable(String)), gpu Nullable(Int32),
    peer_rank Nullable(Int32), peer_host LowCardinality(Nullable(String)),
    resolved_ts Nullable(DateTime64(3, 'UTC')),
    root_cause LowCardinality(Nullable(String)), mitigation LowCardinality(Nullable(String)),
    evidence String CODEC(ZSTD(3)),
    {_INGEST}
) ENGINE = ReplacingMergeTree
ORDER BY (job_id, incident_id, ts, cityHash64(tuple(status, severity, slowdown_pct, rank,
          host, gpu, peer_rank, peer_host, resolved_ts, root_cause, mitigation, evidence)))"""

# Latest state per incident. At equal ts a `resolved` row wins over an `open` one.
_INCIDENTS_CURRENT = """CREATE VIEW IF NOT EXISTS {db}.incidents_current AS
SELECT incident_id, s.1 AS job_id, s.2 AS status, s.3 AS fault, s.4 AS severity,
       s.5 AS rank, s.6 AS host, s.7 AS gpu, s.8 AS peer_rank, s.9 AS peer_host,
       s.10 AS root_cause, s.11 AS mitigation, s.12 AS slowdown_pct, s.13 AS onset_ts,
       s.14 AS detected_ts, s.15 AS resolved_ts, s.16 AS evidence,
       last_ts AS updated_ts, first_ts AS first_seen_ts, changes
FROM (
    SELECT incident_id,
           argMax(tuple(job_id, status, fault, severity, rank, host, gpu, peer_rank,
                        peer_host, root_cause, mitigation, slowdown_pct, onset_ts,
                        detected_ts, resolved_ts, evidence),
                  tuple(ts, status = 'resolved')) AS s,
           max(ts) AS last_ts, min(ts) AS first_ts,
           uniqExact(ts, status, slowdown_pct, severity) AS changes
    FROM {db}.incidents
    GROUP BY incident_id
)"""

_DEAD_LETTERS = """CREATE TABLE IF NOT EXISTS {db}.dead_letters (
    ts DateTime64(3, 'UTC'), topic LowCardinality(String), `partition` Nullable(Int32),
    `offset` Nullable(Int64), key Nullable(String), error String, raw String CODEC(ZSTD(3)),
    reporter LowCardinality(String),
    ingest_ts DateTime64(0, 'UTC') DEFAULT now64(0)
) ENGINE = ReplacingMergeTree
ORDER BY (topic, ts, cityHash64(error, raw))
TTL ingest_ts + INTERVAL {ttl_days} DAY"""

# Per-minute step statistics per rank: cheap dashboards over months of data. Its TTL
# also counts from arrival (the latest insert into that minute), like the raw tables.
_STEPS_1M = """CREATE TABLE IF NOT EXISTS {db}.steps_1m (
    minute DateTime64(0, 'UTC'), job_id LowCardinality(String), rank Int32,
    host SimpleAggregateFunction(any, LowCardinality(String)),
    steps SimpleAggregateFunction(sum, UInt64),
    duration_s_sum SimpleAggregateFunction(sum, Float64),
    duration_s_max SimpleAggregateFunction(max, Float64),
    duration_s_q AggregateFunction(quantilesTDigest(0.5, 0.99), Float64),
    ingest_ts SimpleAggregateFunction(max, DateTime64(0, 'UTC'))
) ENGINE = AggregatingMergeTree ORDER BY (job_id, rank, minute)
TTL ingest_ts + INTERVAL {rollup_ttl_days} DAY"""

_STEPS_1M_MV = """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.steps_1m_mv TO {db}.steps_1m AS
SELECT toStartOfMinute(ts) AS minute, job_id, rank, any(host) AS host,
       count() AS steps, sum(duration_s) AS duration_s_sum,
       max(duration_s) AS duration_s_max,
       quantilesTDigestState(0.5, 0.99)(duration_s) AS duration_s_q,
       max(now64(0)) AS ingest_ts
FROM {db}.steps GROUP BY minute, job_id, rank"""

# comm summaries (CONTRACT.md), flattened: one row per (window, ops entry), the window's
# fields repeated on each (LowCardinality and the sort order make that nearly free), so
# "whom does group X wait for" and "blocked time per rank per step" are a plain GROUP BY
# with no arrayJoin. A window with no ops is one row with group '' and n 0 (the rank
# reported, nothing completed). peer is Nullable like every optional field; the sort key
# uses ifNull(peer, -1) since keys cannot be Nullable.
_COMM = f"""CREATE TABLE IF NOT EXISTS {{db}}.comm (
    ts {_TS}, window_start_ts {_TS}, job_id LowCardinality(String), rank Int32,
    host LowCardinality(String), step Nullable(Int64), step_end Nullable(Bool),
    world_size Nullable(Int32), gpu Nullable(Int32),
    `group` LowCardinality(String), group_size Int32, op LowCardinality(String),
    peer Nullable(Int32), n Int64, blocked_s Float64, min_s Float64, max_s Float64,
    bytes Int64, first_seq Nullable(Int64), last_seq Nullable(Int64),
    first_start_ts Nullable(DateTime64(3, 'UTC')),
    {_INGEST}
) {_RAW.format(order="job_id, `group`, rank, ts, op, ifNull(peer, -1)")}"""

# Per-minute comm per (job, group, op, rank): months of "who waits for whom" at a
# fraction of the raw size. min_s_min is the group's transfer floor in that minute.
_COMM_1M = """CREATE TABLE IF NOT EXISTS {db}.comm_1m (
    minute DateTime64(0, 'UTC'), job_id LowCardinality(String),
    `group` LowCardinality(String), op LowCardinality(String), rank Int32,
    host SimpleAggregateFunction(any, LowCardinality(String)),
    group_size SimpleAggregateFunction(max, Int32),
    windows SimpleAggregateFunction(sum, UInt64),
    n_sum SimpleAggregateFunction(sum, Int64),
    blocked_s_sum SimpleAggregateFunction(sum, Float64),
    min_s_min SimpleAggregateFunction(min, Float64),
    max_s_max SimpleAggregateFunction(max, Float64),
    bytes_sum SimpleAggregateFunction(sum, Int64),
    ingest_ts SimpleAggregateFunction(max, DateTime64(0, 'UTC'))
) ENGINE = AggregatingMergeTree ORDER BY (job_id, `group`, op, rank, minute)
TTL ingest_ts + INTERVAL {rollup_ttl_days} DAY"""

_COMM_1M_MV = """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.comm_1m_mv TO {db}.comm_1m AS
SELECT toStartOfMinute(ts) AS minute, job_id, `group`, op, rank, any(host) AS host,
       max(group_size) AS group_size, count() AS windows, sum(n) AS n_sum,
       sum(blocked_s) AS blocked_s_sum, min(min_s) AS min_s_min, max(max_s) AS max_s_max,
       sum(bytes) AS bytes_sum, max(now64(0)) AS ingest_ts
FROM {db}.comm WHERE n > 0 GROUP BY minute, job_id, `group`, op, rank"""

# CONTRACT.md's incident.gpu_hours_lost, which the Detector sends and the table lacked.
_INCIDENTS_GPU_HOURS = ("ALTER TABLE {db}.incidents ADD COLUMN IF NOT EXISTS "
                        "gpu_hours_lost Nullable(Float64) AFTER slowdown_pct")

# incidents_current again, with the incident's cost (its latest gpu_hours_lost).
_INCIDENTS_CURRENT_COST = """CREATE OR REPLACE VIEW {db}.incidents_current AS
SELECT incident_id, s.1 AS job_id, s.2 AS status, s.3 AS fault, s.4 AS severity,
       s.5 AS rank, s.6 AS host, s.7 AS gpu, s.8 AS peer_rank, s.9 AS peer_host,
       s.10 AS root_cause, s.11 AS mitigation, s.12 AS slowdown_pct, s.13 AS onset_ts,
       s.14 AS detected_ts, s.15 AS resolved_ts, s.16 AS evidence, s.17 AS gpu_hours_lost,
       last_ts AS updated_ts, first_ts AS first_seen_ts, changes
FROM (
    SELECT incident_id,
           argMax(tuple(job_id, status, fault, severity, rank, host, gpu, peer_rank,
                        peer_host, root_cause, mitigation, slowdown_pct, onset_ts,
                        detected_ts, resolved_ts, evidence, gpu_hours_lost),
                  tuple(ts, status = 'resolved')) AS s,
           max(ts) AS last_ts, min(ts) AS first_ts,
           uniqExact(ts, status, slowdown_pct, severity) AS changes
    FROM {db}.incidents
    GROUP BY incident_id
)"""

# GPU-hours lost per job per UTC day. gpu_hours_lost is cumulative per incident, so a
# day is billed what the incident's running total grew that day (its highest value
# that day minus its highest before); a plain view, exact with no wait for merges
# (incidents are few rows: one per change).
_GPU_HOURS_DAILY = """CREATE VIEW IF NOT EXISTS {db}.gpu_hours_lost_daily AS
SELECT day, job_id, sum(grew) AS gpu_hours_lost, uniqExact(incident_id) AS incidents,
       groupUniqArray(host) AS hosts
FROM (
    SELECT day, job_id, incident_id, host,
           total - lagInFrame(total, 1, 0.) OVER (PARTITION BY incident_id ORDER BY day
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS grew
    FROM (
        SELECT incident_id, toDate(ts) AS day, any(job_id) AS job_id,
               anyIf(host, host IS NOT NULL) AS host,
               max(ifNull(gpu_hours_lost, 0.)) AS total
        FROM {db}.incidents GROUP BY incident_id, day
    )
)
GROUP BY day, job_id"""

# Two comm records of one window may share group, op and peer: a producer that closes
# the ops of two steps together sends one record per step. The sort key (the
# ReplacingMergeTree's identity of a row) gets the step, or the merge would keep one.
# A sort key may only grow by a column added in the same ALTER, with no default
# expression: the writer fills it (ifNull(step, -1)).
_COMM_STEP_KEY = ("ALTER TABLE {db}.comm ADD COLUMN IF NOT EXISTS step_key Int64, "
                  "MODIFY ORDER BY (job_id, `group`, rank, ts, op, ifNull(peer, -1), step_key)")

# Migration 9: what `failslow query --preset` reads (storage/presets.py), so a preset over
# hours of a large cluster reads minutes, not samples (issue 19).
# - steps.own_s: a rank's own work in a step (compute + input wait when reported, else
#   the step less the time blocked in collectives), computed once at insert: the step
#   presets read one Float64 instead of four Nullable columns and an expression per row.
# - gpu_clocks_1m / nic_1m: per-minute rollups, filled by a materialized view on insert
#   and, once, from the rows already there. Every column is a sum, min, max, any or an
#   argMin/argMax state, so a range of whole minutes re-aggregated from them equals the
#   same range over the raw rows; a preset reads the whole minutes here and the partial
#   minutes at the edges of its range from the raw table.
# The one-time backfill takes the raw rows that arrived before the view existed (ingest_ts
# before the view's creation second) and only while the rollup holds none of them, so
# running the migration again adds nothing twice; rows that arrive during the very second
# the view is created may miss the rollup (run `failslow migrate` with the sink stopped
# to be exact).
OWN_S = "ifNull(compute_s + ifNull(data_s, 0.), duration_s - ifNull(comm_s, 0.))"
_STEPS_OWN = (f"ALTER TABLE {{db}}.steps ADD COLUMN IF NOT EXISTS own_s Float64 "
              f"MATERIALIZED {OWN_S} AFTER data_s")
# Older parts compute own_s on read until this (an asynchronous mutation on a server).
_STEPS_OWN_FILL = "ALTER TABLE {db}.steps MATERIALIZE COLUMN own_s"

# PFC pause (tx + rx), CNP (sent + handled), ECN marks and bytes (tx + rx) of a NIC port.
NIC_COUNTERS = ("tuple(ifNull(tx_pause_total, 0) + ifNull(rx_pause_total, 0), "
                "ifNull(cnp_sent_total, 0) + ifNull(cnp_handled_total, 0), "
                "ifNull(ecn_marked_total, 0), tx_bytes_total + rx_bytes_total)")

_GPU_CLOCKS_1M = """CREATE TABLE IF NOT EXISTS {db}.gpu_clocks_1m (
    minute DateTime64(0, 'UTC'), host LowCardinality(String), gpu Int32,
    clock_mhz Float64, reason_bits Int64,
    job_id SimpleAggregateFunction(any, LowCardinality(Nullable(String))),
    rank SimpleAggregateFunction(any, Nullable(Int32)),
    samples SimpleAggregateFunction(sum, UInt64),
    max_sm_clock_mhz SimpleAggregateFunction(max, Nullable(Float64)),
    temp_c_max SimpleAggregateFunction(max, Nullable(Float64)),
    power_w_sum SimpleAggregateFunction(sum, Float64),
    power_w_samples SimpleAggregateFunction(sum, UInt64),
    ingest_ts SimpleAggregateFunction(max, DateTime64(0, 'UTC'))
) ENGINE = AggregatingMergeTree ORDER BY (minute, host, gpu, clock_mhz, reason_bits)
TTL ingest_ts + INTERVAL {rollup_ttl_days} DAY"""

_NIC_1M = """CREATE TABLE IF NOT EXISTS {db}.nic_1m (
    minute DateTime64(0, 'UTC'), host LowCardinality(String), nic LowCardinality(String),
    port Int32, samples SimpleAggregateFunction(sum, UInt64),
    first_ts SimpleAggregateFunction(min, DateTime64(3, 'UTC')),
    last_ts SimpleAggregateFunction(max, DateTime64(3, 'UTC')),
    first_counters AggregateFunction(argMin, Tuple(Int64, Int64, Int64, Int64),
                                     DateTime64(3, 'UTC')),
    last_counters AggregateFunction(argMax, Tuple(Int64, Int64, Int64, Int64),
                                    DateTime64(3, 'UTC')),
    speed_gbps SimpleAggregateFunction(max, Nullable(Float64)),
    ingest_ts SimpleAggregateFunction(max, DateTime64(0, 'UTC'))
) ENGINE = AggregatingMergeTree ORDER BY (minute, host, nic, port)
TTL ingest_ts + INTERVAL {rollup_ttl_days} DAY"""

class Rollup(NamedTuple):
    """A per-minute rollup of a raw table: a minute's ``columns`` per group (``keys``, less
    the minute) over the raw rows that pass ``where``. The view, the backfill and the
    presets' raw edges (storage/presets.py) all aggregate with these ``columns``."""

    raw: str
    columns: str
    where: str
    keys: str


ROLLUPS = {
    "gpu_clocks_1m": Rollup(
        "gpu", "host, gpu, assumeNotNull(sm_clock_mhz) AS clock_mhz, "
        "ifNull(clocks_event_reasons, 0) AS reason_bits, any(job_id) AS job_id, "
        "any(rank) AS rank, count() AS samples, max(max_sm_clock_mhz) AS max_sm_clock_mhz, "
        "max(temp_c) AS temp_c_max, sum(ifNull(power_w, 0.)) AS power_w_sum, "
        "count(power_w) AS power_w_samples",
        "sm_clock_mhz IS NOT NULL", "host, gpu, clock_mhz, reason_bits"),
    "nic_1m": Rollup(
        "nic", "host, nic, port, count() AS samples, min(ts) AS first_ts, max(ts) AS last_ts, "
        f"argMinState({NIC_COUNTERS}, ts) AS first_counters, "
        f"argMaxState({NIC_COUNTERS}, ts) AS last_counters, max(speed_gbps) AS speed_gbps",
        "", "host, nic, port"),
}


def _rollup_sql(rollup: str, spec: Rollup) -> list[str]:
    """The materialized view that fills ``rollup`` from its raw table on insert, then the
    one-time backfill from the rows already there (see above)."""
    raw, where = spec.raw, f" WHERE {spec.where}" if spec.where else ""
    select = (f"SELECT toStartOfMinute(ts) AS minute, {spec.columns}, {{ingest}} AS ingest_ts "
              f"FROM {{source}}{where} GROUP BY minute, {spec.keys}")
    cutoff = ("(SELECT max(metadata_modification_time) FROM system.tables "
              f"WHERE database = '{{db}}' AND name = '{rollup}_mv')")
    before = (f"(SELECT * FROM {{db}}.{raw} WHERE ingest_ts < {cutoff} AND (SELECT count() "
              f"FROM {{db}}.{rollup} WHERE ingest_ts < {cutoff}) = 0)")
    view = (f"CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.{rollup}_mv TO {{db}}.{rollup} AS "
            + select.format(ingest="max(now64(0))", source=f"{{db}}.{raw}"))
    backfill = f"INSERT INTO {{db}}.{rollup} " + select.format(ingest="max(ingest_ts)",
                                                               source=before)
    return [view, backfill]


_PRESET_ROLLUPS = [_STEPS_OWN, _STEPS_OWN_FILL, _GPU_CLOCKS_1M, _NIC_1M,
                   *(sql for name, spec in ROLLUPS.items() for sql in _rollup_sql(name, spec))]

_SCHEMA_MIGRATIONS = """CREATE TABLE IF NOT EXISTS {db}.schema_migrations (
    version UInt32, name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree ORDER BY version"""

_CREATES = re.compile(r"CREATE (?:OR REPLACE )?(?:MATERIALIZED )?(?:TABLE|VIEW) "
                      r"(?:IF NOT EXISTS )?\{db\}\.(\w+)")
_ADDS = re.compile(r"ALTER TABLE \{db\}\.(\w+) ADD COLUMN IF NOT EXISTS (\w+)")

# The mitigation planner's actions (issue 32): what was asked of which job, and why.
_ACTIONS = f"""CREATE TABLE IF NOT EXISTS {{db}}.actions (
    ts {_TS}, action_id String, job_id LowCardinality(String), incident_id String,
    type LowCardinality(String), mode LowCardinality(String), apply_at_step Int64,
    expires_ts DateTime64(3, 'UTC'), shares Array(Float64), reason String,
    version Nullable(Int64), rank Nullable(Int32), host LowCardinality(Nullable(String)),
    rollback Nullable(Bool), step_s_before Nullable(Float64),
    {_INGEST}
) ENGINE = ReplacingMergeTree ORDER BY (job_id, ts, action_id)"""

# A rank's units of the global batch under an action (models.actions): time per sample.
_STEPS_SAMPLES = "ALTER TABLE {db}.steps ADD COLUMN IF NOT EXISTS samples Nullable(Int64)"

# (version, name, statements). Append new migrations; never edit an applied one.
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "raw tables", [_STEPS, _COLLECTIVES, _GPU, _NIC, _HOST]),
    (2, "incidents and incidents_current", [_INCIDENTS, _INCIDENTS_CURRENT]),
    (3, "dead letters", [_DEAD_LETTERS]),
    (4, "steps 1-minute rollup", [_STEPS_1M, _STEPS_1M_MV]),
    (5, "comm summaries and their 1-minute rollup", [_COMM, _COMM_1M, _COMM_1M_MV]),
    (6, "incidents.gpu_hours_lost", [_INCIDENTS_GPU_HOURS]),
    (7, "incidents_current.gpu_hours_lost and gpu_hours_lost_daily",
     [_INCIDENTS_CURRENT_COST, _GPU_HOURS_DAILY]),
    (8, "comm: the step in the sort key", [_COMM_STEP_KEY]),
    (9, "steps.own_s, gpu_clocks_1m and nic_1m (for the query presets)", _PRESET_ROLLUPS),
    (11, "actions and steps.samples (issue 32)", [_ACTIONS, _STEPS_SAMPLES]),
]


def check_server(client: Client) -> None:
    """Refuse servers older than MIN_SERVER with a message that says why."""
    version = client.server_version()
    if version[:2] < MIN_SERVER:
        shown = ".".join(map(str, version))
        raise StorageError(
            f"ClickHouse {shown} is too old: the failslow schema needs ClickHouse >= "
            f"{MIN_SERVER[0]}.{MIN_SERVER[1]} (DateTime64, TTL, codecs, LowCardinality)")


def applied(client: Client, database: str) -> set[int]:
    """Versions already applied (empty on a fresh database)."""
    _, rows = client.query(f"SELECT DISTINCT version FROM {database}.schema_migrations")
    return {int(r[0]) for r in rows}


def migrate(client: Client, database: str | None = None, ttl_days: int | None = None,
            rollup_ttl_days: int | None = None) -> list[int]:
    """Apply missing migrations, and again those whose tables or views are gone; return
    the versions applied now ([] when up to date).

    ``ttl_days`` sets the raw tables' TTL: used when they are created, and applied
    with ALTER ... MODIFY TTL to existing tables when it differs.
    """
    db = check_identifier(database or client.database)
    check_server(client)
    days = DEFAULT_TTL_DAYS if ttl_days is None else int(ttl_days)
    rollup_days = DEFAULT_ROLLUP_TTL_DAYS if rollup_ttl_days is None else int(rollup_ttl_days)
    fill = {"db": db, "ttl_days": days, "rollup_ttl_days": rollup_days}
    if min(days, rollup_days) < 1:
        raise StorageError("TTL must be at least 1 day")
    client.execute(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.execute(_SCHEMA_MIGRATIONS.format(**fill))
    done = applied(client, db) - _incomplete(client, db)
    now: list[int] = []
    for version, name, statements in MIGRATIONS:
        if version in done:
            continue
        for sql in statements:
            client.execute(sql.format(**fill))
        client.insert(f"{db}.schema_migrations", {"version": [version], "name": [name]})
        now.append(version)
    if ttl_days is not None:
        _set_ttl(client, db, days)
    return now


def _objects(statements: list[str]) -> list[str]:
    """Names of the tables and views a migration creates."""
    return [m.group(1) for sql in statements for m in _CREATES.finditer(sql)]


def _columns_added(statements: list[str]) -> list[tuple[str, str]]:
    """(table, column) of the columns a migration adds."""
    return [(m.group(1), m.group(2)) for sql in statements for m in _ADDS.finditer(sql)]


def _incomplete(client: Client, db: str) -> set[int]:
    """Versions recorded as applied whose tables, views or added columns are gone
    (dropped by hand, a partial restore, a table recreated by an earlier migration):
    applied again, in order, since every statement is idempotent."""
    _, rows = client.query("SELECT name FROM system.tables WHERE database = {db:String}",
                           {"db": db})
    present = {r[0] for r in rows}
    _, rows = client.query("SELECT table, name FROM system.columns WHERE database = "
                           "{db:String}", {"db": db})
    columns = {(r[0], r[1]) for r in rows}
    return {version for version, _, statements in MIGRATIONS
            if not set(_objects(statements)) <= present
            or not set(_columns_added(statements)) <= columns}


def _set_ttl(client: Client, db: str, days: int) -> None:
    want = f"toIntervalDay({days})"
    _, rows = client.query(
        "SELECT name, engine_full FROM system.tables WHERE database = {db:String} "
        "AND name IN {names:Array(String)}",
        {"db": db, "names": [*RAW_TABLES, "dead_letters"]})
    for name, engine_full in rows:
        if want not in engine_full:
            client.execute(f"ALTER TABLE {db}.{name} MODIFY TTL ingest_ts + INTERVAL {days} DAY")
