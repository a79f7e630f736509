"""`failslow replay FILE...` — publish JSON Lines traces to the broker in ts order.

Several files (one per rank, as the training hook writes them) are merged by ts, as
`failslow detect` merges them. What goes on the wire is what the host agents publish
(docs/contract.md "Batch kinds"): a trace's per-rank ``comm`` windows, ``step`` events and
``gpu`` / ``nic`` samples are gathered per host and window as
``schema.batches.batch_trace`` gathers them (the boundaries `failslow simulate` writes)
and each batch is its own message, on the topic and key of its kind; batches already in
the trace go as they are; other events (collectives, host samples) go as before. ``--per-rank`` publishes every event on its own
instead (batches in the trace expanded), as a job without a host agent does."""

from __future__ import annotations

import argparse
import heapq
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from failslow.collectors.lifecycle import Shutdown
from failslow.collectors.publisher import Publisher
from failslow.config import resolve
from failslow.errors import FailslowError
from failslow.schema import SchemaError, Topics, decode, validate
from failslow.schema.batches import BATCH_KINDS, is_batch, valid
from failslow.schema.fast import all_valid
from failslow.schema.topics import KIND_TOPIC, key_for

HELP = ("publish JSON Lines traces to the broker in ts order, as the host agents publish them "
        "(one batch message per host and window; --per-rank)")
REORDER_WINDOW = 100_000  # events held to put a roughly-sorted trace in exact ts order
CHUNK_LINES = 1024        # lines validated at once (schema.fast) when all are plainly valid
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
                        help="most per-rank events in one Kafka message (default 500; a "
                             "batch is always a message of its own)")
    parser.add_argument("--per-rank", action="store_true",
                        help="publish every event on its own, batches in the trace expanded "
                             "into their per-rank events, as a job without a host agent does "
                             "(default: one comm_batch / step_batch / gpu_batch / nic_batch "
                             "message per host and window, as the host agents publish; "
                             "docs/contract.md 'Batch kinds')")


def order_ts(ev: dict) -> float:
    """Where an event goes in ts order, as `failslow detect` orders a trace: a batch at its
    first row, a ``step_batch`` at its newest (``BatchKind.at_last``)."""
    t = ev["ts"]
    if type(t) is list:
        return float(t[-1] if BATCH_KINDS[ev["kind"]].at_last else t[0])
    return float(t)


def sent_ts(ev: dict) -> float:
    """When a producer sends an event: a batch once its newest row is in."""
    t = ev["ts"]
    return float(max(t)) if type(t) is list else float(t)


def rows(ev: dict) -> int:
    """The per-rank events an event stands for (a batch: its rows)."""
    bk = BATCH_KINDS.get(ev["kind"])
    return 1 if bk is None else len(ev[bk.row_key])


def _line_events(line: bytes, keep_batches: bool) -> list[dict]:
    """The valid events of one line (``decode``); a valid batch whole with ``keep_batches``.
    Raises ``SchemaError`` (one line) for a bad line."""
    if not keep_batches:
        return decode(line)
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return decode(line)             # its own one-line error
    if type(obj) is dict:
        if not is_batch(obj):
            return [validate(obj)]
        if valid(obj):
            return [obj]
    return decode(line)                 # an array, or a batch to expand (or name what is wrong)


def read_trace(path: Path, bad: list[str], keep_batches: bool = False) -> Iterator[dict]:
    """Valid events of a trace in ts order (within REORDER_WINDOW); bad lines go to ``bad``.
    ``keep_batches``: a valid batch stays whole (``order_ts``), else it is expanded."""
    heap: list[tuple[float, int, dict]] = []
    seq = 0
    n = 0
    with path.open("rb") as f:
        while chunk := list(islice(f, CHUNK_LINES)):
            events = _chunk_events(chunk, keep_batches)
            if events is None:          # a blank, bad or many-event line: line by line
                events = []
                for no, line in enumerate(chunk, n + 1):
                    if not line.strip():
                        continue
                    try:
                        events += _line_events(line, keep_batches)
                    except SchemaError as exc:
                        bad.append(f"{path}:{no}: {exc}")
            n += len(chunk)
            for ev in events:
                seq += 1
                heapq.heappush(heap, (order_ts(ev), seq, ev))
            while len(heap) > REORDER_WINDOW:
                yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]


