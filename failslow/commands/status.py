"""`failslow status`: pipeline health on one screen, exit 0 when healthy and 1 when not
(usable as a liveness probe); `--format json` for machines. Checks: failslow.health.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

import orjson

HELP = "pipeline health at a glance; exits non-zero when unhealthy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default) or json (one object)")
    parser.add_argument("--timeout", type=float, default=3.0,
                        help="seconds each check may take [3]")
    parser.add_argument("--max-lag-s", type=float, default=60.0,
                        help="unhealthy when a consumer group's oldest unconsumed message is "
                        "older than this [60]")
    parser.add_argument("--worker-group", default="failslow-worker",
                        help="with no worker endpoint, the worker is alive when this consumer "
                        "group has members [failslow-worker]")
    for name in ("worker", "sink", "notify", "collect"):
        parser.add_argument(f"--{name}-metrics", metavar="HOST:PORT",
                            help=f"the {name}'s --metrics-port endpoint (HOST:PORT or URL) "
                            f"[FAILSLOW_{name.upper()}_METRICS]; unset: not checked")


def run(args: argparse.Namespace) -> int:
    import time

    from failslow import health
    from failslow.config import clickhouse_url, read_stack_state, resolve
    from failslow.errors import ConfigError
    from failslow.schema import Topics
    from failslow.stack import pid_alive
    from failslow.storage.url import mask, parse

    if args.timeout <= 0:
        raise ConfigError("--timeout must be positive")
    settings = resolve(args)
    report = health.Report(checked_ts=time.time())
    health.check_kafka(report, settings.bootstrap, Topics(settings.topic_prefix),
                       args.timeout, args.max_lag_s)
    state = read_stack_state(settings.home) or {}
    for name in health.COMPONENTS:
        endpoint = getattr(args, f"{name}_metrics") or os.environ.get(
            f"FAILSLOW_{name.upper()}_METRICS")
        up_sink = name == "sink" and not endpoint and state.get("db_pid")
        if up_sink and not pid_alive(int(state["db_pid"])):
            health.check_pid(report, "sink", int(state["db_pid"]))    # say it died, by name
        elif up_sink and state.get("sink_metrics_port"):
            health.check_component(report, name, health.metrics_url(
                f"127.0.0.1:{state['sink_metrics_port']}"), args.timeout)
        elif up_sink:
            health.check_pid(report, "sink", int(state["db_pid"]))
        elif endpoint:
            health.check_component(report, name, health.metrics_url(endpoint), args.timeout)
        elif name == "worker":
            health.check_worker_group(report, settings.bootstrap, args.worker_group,
                                      args.timeout)
        else:
            report.components.append({"component": name, "endpoint": None, "alive": None})
    url = clickhouse_url(settings)
    parsed = parse(url)
    if parsed.scheme == "chdb" and not Path(parsed.path or "").exists():
        report.clickhouse = {"url": mask(url), "ok": False,
                             "error": f"no chdb folder at {parsed.path}"}
        report.problems.append(f"ClickHouse: no chdb folder at {parsed.path} (failslow up, "
                               "or FAILSLOW_CLICKHOUSE)")
    else:
        health.check_clickhouse(report, url, mask(url))
    if args.format == "json":
        sys.stdout.write(orjson.dumps(report.as_dict(), default=str).decode() + "\n")
    else:
        sys.stdout.write(render(report))
    return 0 if report.healthy else 1


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _age(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.1f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 \
        else f"{s / 3600:.1f} h ago"


def render(r: Any) -> str:
    verdict = "HEALTHY" if r.healthy else "UNHEALTHY"
    lines = [f"failslow status  {_utc(r.checked_ts)} UTC  {verdict}", ""]
    b = r.broker
    if b.get("ok"):
        lines.append(f"broker      {b['bootstrap']}  ok ({b['brokers']} broker(s))")
    else:
        lines.append(f"broker      {b['bootstrap']}  DOWN: {b.get('error', '?')}")
    if r.topics:
        lines.append("topics      partitions  messages  newest message")
        for t in r.topics:
            if not t["exists"]:
                lines.append(f"  {t['topic']:<30} MISSING")
                continue
            lines.append(f"  {t['topic']:<30} {t['partitions']:>3}  {t['messages_end']:>9,}  "
                         f"{_age(t.get('newest_age_s'))}")
    if b.get("ok"):
        lines.append("consumer groups   lag (messages, broker end offsets)  oldest unconsumed")
        if not r.groups:
            lines.append("  none with committed offsets on these topics")
        for g in r.groups:
            if "error" in g:
                lines.append(f"  {g['group']:<28} {g['error']}")
            else:
                oldest = "-" if not g["lag_messages"] else _age(g["oldest_unconsumed_age_s"])
                lines.append(f"  {g['group']:<28} {g['lag_messages']:>9,}  {oldest}")
    lines.append("components")
    for c in r.components:
        if c["alive"] is None and c.get("error"):
            lines.append(f"  {c['component']:<8} ?      {c['endpoint']}: {c['error']}")
        elif c["alive"] is None:
            lines.append(f"  {c['component']:<8} n/a (no endpoint: --{c['component']}-metrics "
                         "HOST:PORT)")
        elif c["alive"]:
            numbers = ", ".join(f"{k} {v:,.0f}" for k, v in c.get("metrics", {}).items())
            lines.append(f"  {c['component']:<8} alive  {c['endpoint']}"
                         + (f"  {numbers}" if numbers else ""))
        else:
            lines.append(f"  {c['component']:<8} DOWN   {c['endpoint']}: "
                         f"{c.get('error', 'not running')}")
    ch = r.clickhouse
    if ch.get("ok"):
        sev = ", ".join(f"{n} {s}" for s, n in sorted(ch["by_severity"].items()))
        lines.append(f"clickhouse  {ch['url']}  ok; open incidents: {ch['open_incidents']}"
                     + (f" ({sev})" if sev else ""))
        for i in ch["top"]:
            who = f"rank {i['rank']}" if i["rank"] is not None else f"host {i['host']}"
            lines.append(f"  {i['severity']:<8} {i['job_id']:<16} {i['fault']:<12} {who:<10} "
                         f"{i['root_cause'] or '-':<15} {i['slowdown_pct']:5.1f} %  since "
                         f"{_utc(i['onset_ts'])}  {i['incident_id']}")
    else:
        lines.append(f"clickhouse  {ch.get('url', '?')}  DOWN: {ch.get('error', '?')}")
    if r.problems:
        lines += ["", "problems:"] + [f"  - {p}" for p in r.problems]
    return "\n".join(lines) + "\n"
