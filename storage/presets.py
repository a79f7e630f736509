"""Ready-made questions for ``failslow query --preset NAME [--param K=V ...]``.

Each preset is one read-only SELECT over the failslow tables (unqualified names: the
connection's database) with ClickHouse's own ``{name:Type}`` placeholders, so values
travel as query parameters on both transports and are never pasted into the SQL text.
Before that, ``bind`` checks every value against the parameter's kind here (an int is
an int, a time is a time), names the unknown and the missing ones, and fills defaults.

Times (``since``, ``until``) are ISO 8601 (``2026-11-24T08:00``, UTC unless it says
otherwise), seconds since the epoch, ``now``, or relative: ``-24h``, ``-30m``, ``-7d``.
The SQL runs unchanged on chdb and on a ClickHouse server (>= 23.3), on the schema of
storage/migrations.py up to migration 9 (steps.own_s and the gpu_clocks_1m / nic_1m
rollups that the step, GPU and NIC presets read).

>>> sorted(bind(PRESETS["slowest_ranks"], {"job": "j0", "limit": "5"},
...             now=1e9).items())  # doctest: +NORMALIZE_WHITESPACE
[('job', 'j0'), ('limit', 5), ('since', 999913600.0), ('until', 1000000000.0)]
>>> bind(PRESETS["slowest_ranks"], {"job": "j0", "limit": "5; DROP"})
Traceback (most recent call last):
...
storage.errors.QueryError: --param limit: want a whole number >= 0, got '5; DROP'
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from failslow.storage.errors import QueryError
from failslow.storage.migrations import ROLLUPS

# Parameter kinds: how the text is checked and converted, and the ClickHouse type.
KINDS = {"str": "String", "count": "UInt32", "int": "Int32", "num": "Float64",
         "time": "Float64"}
_REL = re.compile(r"-(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Param:
    name: str
    kind: str                 # a key of KINDS
    help: str
    default: str | None = None  # None: required


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str              # one line for --list-presets
    sql: str
    params: tuple[Param, ...]


def _time(text: str, now: float) -> float:
    text = text.strip()
    if text == "now":
        return now
    m = _REL.fullmatch(text)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise QueryError("want ISO 8601, epoch seconds, now or -N[smhd]") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    if not math.isfinite(value) or not 0 <= value < 1e10:
        raise QueryError("epoch seconds out of range")
    return value


def _convert(param: Param, text: str, now: float) -> Any:
    try:
        if param.kind == "str":
            if not text or len(text) > 512:
                raise QueryError("want 1 to 512 characters")
            return text
        if param.kind in ("count", "int"):
            low, high = (0, 2**32 - 1) if param.kind == "count" else (-2**31, 2**31 - 1)
            if not re.fullmatch(r"-?\d{1,10}", text.strip()):
                raise QueryError("want a whole number" + (" >= 0" if low == 0 else ""))
            value = int(text)
            if not low <= value <= high:
                raise QueryError(f"want a whole number in {low}..{high}")
            return value
        if param.kind == "num":
            number = float(text)
            if not math.isfinite(number):
                raise QueryError("want a finite number")
            return number
        return _time(text, now)
    except QueryError as exc:
        raise QueryError(f"--param {param.name}: {exc}, got {text!r}") from None
    except ValueError:
        raise QueryError(f"--param {param.name}: want a number, got {text!r}") from None


def bind(preset: Preset, given: dict[str, str], now: float | None = None) -> dict[str, Any]:
    """The query parameters for ``preset`` from ``--param`` texts, checked and typed."""
    known = {p.name: p for p in preset.params}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise QueryError(f"preset {preset.name} has no parameter {', '.join(unknown)} "
                         f"(it takes {', '.join(known) or 'none'})")
    missing = [p.name for p in preset.params if p.default is None and p.name not in given]
    if missing:
        raise QueryError(f"preset {preset.name} needs --param {'=... --param '.join(missing)}=...")
    clock = time.time() if now is None else now
    out = {}
    for p in preset.params:
        text = given.get(p.name, p.default)
        assert text is not None
        out[p.name] = _convert(p, text, clock)
    return out


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise QueryError(f"no preset {name!r} (failslow query --list-presets names them)") \
            from None


_JOB = Param("job", "str", "job id")
_SINCE = Param("since", "time", "start of the time range", "-24h")
_UNTIL = Param("until", "time", "end of the time range", "now")
_LIMIT = Param("limit", "count", "rows at most", "20")
_RANGE = ("ts >= toDateTime64({since:Float64}, 3, 'UTC') "
          "AND ts < toDateTime64({until:Float64}, 3, 'UTC')")
# A rank's own work in a step is steps.own_s (storage.migrations.OWN_S: compute + input
# wait when reported, else the step less the time blocked in collectives; everyone's step
# time is the slowest member's), computed at insert.
#
# Long ranges of GPU and NIC samples read the per-minute rollups (gpu_clocks_1m, nic_1m,
# storage/migrations.py) for the whole minutes of the range and the raw rows only for
# the partial minutes at its two edges: the same answer as the raw rows alone, from a
# few rows per device and minute. A range with no partial minute skips the raw table
# (a constant false condition reads no part).
# The raw edges aggregate as the rollups do (ROLLUPS: the same columns, in the same order,
# so UNION ALL lines them up with the rollup's rows by position).
_GPU, _NIC = ROLLUPS["gpu_clocks_1m"], ROLLUPS["nic_1m"]
_M0 = "ceil({since:Float64} / 60) * 60"
_M1 = "greatest(ceil({since:Float64} / 60), floor({until:Float64} / 60)) * 60"
_WHOLE = (f"minute >= toDateTime64({_M0}, 3, 'UTC') "
          f"AND minute < toDateTime64({_M1}, 3, 'UTC')")
_EDGES = (f"{_RANGE} AND ({{since:Float64}} < {_M0} OR {{until:Float64}} > {_M1}) "
          f"AND NOT (ts >= toDateTime64({_M0}, 3, 'UTC') AND ts < toDateTime64({_M1}, 3, 'UTC'))")

# vs_job: against the median rank (a window over the per-rank rows: one scan, not two).
# Step time is shared by every rank of a synchronous job: its mean is enough here.
_SLOWEST_RANKS = f"""
SELECT rank, host, steps, own_s_median,
       round(own_s_median / nullIf(median(own_s_median) OVER (), 0), 3) AS vs_job,
       step_s_mean, step_s_max