def _chunk_events(chunk: list[bytes], keep_batches: bool) -> list[dict] | None:
    """The events of a chunk of lines when each line is one plainly valid event (a batch
    whole, with ``keep_batches``), checked at once (``schema.fast``); None sends the chunk
    line by line (``_line_events``), which names what is wrong."""
    try:
        objs = [orjson.loads(line) for line in chunk]
    except orjson.JSONDecodeError:
        return None
    batches = [o for o in objs if is_batch(o)]
    if not batches:
        return objs if all_valid(objs) else None
    if not keep_batches or not all(map(valid, batches)):
        return None
    return objs if all_valid([o for o in objs if not is_batch(o)]) else None


def read_traces(paths: list[Path], bad: list[str], keep_batches: bool = False) -> Iterator[dict]:
    """Valid events of several traces, merged in ts order (each put in order first)."""
    if len(paths) == 1:
        return read_trace(paths[0], bad, keep_batches)
    return heapq.merge(*(read_trace(p, bad, keep_batches) for p in paths), key=order_ts)


def as_agents_publish(events: Iterable[dict]) -> Iterator[dict]:
    """Events in ts order as the host agents publish them: per-rank windows, steps and
    samples gathered per host and window, batches already made and the other kinds as
    they are. ``simulator.batching.batch_events``: exactly ``schema.batches.batch_trace``'s
    batches (the agent's linger, the boundaries `failslow simulate` writes), at a cost per
    event that does not grow with the number of hosts (``batch_trace`` walks every open
    group on every event)."""
    from failslow.simulator.batching import batch_events  # numpy: not for --per-rank

    return batch_events(events)


def publish_messages(pub: Any, events: list[dict]) -> None:
    """``events`` to ``pub`` as the host agents send them: each batch a message of its own
    (one per host and window), the per-rank events between them packed per topic and key
    as ``Publisher.publish`` does; the order on each topic and key kept."""
    runs: dict[tuple[str, str], list[dict]] = {}   # (topic, key) -> its open run
    parts: list[list[dict]] = []
    for ev in events:
        where = (KIND_TOPIC[ev["kind"]], key_for(ev))
        if ev["kind"] in BATCH_KINDS:
            parts.append([ev])
            runs.pop(where, None)       # what comes after it on its topic and key: a new run
            continue
        run = runs.get(where)
        if run is None:
            runs[where] = run = []
            parts.append(run)
        run.append(ev)
    for part in parts:
        pub.publish(part)


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
    batched = not args.per_rank
    counts = {"sent": 0, "rows": 0, "batches": 0}
    started = time.monotonic()
    first_ts: float | None = None
    chunk: list[dict] = []

    def send() -> None:
        if batched:
            publish_messages(pub, chunk)
            counts["rows"] += sum(map(rows, chunk))
            counts["batches"] += sum(ev["kind"] in BATCH_KINDS for ev in chunk)
        else:
            pub.publish(chunk)
            counts["rows"] += len(chunk)
        counts["sent"] += len(chunk)
        chunk.clear()

    try:
        with Shutdown() as stop:
            events = read_traces(paths, bad, keep_batches=batched)
            for ev in as_agents_publish(events) if batched else events:
                if args.speed > 0:
                    # a batch goes once its newest row is in, as the agent sends it
                    ts = sent_ts(ev)
                    first_ts = ts if first_ts is None else first_ts
                    due = started + (ts - first_ts) / args.speed
                    if due > time.monotonic():
                        if chunk:  # send what is due before sleeping
                            send()
                        if stop.wait(due - time.monotonic()):
                            break
                chunk.append(ev)
                if len(chunk) >= 5000:
                    send()
                if stop.requested:
                    break
            if chunk:
                send()
    finally:
        left = pub.close(timeout=30.0)
    for line in bad[:20]:
        print(f"failslow replay: skipped {line}", file=sys.stderr)
    if len(bad) > 20:
        print(f"failslow replay: ... and {len(bad) - 20} more bad lines", file=sys.stderr)
    st = pub.stats
    sent = counts["sent"]
    what = f"{st['delivered']} of {sent} events"
    if batched:
        # a batch is one item of a message: all delivered, all its rows were
        shape = f"{counts['batches']} batches and {sent - counts['batches']} single events"
        what = (f"{counts['rows']} of {counts['rows']} events as {shape}"
                if st["delivered"] == sent else
                f"{st['delivered']} of {sent} items ({counts['rows']} events as {shape})")
    print(f"replayed {what} to {settings.bootstrap} "
          f"(prefix {settings.topic_prefix}) in {time.monotonic() - started:.1f} s; "
          f"{len(bad)} bad lines, {left} undelivered"
          + (f", {st['too_large']} events too large (sent to the dead-letter topic)"
             if st["too_large"] else ""))
    return 0 if left == 0 and st["failed"] == 0 else 1
