"""`failslow demo` — the main job on one machine with nothing installed."""

from __future__ import annotations

import argparse
import os

from failslow.commands.detect import CONFIG_ENV, add_config_argument, detection_config
from failslow.errors import ConfigError

HELP = "run the whole pipeline on one machine with a simulated cluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speed", type=float, default=3.0,
                        help="play the simulated job this many times faster than real time [3]")
    parser.add_argument("--steps", type=int, default=110, help="training steps to simulate [110]")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed [0]")
    parser.add_argument("--keep-running", action="store_true",
                        help="keep the stack up after the job ends, until Ctrl-C")
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    from failslow.config import resolve
    from failslow.demo import DemoOptions, run_demo

    if args.speed <= 0 or args.steps < 30:
        raise ConfigError("--speed must be > 0 and --steps >= 30")
    settings = resolve(args)
    if args.config:
        detection_config(args.config)            # a bad file: one line, before any start
        # the demo's worker is a child process: it reads the file as `failslow worker` does
        os.environ[CONFIG_ENV] = os.path.abspath(args.config)
    return run_demo(settings, DemoOptions(speed=args.speed, steps=args.steps, seed=args.seed,
                                          keep_running=args.keep_running))
