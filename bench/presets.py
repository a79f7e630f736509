"""Time of every `failslow query --preset` on chdb over 10M simulated step rows.

Rows are generated inside ClickHouse (INSERT ... SELECT FROM numbers(), the simulator's
shape and distribution, not the simulator itself: 10M rows through Python would take
minutes): one synchronous job, 4,096 ranks (tp8 pp4 dp128, 8 GPUs per host) x 2,442
one-second steps = 10.0M step rows; compute ~60 % of the step with ~2 % noise, input
~1 %, the rest blocked in collectives; every step's duration is the slowest member's.
Rank 517 (host h64, GPU 5) is thermally throttled (+25 % compute, SM clock 1980 ->
1500 MHz, reason 0x20) for steps 800-1599; host h100's NICs see a PFC pause / CNP storm
for the same time. The same cluster's telemetry over the same span: one GPU sample per
GPU per second (10.0M gpu rows) and one NIC sample per port per 2 s (5.0M nic rows);
2,000 incident rows over 200 jobs.

Each preset runs `--repeat` times (default 5); prints min and median wall seconds and the
process CPU seconds of the fastest run (user + system, all of chdb's threads: on a loaded
machine the wall time mostly measures the queue for a core, the CPU time the query's own
work), with the load average, and writes bench/results/presets.json. Target (issue 19):
every preset < 1 s. ``--baseline REV`` times REV's presets too, interleaved with
today's on the same rows (the wall time on a shared machine moves with its load; the two
columns side by side do not). The range ends mid-minute (10 s after the last step), so the GPU and
NIC presets read their rollups' whole minutes and the raw rows of the last partial minute.
    python bench/presets.py [--steps 2442] [--ranks 4096] [--repeat 5] [--baseline REV]
                            [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import orjson

from failslow.storage.client import connect
from failslow.storage.guard import readonly_sql
from failslow.storage.migrations import migrate
from failslow.storage.presets import PRESETS, bind

RESULTS = Path(__file__).parent / "results" / "presets.json"
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
CULPRIT, CULPRIT_HOST, STORM_HOST = 517, "h64", "h100"
FAULT = (800, 1600)  # steps (= seconds after T0)


def _u(*salt: object) -> str:
    """A deterministic uniform in [0, 1) from the row's numbers."""
    return f"(cityHash64({', '.join(map(str, salt))}) % 1000000) / 1e6"


def _z(*salt: object) -> str:
    """Roughly N(0, 1): the sum of three uniforms, centred and scaled."""
    return "((" + " + ".join(_u(*salt, k) for k in range(3)) + ") - 1.5) * 2"