FROM (
    SELECT rank, any(host) AS host, count() AS steps,
           round(median(own_s), 4) AS own_s_median, round(avg(duration_s), 4) AS step_s_mean,
           round(max(duration_s), 4) AS step_s_max
    FROM steps
    WHERE job_id = {{job:String}} AND {_RANGE}
    GROUP BY rank
)
ORDER BY own_s_median DESC, rank
LIMIT {{limit:UInt32}}"""

_RANK_VS_PEERS = f"""
SELECT step, max(ts) AS step_end_ts,
       round(anyIf(own_s, rank = {{rank:Int32}}), 4) AS rank_own_s,
       round(medianIf(own_s, rank != {{rank:Int32}}), 4) AS peers_own_s_median,
       round(rank_own_s / nullIf(peers_own_s_median, 0), 3) AS ratio,
       round(anyIf(duration_s, rank = {{rank:Int32}}), 4) AS step_s,
       countIf(rank != {{rank:Int32}}) AS peers
FROM steps
WHERE job_id = {{job:String}} AND {_RANGE}
  AND ifNull(pp_rank, -1) = (SELECT any(ifNull(pp_rank, -1)) FROM steps
                             WHERE job_id = {{job:String}} AND rank = {{rank:Int32}}
                               AND {_RANGE})
GROUP BY step
HAVING countIf(rank = {{rank:Int32}}) > 0
ORDER BY step"""

_INCIDENTS_BY_CAUSE = """
SELECT ifNull(root_cause, 'unknown') AS cause, count() AS incidents,
       countIf(status = 'open') AS open, countIf(severity = 'critical') AS critical,
       groupUniqArray(fault) AS faults, uniqExact(job_id) AS jobs,
       round(sum(ifNull(gpu_hours_lost, 0.)), 3) AS lost_gpu_hours,
       round(max(slowdown_pct), 1) AS worst_slowdown_pct,
       argMax(incident_id, slowdown_pct) AS worst_incident
FROM incidents_current
WHERE updated_ts >= toDateTime64({since:Float64}, 3, 'UTC')
  AND detected_ts < toDateTime64({until:Float64}, 3, 'UTC')
GROUP BY cause
ORDER BY incidents DESC, lost_gpu_hours DESC, cause"""

# NVML clocks-event reason bits (CONTRACT.md gpu.clocks_event_reasons).
_REASONS = [(0x20, "sw_thermal"), (0x40, "hw_thermal"), (0x04, "sw_power_cap"),
            (0x80, "hw_power_brake"), (0x08, "hw_slowdown"), (0x02, "app_clocks"),
            (0x100, "display_clocks"), (0x10, "sync_boost")]
_DECODE = "arrayFilter(x -> x != '', [" + ", ".join(
    f"if(bitAnd(bits, {bit}) != 0, '{name}', '')" for bit, name in _REASONS) + "])"

# Samples grouped by (GPU, clock, reasons) first (whole minutes from gpu_clocks_1m, the
# edges from gpu): SM clocks take a few discrete values, so the reference
# (max_sm_clock_mhz, else the GPU's highest clock in the range) is a window over those
# few rows, not over every sample.
_LOW = "clk < (1 - {min_drop_pct:Float64} / 100.) * ref_mhz"
_GPU_CLOCK_DROPS = f"""
SELECT host, gpu, gpu_job AS job_id, gpu_rank AS rank, samples, low_samples,
       round(100. * low_samples / samples, 1) AS low_pct,
       round(max_clock_mhz) AS max_clock_mhz, round(low_clock_mhz) AS min_clock_mhz,
       round(100. * (1 - low_clock_mhz / max_clock_mhz), 1) AS drop_pct,
       round(temp_c_max, 1) AS temp_c_max,
       round(power_sum_low / nullIf(power_n_low, 0), 1) AS power_w_while_low,
       {_DECODE} AS reasons, bits AS reason_bits
