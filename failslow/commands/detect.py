"""`failslow detect FILE` — offline detection over a JSON Lines trace.

Runs the very same ``models.pipeline.Detector`` the stream workers run, with no
broker or database, and prints every incident event (open / update /
resolved) as one JSON line. Invalid lines are skipped with a one-line warning
on stderr naming the line; a count of them ends the run.
"""

from __future__ import annotations

import argparse
import sys
from itertools import islice
from pathlib import Path

import orjson

from failslow.errors import FailslowError
from models.pipeline import Detector
from schema import SchemaError, validate
from schema.events import SPECS

loads = orjson.loads

HELP = "offline detection over a JSON Lines trace; prints incidents as JSON Lines"
BATCH = 4096
MAX_WARNINGS = 20      # after this many, invalid lines are only counted


class DetectError(FailslowError):
    """The trace cannot be read."""


def _compile(kind: str):
    """A predicate that is True when an event of ``kind`` certainly passes
    ``schema.validate``: one generated function with the SPECS table inlined
    (the way dataclasses builds ``__init__``), no per-field calls. None when a
    field type is not one it knows."""
    required, optional = SPECS[kind]
    lines = ["def ok(o):", " g = o.get"]
    for names, opt in ((required, False), (optional, True)):
        for name, ftype in names.items():
            lines.append(f" v = g({name!r})")
            skip = "v is not None and " if opt else ""
            if ftype == "num":
                lines.append(f" if {skip}not ((type(v) is float and v - v == 0.0)"
                             " or type(v) is int): return False")
            elif ftype in ("int", "str"):
                lines.append(f" if {skip}type(v) is not {ftype}: return False")
            elif ftype == "ints":
                lines.append(f" if {skip}(type(v) is not list"
                             " or any(type(x) is not int for x in v)): return False")
            elif ftype == "obj":
                lines.append(f" if {skip}type(v) is not dict: return False")
            elif isinstance(ftype, tuple):
                lines.append(f" if {skip}v not in {ftype!r}: return False")
            else:
                return None
    lines.append(" return True")
    scope: dict = {}
    exec("\n".join(lines), scope)  # noqa: S102 - code built from the SPECS table only
    return scope["ok"]


# Every kind gets a check compiled from schema.events.SPECS (the same table);
# anything it does not clearly accept goes to schema.validate, which accepts it
# or names the offending field. Integers need no range check here: orjson
# decodes only integers that fit 64 bits.
FAST = {kind: _compile(kind) for kind in SPECS}


def check(obj):
    """``schema.validate`` with a fast path for events that are plainly valid."""
    if type(obj) is dict and obj.get("v") == 1:
        ok = FAST.get(obj.get("kind"))
        if ok is not None and ok(obj):
            return obj
    return validate(obj)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="JSON Lines trace ('-' for stdin)")
    parser.add_argument("--out", metavar="FILE", help="write incidents here instead of stdout")


def detect_lines(lines, det: Detector, write, warn) -> tuple[int, int, int]:
    """Feed decoded, validated events to ``det`` in batches; ``write(incident)`` each
    incident; ``warn(line_no, reason)`` each invalid line. Returns
    (events, invalid lines, incidents)."""
    it = iter(lines)
    n_events = n_bad = n_inc = 0
    first = 1
    while chunk := list(islice(it, BATCH)):
        try:
            # The common case, a chunk of valid lines, in one comprehension.
            batch = [check(loads(line)) for line in chunk if line.strip()]
        except (orjson.JSONDecodeError, SchemaError):
            batch, bad = _line_by_line(chunk, first, warn)
            n_bad += bad
        first += len(chunk)
        n_events += len(batch)
        for inc in det.process_batch(batch):
            write(inc)
            n_inc += 1
    for inc in det.flush():
        write(inc)
        n_inc += 1
    return n_events, n_bad, n_inc


def _line_by_line(chunk: list, first: int, warn) -> tuple[list, int]:
    """Decode a chunk that holds an invalid line: keep the valid ones, warn the rest."""
    batch, bad = [], 0
    for no, line in enumerate(chunk, first):
        if not line.strip():
            continue
        try:
            batch.append(check(loads(line)))
        except orjson.JSONDecodeError as exc:
            bad += 1
            warn(no, f"not JSON ({exc})")
        except SchemaError as exc:
            bad += 1
            warn(no, str(exc))
    return batch, bad


def run(args: argparse.Namespace) -> int:
    if args.file == "-":
        src = sys.stdin.buffer
    else:
        try:
            src = Path(args.file).open("rb")
        except OSError as exc:
            raise DetectError(f"cannot read {args.file}: {exc.strerror}") from None
    try:
        out = Path(args.out).open("wb") if args.out else sys.stdout.buffer
    except OSError as exc:
        raise DetectError(f"cannot write {args.out}: {exc.strerror}") from None
    warned = 0

    def warn(no: int, reason: str) -> None:
        nonlocal warned
        warned += 1
        if warned <= MAX_WARNINGS:
            print(f"failslow detect: line {no}: {reason}", file=sys.stderr)

    def write(inc: dict) -> None:
        out.write(orjson.dumps(inc) + b"\n")

    try:
        n_events, n_bad, n_inc = detect_lines(src, Detector(), write, warn)
    finally:
        if src is not sys.stdin.buffer:
            src.close()
        out.flush()
        if args.out:
            out.close()
    tail = f"; {n_bad} invalid line(s) skipped" if n_bad else ""
    print(f"failslow detect: {n_events} events, {n_inc} incident events{tail}", file=sys.stderr)
    return 0
