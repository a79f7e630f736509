"""`failslow up` — start the embedded stack (Tansu broker + database owner) in the background."""

from __future__ import annotations

import argparse

from failslow import config, stack
from failslow.embedded import start_stack, stop_stack

HELP = "start the embedded stack (broker + database) in the background"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=9092,
                        help="broker port on 127.0.0.1 (default 9092; 0 picks a free one)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic")


def run(args: argparse.Namespace) -> int:
    settings = config.resolve(args)
    state = stack.running_state(settings.home)
    if state:
        print(f"failslow up: already running (broker 127.0.0.1:{state['port']}, "
              f"pid {state['pid']}, home {settings.home})")
        return 0
    # A stack whose broker died (kill -9, OOM) leaves its sink running, and the sink owns
    # the chdb folder: stop what is left of it, then start a whole stack again.
    for stopped in stop_stack(settings.home, timeout=10.0):
        print(f"failslow up: the previous broker is gone; stopped the {stopped}")
    state = start_stack(settings, port=args.port or None, partitions=args.partitions)
    print(f"failslow up: broker 127.0.0.1:{state['port']} (pid {state['pid']}), "
          f"database {state['clickhouse']}, state in {config.state_path(settings.home)}")
    return 0
