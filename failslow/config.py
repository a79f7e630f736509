"""Settings, resolved in one place: command-line flag > FAILSLOW_* variable > default.

Library code never reads the environment; entry points call ``resolve`` and pass
plain values down. Secrets are kept out of ``__repr__`` so they never reach a log.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

import orjson

DEFAULT_PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
STATE_FILE = "stack.json"


@dataclass(frozen=True)
class Settings:
    home: Path
    bootstrap: str
    topic_prefix: str
    clickhouse: str
    slack_webhook_url: str | None = field(default=None, repr=False)
    pagerduty_routing_key: str | None = field(default=None, repr=False)
    pagerduty_url: str = DEFAULT_PAGERDUTY_URL
    webhook_url: str | None = field(default=None, repr=False)


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every command accepts; each overrides its FAILSLOW_* variable."""
    g = parser.add_argument_group("connection (flags override FAILSLOW_* variables)")
    g.add_argument("--home", help="state of the embedded stack [FAILSLOW_HOME, ~/.failslow]")
    g.add_argument("--bootstrap", help="Kafka bootstrap servers [FAILSLOW_BOOTSTRAP]")
    g.add_argument("--topic-prefix", help="topic prefix [FAILSLOW_TOPIC_PREFIX, failslow.]")
    g.add_argument("--clickhouse", help="clickhouse://user:pw@host:9000/db or chdb:///folder "
                   "[FAILSLOW_CLICKHOUSE]")


def read_stack_state(home: Path) -> dict | None:
    """The embedded stack's state file written by ``failslow up``, or None."""
    try:
        return orjson.loads((home / STATE_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def resolve(args: argparse.Namespace | None = None, env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ) if env is None else env

    def pick(flag: str, var: str) -> str | None:
        value = getattr(args, flag, None) if args is not None else None
        return value if value not in (None, "") else (env.get(var) or None)

    home = Path(pick("home", "FAILSLOW_HOME") or Path.home() / ".failslow").expanduser()
    bootstrap = pick("bootstrap", "FAILSLOW_BOOTSTRAP")
    if bootstrap is None:
        state = read_stack_state(home)
        bootstrap = f"127.0.0.1:{state['port']}" if state else "127.0.0.1:9092"
    clickhouse = pick("clickhouse", "FAILSLOW_CLICKHOUSE") or f"chdb://{home / 'chdb'}"
    return Settings(
        home=home,
        bootstrap=bootstrap,
        topic_prefix=pick("topic_prefix", "FAILSLOW_TOPIC_PREFIX") or "failslow.",
        clickhouse=clickhouse,
        slack_webhook_url=env.get("FAILSLOW_SLACK_WEBHOOK_URL") or None,
        pagerduty_routing_key=env.get("FAILSLOW_PAGERDUTY_ROUTING_KEY") or None,
        pagerduty_url=env.get("FAILSLOW_PAGERDUTY_URL") or DEFAULT_PAGERDUTY_URL,
        webhook_url=env.get("FAILSLOW_WEBHOOK_URL") or None,
    )
