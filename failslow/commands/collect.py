"""`failslow collect` — the host agent: samplers -> Kafka, until SIGTERM / SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import socket

from failslow.collectors.action_sources import ActionRelay, KafkaActionSource
from failslow.collectors.agent import Agent
from failslow.collectors.lifecycle import Shutdown
from failslow.collectors.publisher import Publisher
from failslow.collectors.relay import SOCKET_ENV, Relay
from failslow.collectors.samplers import OnChangeConfig
from failslow.config import resolve
from failslow.errors import FailslowError
from failslow.home import private_home
from failslow.metrics import COLLECT, add_metrics_flags, serve_metrics
from failslow.schema import Topics

HELP = "the host agent: GPU/NIC/host samplers and NCCL Inspector tailer -> Kafka"
SAMPLERS = ("gpu", "nic", "host", "nccl")
log = logging.getLogger("failslow.collect")


class CollectError(FailslowError):
    """Bad collect arguments, or a sampler that was asked for cannot start."""


def on_change_config(args: argparse.Namespace) -> OnChangeConfig | bool:
    """The agent's on-change filter from the flags (False: every sample)."""
    if not args.telemetry_on_change:
        return False
    try:
        return OnChangeConfig(heartbeat_s=args.telemetry_heartbeat)
    except ValueError as exc:
        raise CollectError(f"--telemetry-heartbeat: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between samples (default 1)")
    parser.add_argument("--samplers", default="auto",
                        help="comma list of gpu,nic,host,nccl; 'auto' = nic,host, gpu when NVML "
                             "loads, nccl when --nccl-dir is given")
    parser.add_argument("--host", default=None, help="host name in events (default: hostname)")
    parser.add_argument("--job-id", default=None, help="training job running on this host")
    parser.add_argument("--rank-map", default=None,
                        help="local GPU index -> global rank of --job-id, e.g. 0:8,1:9,2:10")
    parser.add_argument("--nccl-dir", default=None,
                        help="NCCL_INSPECTOR_DUMP_DIR of the job to follow")
    parser.add_argument("--comm-grain", choices=("comm", "collective"), default="comm",
                        help="what the NCCL tailer publishes: one comm summary per rank per "
                             "--interval (default), or one collective event per NCCL record "
                             "(debugging, small jobs)")
    parser.add_argument("--spool-dir", default=None,
                        help="on-disk spool while the broker is unreachable "
                             "(default FAILSLOW_HOME/spool/HOST)")
    parser.add_argument("--spool-max-mb", type=float, default=256.0,
                        help="spool bound; the oldest samples are dropped past it (default 256)")
    parser.add_argument("--spool-fsync", choices=("always", "interval", "never"),
                        default="interval",
                        help="when spooled samples are forced to disk: after every message, "
                             "at most once a second (default: a power failure loses at most "
                             "1 s of an outage's samples), or never (the OS decides)")
    parser.add_argument("--linger-ms", type=float, default=100.0,
                        help="producer linger (default 100)")
    parser.add_argument("--sys-root", default="/sys", help=argparse.SUPPRESS)
    parser.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    parser.add_argument("--telemetry-on-change", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="publish a device sample only when what the root cause reads "
                        "moved, plus a heartbeat (default); --no-telemetry-on-change "
                        "publishes every sample")
    parser.add_argument("--telemetry-heartbeat", type=float, default=10.0, metavar="S",
                        help="with on-change: the longest a device stays silent, in "
                        "seconds (default 10)")
    parser.add_argument("--relay-socket", metavar="PATH",
                        help="Unix socket the training processes of this host hand their "
                        f"windows to (their ${SOCKET_ENV}); relayed as one message per "
                        f"window [${SOCKET_ENV}; default: no relay]")
    parser.add_argument("--actions-dir", metavar="DIR",
                        help="write the actions of failslow.actions to DIR/actions-<job>.jsonl, "
                        "one file per job, for its ranks' FileActionSource (issue 32) "
                        "[default: off]")
    parser.add_argument("--batch", action=argparse.BooleanOptionalAction, default=True,
                        help="publish GPU samples and comm windows as columnar batches, one "
                        "message per host per window (default); --no-batch: one object each")
    parser.add_argument("--cycles", type=int, default=None,
                        help="stop after this many sample cycles (default: run until stopped)")
    add_metrics_flags(parser)


