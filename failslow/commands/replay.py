"""`failslow replay FILE...` — publish JSON Lines traces to the broker in ts order.

Several files (one per rank, as the training hook writes them) are merged by ts, as
`failslow detect` merges them."""

from __future__ import annotations

import argparse
import heapq
import logging
import sys
import time
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path

from failslow.collectors.lifecycle import Shutdown
from failslow.collectors.publisher import Publisher
from failslow.config import resolve
from failslow.errors import FailslowError
from failslow.schema import SchemaError, Topics, decode

HELP = "publish JSON Lines traces to the broker in ts order (--speed)"
REORDER_WINDOW = 100_000  # events held to put a roughly-sorted trace in exact ts order
log = logging.getLogger("failslow.replay")


class ReplayError(FailslowError):
    """The trace cannot be read, or an argument is out of range."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", nargs="+",
                        help="JSON Lines trace (one CONTRACT.md event per line); several files "
                             "(e.g. one per rank) are merged by ts")
    parser.add_argument("--speed", type=float, default=0.0,
                        help="pace: 1 = the trace's own time, 10 = ten times faster, "
                             "0 = as fast as possible (default)")
    parser.add_argument("--batch-events", type=int, default=500,
                        help="most events in one Kafka message (default 500)")


def read_trace(path: Path, bad: list[str]) -> Iterator[dict]:
    """Valid events of a trace in ts order (within REORDER_WINDOW); bad lines go to ``bad``."""
    heap: list[tuple[float, int, dict]] = []
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                for ev in decode(line):
                    heapq.heappush(heap, (float(ev["ts"]), n, ev))
            except SchemaError as exc:
                bad.append(f"{path}:{n}: {exc}")
                continue
            if len(heap) > REORDER_WINDOW:
                yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]


def read_traces(paths: list[Path], bad: list[str]) -> Iterator[dict]:
    """Valid events of several traces, merged in ts order (each put in order first)."""
    if len(paths) == 1:
        return read_trace(paths[0], bad)
    return heapq.merge(*(read_trace(p, bad) for p in paths), key=itemgetter("ts"))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    paths = [Path(f) for f in args.file]
    for path in paths:
        if not path.is_file():
            raise ReplayError(f"{path}: no such file")
    if args.speed < 0:
        raise ReplayError(f"--speed must be >= 0, not {args.speed}")
    settings = resolve(args)
    pub = Publisher(settings.bootstrap, Topics(settings.topic_prefix),
                    batch_events=args.batch_events)
    bad: list[str] = []
    sent = 0
    started = time.monotonic()
    first_ts: float | None = None
    chunk: list[dict] = []
    try:
        with Shutdown() as stop:
            for ev in read_traces(paths, bad):
                if args.speed > 0:
                    first_ts = ev["ts"] if first_ts is None else first_ts
                    due = started + (ev["ts"] - first_ts) / args.speed
                    if due > time.monotonic():
                        if chunk:  # send what is due before sleeping
                            pub.publish(chunk)
                            sent += len(chunk)
                            chunk = []
                        if stop.wait(due - time.monotonic()):
                            break
                chunk.append(ev)
                if len(chunk) >= 5000:
                    pub.publish(chunk)
                    sent += len(chunk)
                    chunk = []
                if stop.requested:
                    break
            if chunk:
                pub.publish(chunk)
                sent += len(chunk)
    finally:
        left = pub.close(timeout=30.0)
    for line in bad[:20]:
        print(f"failslow replay: skipped {line}", file=sys.stderr)
    if len(bad) > 20:
        print(f"failslow replay: ... and {len(bad) - 20} more bad lines", file=sys.stderr)
    st = pub.stats
    print(f"replayed {st['delivered']} of {sent} events to {settings.bootstrap} "
          f"(prefix {settings.topic_prefix}) in {time.monotonic() - started:.1f} s; "
          f"{len(bad)} bad lines, {left} undelivered"
          + (f", {st['too_large']} events too large (sent to the dead-letter topic)"
             if st["too_large"] else ""))
    return 0 if left == 0 and st["failed"] == 0 else 1
