"""`failslow detect FILE` — offline detection over a JSON Lines trace.

Runs the very same ``models.pipeline.Detector`` the stream workers run, with no
broker or database, and prints every incident event (open / update /
resolved) as one JSON line. Invalid lines are skipped with a one-line warning
on stderr naming the line; a count of them ends the run.
"""

from __future__ import annotations

import argparse
import gc
import sys
from contextlib import contextmanager
from itertools import islice
from pathlib import Path

import orjson

from failslow.errors import FailslowError
from models.pipeline import Detector
from schema import SchemaError, validate
from schema.fast import all_valid

loads = orjson.loads

HELP = "offline detection over a JSON Lines trace; prints incidents as JSON Lines"
# Lines per chunk. A decoded event is ~1 KB: a chunk that fits the core's L2 cache
# stays there from decode through validation to the detector; 4096 (4 MB) made
# every pass read it back from L3 (+60% time on a 1,024-rank job).
BATCH = 512
MAX_WARNINGS = 20      # after this many, invalid lines are only counted


class DetectError(FailslowError):
    """The trace cannot be read."""


def check(obj):
    """``schema.validate`` for one orjson-decoded object, fast when it is plainly valid."""
    return obj if all_valid((obj,)) else validate(obj)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="JSON Lines trace ('-' for stdin)")
    parser.add_argument("--out", metavar="FILE", help="write incidents here instead of stdout")
    parser.add_argument("--telemetry-delay", type=float, default=1.0, metavar="S",
                        help="seconds device samples may trail the step events (the "
                             "collectors' sampling interval), as `failslow worker` [1]")


@contextmanager
def _fewer_collections():
    """Run the garbage collector less often while events stream through.

    Decoding makes a container per event and the detector holds thousands of
    them for a step or two (the buffered step and collective events), so at the
    default thresholds a young-generation collection runs every few hundred
    events and keeps re-walking them: up to a fifth of the run. What is alive
    before the run is frozen (never walked again) and young collections run a
    hundred times less often; the settings are restored afterwards.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], 1) * 100, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def detect_lines(lines, det: Detector, write, warn) -> tuple[int, int, int]:
    """Feed decoded, validated events to ``det`` in batches; ``write(incident)`` each
    incident; ``warn(line_no, reason)`` each invalid line. Returns
    (events, invalid lines, incidents)."""
    with _fewer_collections():
        return _detect_lines(lines, det, write, warn)


def _detect_lines(lines, det: Detector, write, warn) -> tuple[int, int, int]:
    it = iter(lines)
    n_events = n_bad = n_inc = 0
    first = 1
    while chunk := list(islice(it, BATCH)):
        try:
            # The common case, a chunk of valid lines, in one comprehension (a
            # blank line fails to decode and sends the chunk the slow way).
            batch = [loads(line) for line in chunk]
            if not all_valid(batch):
                raise SchemaError("a line needs the full validation")
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
    if args.telemetry_delay < 0:
        raise DetectError("--telemetry-delay must be >= 0")
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

    det = Detector(telemetry_delay_s=args.telemetry_delay)
    try:
        n_events, n_bad, n_inc = detect_lines(src, det, write, warn)
    finally:
        if src is not sys.stdin.buffer:
            src.close()
        out.flush()
        if args.out:
            out.close()
    tail = f"; {n_bad} invalid line(s) skipped" if n_bad else ""
    if det.errors:
        tail += f"; {det.errors} event(s) the detector failed on ({det.last_error})"
    print(f"failslow detect: {n_events} events, {n_inc} incident events{tail}", file=sys.stderr)
    return 0