def load(client, ranks: int, steps: int) -> dict[str, int]:
    lo, hi = FAULT
    hot = f"(s >= {lo} AND s < {hi})"
    client.execute(f"""
INSERT INTO steps (ts, job_id, rank, world_size, host, step, duration_s, gpu, compute_s,
                   comm_s, data_s, tokens, dp_rank, pp_rank, tp_rank)
SELECT toDateTime64({T0} + s + 1 + r * 1e-5, 3, 'UTC'), 'job0', r, {ranks},
       concat('h', toString(intDiv(r, 8))), s, dur, r % 8, comp, dur - comp - data, data,
       4096, intDiv(r, 32), intDiv(r % 32, 8), r % 8
FROM (
    SELECT intDiv(number, {ranks}) AS s, toInt32(number % {ranks}) AS r,
           0.6 * (1 + 0.02 * {_z('number', 1)})
               * if(r = {CULPRIT} AND {hot}, 1.25, 1.) AS comp,
           0.01 * (1 + 0.2 * {_u('number', 2)}) AS data,
           (1 + 0.01 * {_z('s', 3)}) * if({hot}, 1.15, 1.) AS dur
    FROM numbers({ranks * steps})
)""")
    gpus = ranks
    client.execute(f"""
INSERT INTO gpu (ts, host, gpu, uuid, sm_clock_mhz, max_sm_clock_mhz, util_pct, power_w,
                 power_limit_w, temp_c, clocks_event_reasons, job_id, rank)
SELECT toDateTime64({T0} + s + 0.5, 3, 'UTC'), concat('h', toString(intDiv(g, 8))),
       g % 8, concat('GPU-', toString(g)),
       if(throttled, 1500., 1980. - 15 * ({_u('number', 4)} < 0.05)), 1980., 97.,
       if(throttled, 380., 650. + 20 * {_z('number', 5)}), 700.,
       if(throttled, 86., 62. + 2 * {_z('number', 6)}), if(throttled, 32, 4), 'job0', g
FROM (SELECT number, intDiv(number, {gpus}) AS s, toInt32(number % {gpus}) AS g,
             g = {CULPRIT} AND s >= {lo} AND s < {hi} AS throttled
      FROM numbers({gpus * steps}))""")
    hosts = ranks // 8
    samples = steps // 2
    client.execute(f"""
INSERT INTO nic (ts, host, nic, port, tx_bytes_total, rx_bytes_total, state, speed_gbps,
                 tx_pause_total, rx_pause_total, cnp_sent_total, cnp_handled_total,
                 ecn_marked_total)
SELECT toDateTime64({T0} + 2 * k + 0.7, 3, 'UTC'), concat('h', toString(h)),
       concat('mlx5_', toString(p)), 1, toInt64(k * 12e9), toInt64(k * 12e9), 'up', 400.,
       toInt64(k * 2 + storm * 12000), toInt64(k * 3 + storm * 60000),
       toInt64(k * 5 + storm * 100000), toInt64(k * 7 + storm * 180000),
       toInt64(k * 11 + storm * 100000)
FROM (SELECT intDiv(number, {hosts * 8}) AS k, toInt32(intDiv(number % {hosts * 8}, 8)) AS h,
             number % 8 AS p,
             if(h = {STORM_HOST[1:]}, greatest(0, least(2 * k, {hi}) - {lo}), 0) AS storm
      FROM numbers({hosts * 8 * samples}))""")
    client.execute(f"""
INSERT INTO incidents (ts, incident_id, job_id, status, fault, severity, onset_ts,
                       detected_ts, slowdown_pct, gpu_hours_lost, rank, host, root_cause,
                       mitigation, evidence)
SELECT toDateTime64({T0} + 60 * number, 3, 'UTC'), concat('job', toString(j), ':i', toString(i)),
       concat('job', toString(j)), if(number % 10 = 9, 'resolved', 'open'), 'slow_rank',
       'warning', toDateTime64({T0} + 60 * i, 3, 'UTC'), toDateTime64({T0} + 60 * i + 5, 3, 'UTC'),
       10. + number % 20, 0.1 * number, toInt32(i), concat('h', toString(i % 512)),
       ['gpu_thermal', 'gpu_power', 'nic_congestion', 'cpu_contention'][1 + i % 4],
       'ignore', '{{}}'
FROM (SELECT number, number % 200 AS j, intDiv(number, 10) AS i FROM numbers(2000))""")
    counts = {}
    for table in ("steps", "gpu", "nic", "incidents"):
        _, rows = client.query(f"SELECT count() FROM {table}")
        counts[table] = int(rows[0][0])
    return counts


