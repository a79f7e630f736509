"""`failslow query` — not built yet."""

import argparse
import sys

HELP = "not built yet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def run(args: argparse.Namespace) -> int:
    print("failslow query: not built yet (its issue is still open)", file=sys.stderr)
    return 2