FROM (
    SELECT host, gpu, any(job) AS gpu_job, any(rnk) AS gpu_rank, sum(n) AS samples,
           max(ref_mhz) AS max_clock_mhz, sumIf(n, {_LOW}) AS low_samples,
           minIf(clk, {_LOW}) AS low_clock_mhz, max(temp_max) AS temp_c_max,
           sumIf(power_sum, {_LOW}) AS power_sum_low, sumIf(power_n, {_LOW}) AS power_n_low,
           groupBitOrIf(reason_bits, {_LOW}) AS bits
    FROM (
        SELECT *, ifNull(ref, max(clk) OVER (PARTITION BY host, gpu)) AS ref_mhz
        FROM (
            SELECT host, gpu, clk, reason_bits, any(job) AS job, any(rnk) AS rnk, sum(n) AS n,
                   max(ref) AS ref, max(temp_max) AS temp_max, sum(power_sum) AS power_sum,
                   sum(power_n) AS power_n
            FROM (
                SELECT host, gpu, clock_mhz AS clk, reason_bits, job_id AS job, rank AS rnk,
                       samples AS n, max_sm_clock_mhz AS ref, temp_c_max AS temp_max,
                       power_w_sum AS power_sum, power_w_samples AS power_n
                FROM gpu_clocks_1m
                WHERE {_WHOLE}
                UNION ALL
                SELECT {_GPU.columns}
                FROM gpu
                WHERE {_EDGES} AND {_GPU.where}
                GROUP BY {_GPU.keys}
            )
            GROUP BY host, gpu, clk, reason_bits
        )
    )
    GROUP BY host, gpu
)
WHERE low_samples >= {{min_samples:UInt32}}
ORDER BY low_samples DESC, drop_pct DESC, host, gpu
LIMIT {{limit:UInt32}}"""


# Counters summed per port (tx + rx pause, sent + handled CNP, ECN, bytes: storage.
# migrations.NIC_COUNTERS), then what each grew over the range with no sort: the last sample's
# values less the first's (argMin / argMax of the tuple, merged from nic_1m's whole
# minutes and the edges' raw rows). A counter that was reset in the range (a decrease)
# counts from the reset only: undercounted, never negative.
def _grown(i: int) -> str:
    first, last = f"first_.{i}", f"last_.{i}"
    return f"if({last} >= {first}, {last} - {first}, {last})"


_NIC_STORMS = f"""
SELECT host, nic, port, samples, seconds,
       round({_grown(1)} / seconds, 1) AS pause_per_s, round({_grown(2)} / seconds, 1) AS cnp_per_s,
       round({_grown(3)} / seconds, 1) AS ecn_per_s,
       round(8 * {_grown(4)} / seconds / 1e9, 3) AS gbps, speed_gbps
FROM (
    SELECT host, nic, port, sum(n) AS samples,
           greatest(dateDiff('millisecond', min(t0), max(t1)) / 1000., 1e-3) AS seconds,
           argMinMerge(first_c) AS first_, argMaxMerge(last_c) AS last_,
           max(speed) AS speed_gbps
    FROM (
        SELECT host, nic, port, samples AS n, first_ts AS t0, last_ts AS t1,
               first_counters AS first_c, last_counters AS last_c, speed_gbps AS speed
        FROM nic_1m
        WHERE {_WHOLE}
        UNION ALL
        SELECT {_NIC.columns}
        FROM nic
        WHERE {_EDGES}
        GROUP BY {_NIC.keys}
    )
    GROUP BY host, nic, port
    HAVING samples >= 2
)
WHERE pause_per_s >= {{min_per_s:Float64}} OR cnp_per_s >= {{min_per_s:Float64}}
ORDER BY pause_per_s + cnp_per_s DESC, host, nic, port
LIMIT {{limit:UInt32}}"""

_IN_RANGE = """updated_ts >= toDateTime64({since:Float64}, 3, 'UTC')
  AND detected_ts < toDateTime64({until:Float64}, 3, 'UTC')"""

_GPU_HOURS_BY_JOB = f"""
SELECT job_id, round(sum(ifNull(gpu_hours_lost, 0.)), 4) AS lost_gpu_hours,
       count() AS incidents, countIf(status = 'open') AS open,
       groupUniqArrayIf(host, host IS NOT NULL) AS hosts,
       argMax(incident_id, ifNull(gpu_hours_lost, 0.)) AS costliest_incident
