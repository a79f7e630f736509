"""`failslow worker` — the stream processors: a faust worker that routes the input topics
to each job's home partition, runs models/ there and emits incidents.

Start several with the same ``--group`` to share the partitions. SIGINT/SIGTERM
stop it cleanly (final snapshot, commit, leave the group); an agent crash exits
with code 70. A stop that cannot finish within ``--stop-timeout`` (the broker is
gone, so nothing can be committed) exits with code 75; the uncommitted input is read
again by the next worker. While the broker is down, repeated client error lines are
held back (one line per kind a minute) and counted in
``failslow_stream_kafka_client_errors_total``.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
from typing import Any

from failslow.commands.detect import add_config_argument, detection_config
from failslow.config import resolve
from failslow.errors import ConfigError
from failslow.schema import Topics
from failslow.streams import gcwork, quiet

log = logging.getLogger("failslow.worker")
STOP_TIMEOUT_EXIT = 75   # EX_TEMPFAIL: stopped without committing; safe to start again

HELP = "the stream processors (faust worker)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", "--workers-id", dest="group", default="failslow-worker",
                        help="consumer group / faust app id shared by cooperating workers "
                             "[failslow-worker]")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics on ADDR:PORT/metrics [off]")
    parser.add_argument("--metrics-addr", default="127.0.0.1",
                        help="address the metrics endpoint binds to [127.0.0.1]; 0.0.0.0 in "
                             "a container")
    parser.add_argument("--lateness", type=float, default=10.0,
                        help="event-time seconds an event may trail the others and still be "
                             "ordered with them [10]")
    parser.add_argument("--telemetry-delay", type=float, default=1.0,
                        help="seconds device samples may trail the step events: the "
                             "collectors' sampling interval; a step is judged with the samples "
                             "up to its ts minus this. Use the same value with `failslow "
                             "detect` to compare [1]")
    parser.add_argument("--job-idle", type=float, default=300.0, metavar="S",
                        help="event-time seconds a job may send no step or collective event "
                             "before it has ended: its open incidents resolve (\"job ended\") "
                             "and its state is dropped; 20 of its step times if longer [300]")
    parser.add_argument("--max-clock-ahead", type=float, default=60.0, metavar="S",
                        help="an event stamped more than S seconds (at most a quarter of "
                             "--job-idle) ahead of this worker's clock is dead-lettered, not "
                             "judged: its producer's clock is wrong; 5 s ahead is warned "
                             "about [60]")
    parser.add_argument("--jitter", type=float, default=0.3,
                        help="wall seconds an event of a live stream waits for late events of "
                             "other sources before it is ordered without them; 0: wait for "
                             "every source's next event (exact, up to a step slower) [0.3]")
    parser.add_argument("--snapshot-interval", type=float, default=5.0,
                        help="seconds between state snapshots (bounds the replay after a "
                             "crash); longer for a large state, so snapshots take at most 5%% "
                             "of the worker's time [5]")
    parser.add_argument("--session-timeout", type=float, default=2.0,
                        help="consumer-group session timeout in seconds; a crashed worker's "
                             "partitions move after about this long [2]")
    parser.add_argument("--fetch-wait-ms", type=int, default=100,
                        help="longest a fetch waits for data, ms; Tansu holds every fetch "
                             "this long, so it adds to the latency of each of the two hops "
                             "(Apache Kafka answers as soon as data arrives) [100]")
    parser.add_argument("--internal-retention-h", type=float, default=6.0,
                        help="hours the internal job and snapshot topics keep their data, "
                             "when the worker creates them: a restart after a longer stop "
                             "starts without state [6]")
    caps = parser.add_argument_group(
        "input caps (per home partition; events beyond them are dropped, logged once and "
        "counted in failslow_stream_capped_events_total)")
    caps.add_argument("--max-jobs", type=int, default=1_000, help="distinct jobs [1000]")
    caps.add_argument("--max-hosts", type=int, default=16_384,
                      help="distinct hosts sending telemetry [16384]")
    caps.add_argument("--max-ranks-per-job", type=int, default=32_768,
                      help="distinct ranks in one job [32768]")
    caps.add_argument("--max-groups-per-job", type=int, default=65_536,
                      help="distinct collective groups in one job [65536]")
    caps.add_argument("--max-hosts-per-job", type=int, default=8_192,
                      help="distinct hosts in one job [8192]")
    add_config_argument(parser)
    parser.add_argument("--log-level", default="info", help="faust/worker log level [info]")
    parser.add_argument("--stop-timeout", type=float, default=15.0, metavar="S",
                        help="on SIGTERM/SIGINT, exit after this many seconds even if the "
                             "broker is unreachable (uncommitted input is read again) [15]")


def run(args: argparse.Namespace) -> int:
    if args.lateness <= 0 or args.snapshot_interval <= 0 or args.session_timeout <= 0:
        raise ConfigError("--lateness, --snapshot-interval and --session-timeout must be > 0")
    if args.stop_timeout <= 0:
        raise ConfigError("--stop-timeout must be > 0")
    if args.jitter < 0:
        raise ConfigError("--jitter must be >= 0")
    if args.internal_retention_h <= 0:
        raise ConfigError("--internal-retention-h must be > 0")
    # a crash in native code (a Kafka client, a codec) says where it was, on stderr
    faulthandler.enable()
    if not 1 <= args.fetch_wait_ms <= 10_000:
        raise ConfigError("--fetch-wait-ms must be between 1 and 10000")
    if not 0 <= args.telemetry_delay < args.lateness:
        raise ConfigError("--telemetry-delay must be >= 0 and below --lateness")
    if args.job_idle <= 0:
        raise ConfigError("--job-idle must be > 0")
    if args.max_clock_ahead <= 0:
        raise ConfigError("--max-clock-ahead must be > 0")
    if min(args.max_jobs, args.max_hosts, args.max_ranks_per_job, args.max_groups_per_job,
           args.max_hosts_per_job) < 1:
        raise ConfigError("--max-* caps must be >= 1")
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        raise ConfigError(f"--metrics-port {args.metrics_port}: not a TCP port")
    settings = resolve(args)
    detection = detection_config(args.config)    # a bad file: one line, before any start
    import faust

    from failslow.streams.app import WorkerConfig, build_app

    cfg = WorkerConfig(bootstrap=settings.bootstrap, topics=Topics(settings.topic_prefix),
                       group=args.group, lateness=args.lateness,
                       snapshot_interval=args.snapshot_interval, metrics_port=args.metrics_port,
                       metrics_addr=args.metrics_addr,
                       session_timeout=args.session_timeout,
                       telemetry_delay=args.telemetry_delay, jitter=args.jitter,
                       job_idle=args.job_idle, max_clock_ahead=args.max_clock_ahead,
                       fetch_wait_ms=args.fetch_wait_ms,
                       internal_retention_h=args.internal_retention_h,
                       max_jobs=args.max_jobs, max_hosts=args.max_hosts,
                       max_ranks_per_job=args.max_ranks_per_job,
                       max_groups_per_job=args.max_groups_per_job,
                       max_hosts_per_job=args.max_hosts_per_job, detection=detection)
    if detection.mitigate is not None:     # the file's [mitigate] table (issue 32's)
        from failslow.models.actions import MitigationConfig

        cfg.mitigate = MitigationConfig.from_mapping(dict(detection.mitigate))
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from failslow.streams import memdiag

    memdiag.start_from_env()  # issue 17: FAILSLOW_TRACEMALLOC=DIR, off by default
    app = build_app(cfg)
    quiet.install(on_suppress=app.failslow_metrics.client_errors.inc)  # type: ignore[attr-defined]
    tune_gc()

    class Worker(faust.Worker):
        def _schedule_shutdown(self, signal: Any) -> None:
            # faust's stop waits on a broker that may be gone: bound it.
            if not self._signal_stop_time:
                quiet.stop_deadline(args.stop_timeout, STOP_TIMEOUT_EXIT, log)
            super()._schedule_shutdown(signal)

    worker = Worker(app, loglevel=args.log_level, quiet=True, override_logging=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def tune_gc() -> None:
    """Make the cyclic GC cost per event instead of per event x heap size.

    The worker keeps millions of long-lived objects (a 4,096-rank Detector's state, events
    held for ordering) and allocates a few containers per event, nearly all freed by
    reference counting. With CPython's default thresholds (700, 10, 10) the collector
    re-walked that heap 25 times in 1.3 M events (``large_4096``, 6 steps): 7.6 s of a
    38 s run, growing with the state. Start-up objects (modules, classes) are frozen out
    of every collection, and a young collection waits for 50,000 net allocations, so old
    generations are examined ~70x less often; cycles are still collected. Issue 31: the
    judge thread then freezes what each message, tick and snapshot left, as `failslow
    detect` freezes each chunk, and collects cycles in full collections that take at most
    1 % of the process's CPU (``streams.gcwork``).
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)
    gcwork.enable()