def _settle(client, timeout_s: float = 600.0) -> None:
    """Wait for the schema's mutations (migration 9 fills steps.own_s in the parts of a
    reused folder) so that no timed query shares the CPU with them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, rows = client.query("SELECT count() FROM system.mutations "
                               "WHERE database = currentDatabase() AND NOT is_done")
        if not rows[0][0]:
            return
        time.sleep(1.0)


def _baseline(rev: str) -> dict:
    """The PRESETS of storage/presets.py as of git ``rev``."""
    source = subprocess.run(["git", "show", f"{rev}:storage/presets.py"], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).parent).stdout
    module = types.ModuleType(f"presets_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:storage/presets.py", "exec"), module.__dict__)
    return dict(module.PRESETS)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def params(name: str, steps: int) -> dict[str, str]:
    window = {"since": str(T0), "until": str(T0 + steps + 10)}
    extra = {"slowest_ranks": {"job": "job0"},
             "rank_vs_peers": {"job": "job0", "rank": str(CULPRIT)}}.get(name, {})
    known = {p.name for p in PRESETS[name].params}
    return {k: v for k, v in {**window, **extra}.items() if k in known}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=2442)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", metavar="REV",
                    help="also time storage/presets.py as of git REV, interleaved with "
                         "today's, on the same rows (REV's SQL must run on today's schema)")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="load into DIR and keep it; a later run with the same DIR reuses it")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="failslow-bench-presets-"))
    reuse = (root / "chdb").exists()
    client = connect(f"chdb://{root / 'chdb'}", own=True)
    try:
        migrate(client)
        t = time.perf_counter()
        if reuse:
            counts = {t: int(client.query(f"SELECT count() FROM {t}")[1][0][0])
                      for t in ("steps", "gpu", "nic", "incidents")}
        else:
            counts = load(client, args.ranks, args.steps)
        load_s = time.perf_counter() - t
        _settle(client)
        print(f"{'reused' if reuse else 'loaded'} {counts} in {load_s:.1f} s "
              "(INSERT ... SELECT FROM numbers())", flush=True)
        old = _baseline(args.baseline) if args.baseline else {}
        results, baseline = {}, {}
        for name, preset in PRESETS.items():
            runs = {"now": (preset, {"times": [], "cpus": []})}
            if name in old:
                runs["baseline"] = (old[name], {"times": [], "cpus": []})
            rows: list = []
            for _ in range(args.repeat):  # interleaved: both see the same machine
                for which, (p, got) in runs.items():
                    bound = bind(p, params(name, args.steps))
                    t, c = time.perf_counter(), _cpu_s()
                    cols, out = client.query(readonly_sql(p.sql.strip()), bound)
                    got["times"].append(time.perf_counter() - t)
                    got["cpus"].append(_cpu_s() - c)
                    if which == "now":
                        rows = [dict(zip(cols, r, strict=True)) for r in out]
            for which, (_, got) in runs.items():
                times, cpus = got["times"], got["cpus"]
                stats = {"min_s": round(min(times), 4),
                         "median_s": round(statistics.median(times), 4),
                         "cpu_s": round(cpus[times.index(min(times))], 4),
                         "load1": round(os.getloadavg()[0], 1), "rows": len(rows)}
                (results if which == "now" else baseline)[name] = stats
                top = {k: rows[0][k] for k in list(rows[0])[:2]} if rows else {}
                print(f"{name:<20} {which:<8} wall min {stats['min_s']:6.3f} s  median "
                      f"{stats['median_s']:6.3f} s  cpu {stats['cpu_s']:6.3f} s  "
                      f"load {stats['load1']:4.1f}  rows {len(rows):>4}  first {top}",
                      flush=True)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_bytes(orjson.dumps({
            "rows": counts, "ranks": args.ranks, "steps": args.steps, "repeat": args.repeat,
            "load_s": None if reuse else round(load_s, 1), "reused_folder": reuse,
            "presets": results, "cpus": os.cpu_count(),
            **({"baseline": {"rev": args.baseline, "presets": baseline}} if baseline else {}),
            "machine": platform.platform(),
            "note": "rows generated by INSERT ... SELECT FROM numbers() in the simulator's "
                    "shape; chdb, one process; noisy shared VM unless said otherwise",
        }, default=str, option=orjson.OPT_INDENT_2))
        print(f"wrote {RESULTS}")
    finally:
        client.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
