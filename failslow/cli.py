"""The ``failslow`` console script: one subcommand per module under failslow/commands.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their command runs, so
``failslow --help`` stays fast and a broken optional dependency breaks one
command, not all of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from failslow.config import add_connection_flags, flag_sets
from failslow.errors import FailslowError

COMMANDS: dict[str, str] = {
    "demo": "run the whole pipeline on one machine with a simulated cluster",
    "up": "start the embedded stack (broker + database) in the background",
    "down": "stop the embedded stack",
    "collect": "the host agent: GPU/NIC/host samplers and NCCL Inspector tailer -> Kafka",
    "worker": "the stream processors (faust worker)",
    "sink": "Kafka -> ClickHouse writer",
    "notify": "incidents -> Slack / PagerDuty / webhook",
    "replay": "publish JSON Lines traces to the broker in ts order, as the host agents "
              "publish them (one batch message per host and window; --per-rank)",
    "detect": "offline detection over JSON Lines traces; prints incidents (JSON Lines or text)",
    "query": "run SQL against the configured ClickHouse",
    "simulate": "write a simulated trace and its ground truth",
    "report": "one incident or one job as a self-contained HTML page with plots",
    "status": "pipeline health at a glance; exits non-zero when unhealthy",
    "migrate": "apply the ClickHouse schema (idempotent)",
    "run": "run a training command with the hook in every rank, no code change",
}


def _module(name: str):
    return importlib.import_module(f"failslow.commands.{name}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="failslow",
        description="Find fail-slows (stragglers) in large GPU training jobs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            mod = _module(name)
            mod.add_arguments(p)
            add_connection_flags(p, flag_sets(name))
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    process = argv is None           # the process's own command line, not a call in-process
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except FailslowError as exc:
        from failslow.schema.kafka_security import KafkaAuthError
        from failslow.secrets import scrub

        print(f"failslow {args.command}: {scrub(str(exc))}", file=sys.stderr)
        if process and isinstance(exc, KafkaAuthError):
            _leave(2)
        return 2
    except KeyboardInterrupt:
        return 130


def _leave(code: int) -> NoReturn:
    """Exit now, without the interpreter's teardown: after a refused SASL login the
    clients' librdkafka threads are still retrying it and calling back into Python, and a
    callback into an interpreter being torn down killed ``failslow notify`` with SIGSEGV
    after its one line (once in CI). Nothing is left to write: the command has failed."""
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
