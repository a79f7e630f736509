"""`failslow up` — start the embedded stack (Tansu broker + database owner) in the background.

Run again after a crash it restarts what died: a dead or hung database owner beside a
live broker is started again; a dead broker (its data died with it) takes the whole stack
down and up again, on the port it had.
"""

from __future__ import annotations

import argparse

from failslow import config, stack
from failslow.embedded import db_owner_problem, restart_db_owner, start_stack, stop_stack

HELP = "start the embedded stack (broker + database) in the background"
DEFAULT_PORT = 9092


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=None,
                        help=f"broker port on 127.0.0.1 (default: the port of the stack "
                        f"recorded in FAILSLOW_HOME, else {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic")


def run(args: argparse.Namespace) -> int:
    settings = config.resolve(args)
    state = stack.running_state(settings.home)
    if state:
        problem = db_owner_problem(state)
        if problem is None:
            print(f"failslow up: already running (broker 127.0.0.1:{state['port']}, "
                  f"pid {state['pid']}, home {settings.home})")
            return 0
        state = restart_db_owner(settings, state)
        print(f"failslow up: {problem}; started it again (pid {state['db_pid']}) beside the "
              f"running broker 127.0.0.1:{state['port']} (pid {state['pid']})")
        return 0
    recorded = config.read_stack_state(settings.home) or {}
    # A stack whose broker died (kill -9, OOM) leaves its sink running, and the sink owns
    # the chdb folder: stop what is left of it, then start a whole stack again, on the same
    # port so that running collectors and workers find the new broker.
    for stopped in stop_stack(settings.home, timeout=10.0):
        print(f"failslow up: the previous broker is gone; stopped the {stopped}")
    port = args.port if args.port is not None else int(recorded.get("port") or DEFAULT_PORT)
    state = start_stack(settings, port=port or None, partitions=args.partitions)
    print(f"failslow up: broker 127.0.0.1:{state['port']} (pid {state['pid']}), "
          f"database {state['clickhouse']}, state in {config.state_path(settings.home)}")
    return 0