def _rank_map(text: str | None, job_id: str | None) -> dict[int, tuple[str, int]]:
    if not text:
        return {}
    if not job_id:
        raise CollectError("--rank-map needs --job-id")
    try:
        pairs = [item.split(":") for item in text.split(",") if item.strip()]
        return {int(g): (job_id, int(r)) for g, r in pairs}
    except ValueError:
        raise CollectError(f"--rank-map: expected GPU:RANK,... not {text!r}") from None


def build_samplers(args: argparse.Namespace, host: str) -> list:
    wanted = args.samplers.split(",") if args.samplers != "auto" else ["gpu", "nic", "host"]
    if args.samplers == "auto" and args.nccl_dir:
        wanted.append("nccl")
    unknown = set(wanted) - set(SAMPLERS)
    if unknown:
        raise CollectError(f"--samplers: unknown {', '.join(sorted(unknown))} "
                           f"(choose from {', '.join(SAMPLERS)})")
    samplers: list = []
    if "gpu" in wanted:
        from failslow.collectors.gpu import GpuSampler

        try:
            samplers.append(GpuSampler(host=host, ranks=_rank_map(args.rank_map, args.job_id)))
        except Exception as exc:  # no driver / no libnvidia-ml: pynvml raises its own errors
            if args.samplers != "auto":
                raise CollectError(f"GPU sampler: NVML unavailable ({exc})") from None
            log.info("no NVML on this host (%s): GPU sampler off", exc)
    if "nic" in wanted:
        from failslow.collectors.nic import NicSampler

        samplers.append(NicSampler(host=host, sys_root=args.sys_root))
    if "host" in wanted:
        from failslow.collectors.host import HostSampler

        samplers.append(HostSampler(host=host, proc_root=args.proc_root))
    if "nccl" in wanted:
        if not args.nccl_dir or not args.job_id:
            raise CollectError("the nccl sampler needs --nccl-dir and --job-id")
        from failslow.collectors.nccl_inspector import InspectorTailer

        samplers.append(InspectorTailer(args.nccl_dir, args.job_id, host=host,
                                        grain=args.comm_grain))
    return samplers


def _collect_stats(agent: Agent, pub: Publisher) -> dict[str, int]:
    names = [s.name for s in agent.samplers]
    return {**pub.stats, "cycles": agent.cycles,
            **{f"events.{n}": agent.counts[n] for n in names},
            **{f"errors.{n}": agent.errors[n] for n in names}}


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.interval <= 0:
        raise CollectError(f"--interval must be > 0 seconds, not {args.interval}")
    settings = resolve(args)
    host = args.host or socket.gethostname()
    samplers = build_samplers(args, host)
    if not samplers:
        raise CollectError("no sampler to run")
    on_change = on_change_config(args)
    if not args.spool_dir:
        private_home(settings.home, create=True)
    spool = args.spool_dir or str(settings.home / "spool" / host)
    pub = Publisher(settings.bootstrap, Topics(settings.topic_prefix), spool_dir=spool,
                    linger_ms=args.linger_ms, spool_max_bytes=int(args.spool_max_mb * 2**20),
                    spool_fsync=args.spool_fsync)
    agent = Agent(samplers, pub, interval_s=args.interval, on_change=on_change,
                  batch=args.batch)
    relay_socket = args.relay_socket or os.environ.get(SOCKET_ENV)
    try:
        relay = Relay(relay_socket, pub) if relay_socket else None
    except OSError as exc:
        pub.close(timeout=1.0)
        raise CollectError(f"--relay-socket {relay_socket}: {exc.strerror or exc}") from None
    actions = ActionRelay(KafkaActionSource(
        settings.bootstrap, None, Topics(settings.topic_prefix).for_kind("action")),
        args.actions_dir) if args.actions_dir else None
    log.info("collect: %s -> %s (prefix %s), every %g s, spool %s", ",".join(
        s.name for s in samplers), settings.bootstrap, settings.topic_prefix, args.interval, spool)
    try:
        serve_metrics(args, lambda: _collect_stats(agent, pub), COLLECT)
        with Shutdown() as stop:
            if relay is not None:
                relay.start()
                log.info("collect: relaying the ranks' windows from %s", relay_socket)
            if actions is not None:
                actions.start()
            agent.run(stop, cycles=args.cycles)
    finally:
        if actions is not None:
            actions.stop()
        if relay is not None:
            relay.stop()
        left = pub.close(timeout=10.0)
        st = pub.stats
        log.info("collect: stopped after %d cycles: published=%d delivered=%d spooled=%d "
                 "dropped=%d failed=%d undelivered=%d", agent.cycles, st["published"],
                 st["delivered"], st["spooled"], st["dropped"], st["failed"], left)
    return 0
