"""`failslow notify` — incidents -> Slack / PagerDuty / webhook (and the console).

Endpoints come from FAILSLOW_SLACK_WEBHOOK_URL, FAILSLOW_PAGERDUTY_ROUTING_KEY,
FAILSLOW_PAGERDUTY_URL and FAILSLOW_WEBHOOK_URL; an unset one is off. Undelivered
notifications wait in ``<state-dir>/notify.sqlite`` (default FAILSLOW_HOME/notify)
and are retried until delivered, across restarts. SIGINT/SIGTERM stop cleanly.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from failslow.alerting import DEFAULT_RATES, DEFAULT_ROUTES, NotifyService, Policy, RateLimit
from failslow.alerting.base import AlertingError
from failslow.alerting.drain import Drainer, run_drains
from failslow.alerting.notifiers import build_notifiers
from failslow.collectors.action_sources import KafkaActionSource
from failslow.config import resolve
from failslow.home import private_home
from failslow.metrics import NOTIFY, add_metrics_flags, serve_metrics
from failslow.schema import Topics
from failslow.streams.config import mitigate_from_env

HELP = "incidents -> Slack / PagerDuty / webhook"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--console", action="store_true",
                        help="also print one line per incident change on stdout")
    parser.add_argument("--state-dir", type=Path,
                        help="outbox and de-duplication state [FAILSLOW_HOME/notify]")
    parser.add_argument("--group", default="failslow-notify", help="Kafka consumer group")
    parser.add_argument("--from", dest="offset_reset", choices=("earliest", "latest"),
                        default="earliest",
                        help="where a new consumer group starts reading incidents [earliest]")
    parser.add_argument("--route", action="append", default=[], metavar="SEVERITY=DEST,...",
                        help="destinations of one severity, e.g. critical=pagerduty,slack "
                        "(repeatable; defaults: " + "; ".join(
                            f"{s}={','.join(d)}" for s, d in DEFAULT_ROUTES.items()) + ")")
    parser.add_argument("--rate", action="append", default=[], metavar="DEST=N/SECONDS",
                        help="rate limit of one destination, e.g. slack=10/60, or DEST=off "
                        "(defaults: " + ", ".join(
                            f"{d}={r.burst}/{r.per_s:g}" for d, r in DEFAULT_RATES.items() if r)
                        + ")")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds one HTTP request may take [5]")
    parser.add_argument("--drain-command", metavar="CMD",
                        help="run CMD once per drain_host action in apply mode ({host}, "
                        "{job_id}, {incident_id}, {reason} substituted; no shell) [the "
                        "drain_command of the FAILSLOW_MITIGATE file; default: none]")
    parser.add_argument("--drain-webhook", metavar="URL",
                        help="POST each drain_host action in apply mode to URL [the "
                        "drain_webhook of the FAILSLOW_MITIGATE file; default: none]")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    add_metrics_flags(parser)


def parse_policy(routes: list[str], rates: list[str]) -> Policy:
    """``--route`` and ``--rate`` values over the defaults; AlertingError on a bad one."""
    route_map = dict(DEFAULT_ROUTES)
    for item in routes:
        severity, sep, dests = item.partition("=")
        if not sep:
            raise AlertingError(f"--route {item!r}: expected SEVERITY=DEST[,DEST...]")
        route_map[severity.strip()] = tuple(d.strip() for d in dests.split(",") if d.strip())
    rate_map = dict(DEFAULT_RATES)
    for item in rates:
        dest, sep, value = item.partition("=")
        if not sep:
            raise AlertingError(f"--rate {item!r}: expected DEST=N/SECONDS or DEST=off")
        rate_map[dest.strip()] = None if value.strip() == "off" else RateLimit.parse(value)
    return Policy(routes=route_map, rates=rate_map)


def _drains(args: argparse.Namespace, settings: Any, stop: threading.Event
            ) -> threading.Thread | None:
    """Issue 32: a thread executing drain_host actions, when a command or webhook is set."""
    policy = mitigate_from_env(os.environ)
    command = args.drain_command or (policy.drain_command if policy else None)
    webhook = args.drain_webhook or (policy.drain_webhook if policy else None)
    if not (command or webhook):
        return None
    source = KafkaActionSource(settings.bootstrap, None,
                               Topics(settings.topic_prefix).for_kind("action"))
    drainer = Drainer(command, webhook, state_file=(args.state_dir or settings.home / "notify")
                      / "drained")

    def loop() -> None:
        try:
            run_drains(source, drainer, stop)
        finally:
            source.close()

    thread = threading.Thread(target=loop, name="failslow-drains", daemon=True)
    thread.start()
    return thread


def run(args: argparse.Namespace) -> int:
    settings = resolve(args)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.timeout <= 0:
        raise AlertingError("--timeout must be positive")
    policy = parse_policy(args.route, args.rate)
    notifiers = build_notifiers(
        slack_webhook_url=settings.slack_webhook_url,
        pagerduty_routing_key=settings.pagerduty_routing_key,
        pagerduty_url=settings.pagerduty_url, webhook_url=settings.webhook_url,
        console=args.console, timeout_s=args.timeout)
    if not args.state_dir:
        private_home(settings.home, create=True)
    service = NotifyService(
        settings.bootstrap, Topics(settings.topic_prefix), notifiers,
        args.state_dir or settings.home / "notify", policy=policy, group_id=args.group,
        offset_reset=args.offset_reset)
    serve_metrics(args, lambda: service.stats, NOTIFY)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    drains = _drains(args, settings, stop)
    print(f"failslow notify: {settings.bootstrap} {settings.topic_prefix}incidents -> "
          f"{', '.join(sorted(notifiers))}", file=sys.stderr)
    service.run(stop)
    if drains is not None:
        drains.join()
    s = service.stats
    print(f"failslow notify: stopped; {s['incidents']} incident event(s), {s['queued']} "
          f"notification(s) queued, {s['delivered']} delivered, {s['rejected']} rejected, "
          f"{s['suppressed']} rate-limited, {s['deadletters']} dead letter(s), "
          f"{s['outbox_pending']} left in the outbox", file=sys.stderr)
    return 0
