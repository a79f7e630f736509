"""`failslow down` — stop the embedded stack started by `failslow up`."""

from __future__ import annotations

import argparse

from failslow import config
from failslow.embedded import stop_stack

HELP = "stop the embedded stack"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=15.0,
                        help="seconds to wait for a clean stop before killing")


def run(args: argparse.Namespace) -> int:
    settings = config.resolve(args)
    stopped = stop_stack(settings.home, timeout=args.timeout)
    print("failslow down: " + (", ".join(stopped) + " stopped" if stopped else "nothing running"))
    return 0