FROM incidents_current
WHERE {_IN_RANGE}
GROUP BY job_id
ORDER BY lost_gpu_hours DESC, job_id
LIMIT {{limit:UInt32}}"""

_GPU_HOURS_BY_HOST = f"""
SELECT ifNull(host, '(job-wide)') AS host,
       round(sum(ifNull(gpu_hours_lost, 0.)), 4) AS lost_gpu_hours,
       count() AS incidents, countIf(status = 'open') AS open,
       groupUniqArray(job_id) AS jobs, groupUniqArray(ifNull(root_cause, 'unknown')) AS causes
FROM incidents_current
WHERE {_IN_RANGE}
GROUP BY host
ORDER BY lost_gpu_hours DESC, host
LIMIT {{limit:UInt32}}"""

# Each action with the job's median step time over ``steps`` steps before the step it
# applies at and as many from it on (rank 0's steps: a synchronous job's steps last as
# long on every rank): what the mitigation did, measured.
_MITIGATIONS = """
SELECT a.ts AS ts, a.action_id AS action_id, a.job_id AS job_id, a.incident_id AS incident_id,
       a.type AS type, a.mode AS mode, a.apply_at_step AS apply_at_step, a.shares AS shares,
       a.rank AS rank, a.host AS host, ifNull(a.rollback, false) AS rollback,
       round(medianIf(s.duration_s, s.step < a.apply_at_step), 4) AS step_s_before,
       round(medianIf(s.duration_s, s.step >= a.apply_at_step), 4) AS step_s_after,
       a.reason AS reason
FROM (SELECT * FROM actions FINAL
      WHERE ts >= toDateTime64({since:Float64}, 3, 'UTC')
        AND ts < toDateTime64({until:Float64}, 3, 'UTC')
        AND ({job:String} = '*' OR job_id = {job:String})) AS a
LEFT JOIN (SELECT job_id, step, duration_s FROM steps WHERE rank = 0) AS s
  ON s.job_id = a.job_id
WHERE s.step >= a.apply_at_step - {steps:UInt32} AND s.step < a.apply_at_step + {steps:UInt32}
   OR s.step IS NULL
GROUP BY ts, action_id, job_id, incident_id, type, mode, apply_at_step, shares, rank, host,
         rollback, reason
ORDER BY ts, action_id
LIMIT {limit:UInt32}"""

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("slowest_ranks", "a job's ranks by their own work per step (compute + input), "
           "slowest first", _SLOWEST_RANKS, (_JOB, _SINCE, _UNTIL, _LIMIT)),
    Preset("rank_vs_peers", "one rank's work per step vs the median of its peers "
           "(same pipeline stage)", _RANK_VS_PEERS,
           (_JOB, Param("rank", "int", "the rank"), _SINCE, _UNTIL)),
    Preset("incidents_by_cause", "incidents active in the range (default last 24 h) "
           "by root cause, with their cost", _INCIDENTS_BY_CAUSE, (_SINCE, _UNTIL)),
    Preset("gpu_clock_drops", "GPUs whose SM clock fell below max by min_drop_pct, "
           "with the throttle reasons seen then", _GPU_CLOCK_DROPS,
           (_SINCE, _UNTIL, Param("min_drop_pct", "num", "percent under max clock", "10"),
            Param("min_samples", "count", "low samples at least", "3"), _LIMIT)),
    Preset("nic_storms", "NIC ports with PFC pause or CNP storms (frames per second)",
           _NIC_STORMS, (_SINCE, _UNTIL,
                         Param("min_per_s", "num", "pause or CNP frames/s at least",
                               "1000"), _LIMIT)),
    Preset("gpu_hours_by_job", "GPU-hours lost per job to incidents active in the range",
           _GPU_HOURS_BY_JOB, (_SINCE, _UNTIL, _LIMIT)),
    Preset("gpu_hours_by_host", "GPU-hours lost per culprit host to incidents active "
           "in the range", _GPU_HOURS_BY_HOST, (_SINCE, _UNTIL, _LIMIT)),
    Preset("mitigations", "actions the planner published (rebalances, rollbacks, drains) "
           "with the job's step time before and after each", _MITIGATIONS,
           (_SINCE, _UNTIL, Param("job", "str", "job id ('*': every job)", "*"),
            Param("steps", "count", "steps before and after the action measured", "10"),
            _LIMIT)),
)}
