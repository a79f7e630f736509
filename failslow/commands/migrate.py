"""`failslow migrate`: apply the ClickHouse schema (idempotent; run it as often as you like)."""

from __future__ import annotations

import argparse

HELP = "apply the ClickHouse schema (idempotent)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ttl-days", type=int, default=None,
                        help="keep raw rows this many days after arrival (default 30; "
                             "changes existing tables too)")
    parser.add_argument("--rollup-ttl-days", type=int, default=None,
                        help="keep the 1-minute step rollup this many days (default 365; "
                             "used when the rollup is created)")


def run(args: argparse.Namespace) -> int:
    from failslow.config import clickhouse_url, resolve
    from failslow.storage.client import connect
    from failslow.storage.migrations import migrate

    settings = resolve(args)
    client = connect(clickhouse_url(settings))
    try:
        versions = migrate(client, ttl_days=args.ttl_days, rollup_ttl_days=args.rollup_ttl_days)
    finally:
        client.close()
    done = ", ".join(map(str, versions)) if versions else "none (schema up to date)"
    print(f"failslow migrate: database {client.database}: applied migrations {done}")
    return 0
