"""`failslow report`: one incident (INCIDENT_ID) or one job (--job JOB) as a self-contained
HTML page (inline SVG plots and CSS, no script, nothing fetched when it is opened), read
from the configured ClickHouse. Rendering: storage.report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from failslow.errors import ConfigError

HELP = "one incident or one job as a self-contained HTML page with plots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("incident_id", nargs="?", metavar="INCIDENT_ID",
                        help="the incident to show (its incident_id)")
    parser.add_argument("--job", metavar="JOB", help="show a job instead: its incidents and "
                        "its step times, culprits highlighted")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write the page here [failslow-report-<id>.html in the current "
                        "folder]; - writes it to stdout")


def _default_name(key: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return Path(f"failslow-report-{safe}.html")


def run(args: argparse.Namespace) -> int:
    from failslow.config import clickhouse_url, resolve
    from failslow.storage.client import connect
    from failslow.storage.report import incident_page, job_page

    if bool(args.incident_id) == bool(args.job):
        raise ConfigError("give one INCIDENT_ID or --job JOB")
    client = connect(clickhouse_url(resolve(args)))
    try:
        page = job_page(client, args.job) if args.job else incident_page(client, args.incident_id)
    finally:
        client.close()
    out = args.out or _default_name(f"job-{args.job}" if args.job else args.incident_id)
    if str(out) == "-":
        sys.stdout.write(page)
        return 0
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--out {out}: {exc.strerror or exc}") from None
    print(f"failslow report: wrote {out} ({len(page.encode()) / 1024:.0f} KiB)", file=sys.stderr)
    return 0
