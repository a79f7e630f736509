"""`failslow detect FILE...` — offline detection over JSON Lines traces.

Runs the very same ``models.pipeline.Detector`` the stream workers run, with no
broker or database, wrapped like theirs in the mitigation planner (``offline_detector``:
incidents carry the same ``evidence.action``), and prints every incident event (open /
update / resolved) as one JSON line. Invalid lines are skipped with a one-line warning
on stderr naming the line; a count of them ends the run. A run that read no
valid event at all (an empty input, every line invalid) is an error.

Input order: the detector needs events in ``ts`` order. Like ``failslow replay``,
detect holds back ``REORDER_WINDOW`` events and feeds them in ``ts`` order, so a
trace out of order by less than that (``cat rank*.jsonl`` of a small job, ranks
written by separate processes) gives the same incidents as the same events sorted.
Several FILEs are merged by ``ts`` first (one file per rank, each in rough ``ts``
order, needs no window at all). An event further out of order than the window is an
error: merging it late would judge steps on partial data without a word.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from itertools import chain, islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from failslow.commands.incident_text import IncidentLines
from failslow.commands.replay import REORDER_WINDOW
from failslow.errors import FailslowError
from failslow.models.acting import ActingDetector
from failslow.models.actions import ActionPlanner, MitigationConfig
from failslow.models.pipeline import Detector
from failslow.models.settings import DetectionConfig
from failslow.models.shard import ShardedDetector
from failslow.schema import SchemaError, validate
from failslow.schema.batches import BATCH_KINDS, expand_checked, is_batch, valid, valid_many
from failslow.schema.fast import all_valid

loads = orjson.loads

HELP = "offline detection over JSON Lines traces; prints incidents (JSON Lines or text)"
# Lines per chunk. A decoded event is ~1 KB: a chunk that fits the core's L2 cache
# stays there from decode through validation to the detector; 4096 (4 MB) made
# every pass read it back from L3 (+60% time on a 1,024-rank job).
BATCH = 512
MAX_WARNINGS = 20      # after this many, invalid lines are only counted


class DetectError(FailslowError):
    """The trace cannot be read."""


class OutOfOrderError(DetectError):
    """An event arrived further out of ``ts`` order than the reorder window."""


def check(obj):
    """``schema.validate`` for one orjson-decoded object, fast when it is plainly valid."""
    return obj if all_valid((obj,)) else validate(obj)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE", nargs="+",
        help="JSON Lines trace ('-' for stdin). Several files (e.g. one per rank) are "
             "merged by ts. Events are put in ts order within a window of "
             f"{REORDER_WINDOW:,} events, as `failslow replay` does, so `cat rank*.jsonl` "
             "gives the incidents of the sorted trace; an event further out of order "
             "is an error (exit 2): sort the trace or pass the files separately")
    parser.add_argument("--out", metavar="FILE", help="write incidents here instead of stdout")
    parser.add_argument("--format", choices=("jsonl", "text"), default="jsonl",
                        help="jsonl: every incident event (open, updates, resolved) as one "
                             "JSON line, as it happens [default]; text: at the end, one line "
                             "per incident for people: when, who, why, cost, its id")
    parser.add_argument("--telemetry-delay", type=float, default=1.0, metavar="S",
                        help="seconds device samples may trail the step events (the "
                             "collectors' sampling interval), as `failslow worker` [1]")
    add_config_argument(parser)


CONFIG_ENV = "FAILSLOW_DETECTION_CONFIG"


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``: the detection thresholds (``models.settings.DetectionConfig``);
    shared by `failslow detect`, `failslow worker` and the demo."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="detection thresholds and paging policy, TOML (docs/detection.md: "
                             f"[rules], [policy], [planner], [[override]] per job id); "
                             f"default ${CONFIG_ENV}, else the built-in defaults")


def detection_config(path: str | None) -> DetectionConfig:
    """The tree from ``--config`` (or $FAILSLOW_DETECTION_CONFIG), else the defaults; a bad
    file is a one-line DetectionConfigError."""
    path = path or os.environ.get(CONFIG_ENV) or None
    return DetectionConfig.load(path) if path else DetectionConfig()


@contextmanager
def _fewer_collections():
    """Run no garbage collection while events stream through.

    Decoding makes a container per event and the detector holds thousands of
    them for a step or two (the buffered step and collective events), so at the
    default thresholds a young-generation collection runs every few hundred
    events and keeps re-walking them: up to a fifth of the run. What is alive
    before the run is frozen (never walked again), and so is each chunk decoded and
    each chunk judged (``gc.freeze``: what survived it is never walked again; a
    1,024-rank trace leaves no cyclic garbage to find, and what is frozen is handed
    back to the collector at the end). No collection runs meanwhile (issue 31): at a
    hundredfold threshold the only ones left ran inside a step's judging, whose chunk
    makes more containers than that and keeps them (the job's state: nothing to find),
    15 per 12 steps at 16,384 ranks, 184 young and 12 older at 131,072 (7.2 CPU s).
    The collector runs again afterwards.
    """
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


class Counts:
    """What a run read: valid events and invalid lines."""

    def __init__(self) -> None:
        self.events = 0
        self.bad = 0


def detect_lines(lines, det: Detector, write, warn,
                 window: int = REORDER_WINDOW) -> tuple[int, int, int]:
    """Feed decoded, validated events of one stream of lines to ``det`` in ts order
    (within ``window`` events); ``write(incident)`` each incident; ``warn(line_no,
    reason)`` each invalid line. Returns (events, invalid lines, incidents)."""
    return detect_sources([lines], det, write, lambda _src, no, why: warn(no, why), window)


def detect_sources(sources: list[Iterable], det: Detector, write, warn,
                   window: int = REORDER_WINDOW) -> tuple[int, int, int]:
    """``detect_lines`` over several streams of lines merged by ts; ``warn(source
    index, line_no, reason)``."""
    counts = Counts()
    with _fewer_collections():
        streams = [_frozen(_chunks(src, i, warn, counts)) for i, src in enumerate(sources)]
        if len(streams) == 1:
            chunks = streams[0]
        else:
            merged = heapq.merge(*map(chain.from_iterable, streams), key=_first_ts)
            chunks = iter(lambda: list(islice(merged, BATCH)), [])
        n_inc = 0
        for batch in _rebatch(ordered_chunks(chunks, window), BATCH):
            for inc in det.process_batch(batch):
                if inc["kind"] == "incident":   # not the planner's actions (the worker's
                    write(inc)                  # other topic)
                    n_inc += 1
            gc.freeze()                         # see _fewer_collections
        # A file ends its jobs: their open incidents resolve "job ended" (a stream ends a
        # job once it was silent for the Detector's job_idle_s instead).
        for inc in [*det.flush(), *det.end_jobs()]:
            if inc["kind"] == "incident":
                write(inc)
                n_inc += 1
    return counts.events, counts.bad, n_inc


_ts = itemgetter("ts")
_kind = itemgetter("kind")


def _first_ts(ev: dict) -> float:
    """An event's ts; a batch's first row's (a ``step_batch``'s newest: ``_keyed``)."""
    t = ev["ts"]
    return (t[-1] if ev["kind"] == "step_batch" else t[0]) if type(t) is list else t


def _rows(batch: list) -> int:
    """Events (rows) in a decoded chunk: a columnar batch counts its rows."""
    return len(batch) + sum(len(o[BATCH_KINDS[o["kind"]].row_key]) - 1 for o in batch
                            if o["kind"] in BATCH_KINDS)


def _all_valid(batch: list) -> bool:
    """``all_valid`` of a chunk that may hold columnar batches (``comm_batch``,
    ``gpu_batch``, ``nic_batch``): each batch's columns checked at once
    (``schema.batches.valid``), the batch kept whole; the per-rank events as ever. False:
    a line needs the slow way."""
    try:
        kinds = set(map(_kind, batch))
    except (TypeError, KeyError):        # a line that is no event object
        return False
    if kinds.isdisjoint(BATCH_KINDS):
        return all_valid(batch)
    plain = [o for o in batch if o["kind"] not in BATCH_KINDS]
    batches = [o for o in batch if o["kind"] in BATCH_KINDS]
    # the chunk's batches of a kind checked together (``valid_many``); where that does not
    # pass, each alone as ever
    return all_valid(plain) and (valid_many(batches) or all(map(valid, batches)))


def _chunks(lines, src: int, warn, counts: Counts) -> Iterator[list[dict]]:
    """Valid events of one stream, in its order, a list per ``BATCH`` lines; invalid
    lines warned and counted."""
    it = iter(lines)
    first = 1
    while chunk := list(islice(it, BATCH)):
        try:
            # The common case, a chunk of valid lines, in one comprehension (a
            # blank line fails to decode and sends the chunk the slow way).
            batch = [loads(line) for line in chunk]
            if not _all_valid(batch):
                raise SchemaError("a line needs the full validation")
        except (orjson.JSONDecodeError, SchemaError):
            batch, bad = _line_by_line(chunk, first, lambda no, why: warn(src, no, why))
            counts.bad += bad
        first += len(chunk)
        counts.events += _rows(batch)
        if batch:
            yield batch


def _frozen(chunks: Iterable[list]) -> Iterator[list]:
    """``chunks``, each frozen once decoded (``_fewer_collections``): held for ordering, then
    judged, it is never walked by the collector."""
    for chunk in chunks:
        gc.freeze()
        yield chunk


def _rebatch(chunks: Iterable[list], size: int) -> Iterator[list]:
    """The items of ``chunks`` again, in lists of ``size`` (the last one shorter)."""
    pending: list = []
    for chunk in chunks:
        pending += chunk
        if len(pending) >= size:
            n = len(pending) - len(pending) % size
            for i in range(0, n, size):
                yield pending[i:i + size]
            del pending[:n]
    if pending:
        yield pending


def in_ts_order(events: Iterable[dict], window: int) -> Iterator[dict]:
    """``events`` in (ts, rank, host) order, holding back ``window`` of them (one by one;
    ``ordered_chunks`` does the work)."""
    it = iter(events)
    return chain.from_iterable(ordered_chunks(iter(lambda: list(islice(it, BATCH)), []),
                                              window))


def ordered_chunks(chunks: Iterable[list[dict]], window: int) -> Iterator[list[dict]]:
    """The events of ``chunks`` in (ts, rank, host) order, holding back ``window`` of
    them; yields lists of events.

    Ties in ``ts`` go by rank and host, then input order, so ranks' events that share
    a timestamp come out the same whichever order the ranks' files were read in.
    Sorting the held events now and then (timsort: the input is runs already sorted)
    costs less than a heap operation per event: when a quarter more than the window is
    held, all but the window are handed on. An event's key is made with its chunk's
    (``_keyed``), while the chunk is still in the CPU cache from decoding (a later
    pass over 100,000 held events would read each from memory).
    Raises ``OutOfOrderError`` for an event earlier than one already handed on."""
    held: list[tuple] = []
    last: tuple | None = None          # the key of the last event handed on
    full = window + max(window // 4, 1)   # at most a quarter more held than the window
    seq = 0
    for chunk in chunks:
        keyed = _keyed(chunk, seq)
        seq += len(chunk)
        while keyed:
            piece = keyed[:full - len(held)]
            keyed = keyed[len(piece):]
            if last is not None and min(piece, key=_first)[0] < last:
                _out_of_order(next(ev for key, ev in piece if key < last), last, window)
            held += piece
            if len(held) >= full:
                held.sort(key=_first)
                cut = len(held) - window
                last = held[cut - 1][0]
                yield list(map(_second, held[:cut]))
                del held[:cut]
    if held:
        held.sort(key=_first)
        yield list(map(_second, held))


_first = itemgetter(0)
_second = itemgetter(1)
_AT_LAST = frozenset(kind for kind, bk in BATCH_KINDS.items() if bk.at_last)


def _keyed(chunk: list[dict], seq: int) -> list[tuple]:
    """(key, event) of each event of ``chunk``, the key (ts, rank or -1, host or "",
    seq + position): columns taken by C-level maps and zipped (no Python code per event
    unless a rank or host is missing)."""
    # dict.get mapped over the chunk: ~5x less than a methodcaller's call per event
    ranks = list(map(dict.get, chunk, repeat("rank")))
    ts = list(map(_ts, chunk))
    if list in map(type, ts) or list in map(type, ranks):
        # a columnar batch goes where its first row would go; a step_batch where its newest
        # would (``BatchKind.at_last``)
        kinds = list(map(_kind, chunk))
        ts = [(t[-1] if k in _AT_LAST else t[0]) if type(t) is list and k in BATCH_KINDS
              else t for t, k in zip(ts, kinds, strict=True)]
        ranks = [(r[-1] if k in _AT_LAST else r[0]) if type(r) is list and k in BATCH_KINDS
                 else r for r, k in zip(ranks, kinds, strict=True)]
    if None in ranks:
        ranks = [-1 if r is None else r for r in ranks]
    hosts = list(map(dict.get, chunk, repeat("host")))
    if None in hosts:
        hosts = [h or "" for h in hosts]
    keys = zip(ts, ranks, hosts, range(seq, seq + len(chunk)), strict=True)
    return list(zip(keys, chunk, strict=True))


def _out_of_order(ev: dict, last: tuple, window: int) -> None:
    ts, rank = _first_ts(ev), ev.get("rank")
    rank = rank[0] if type(rank) is list else rank
    raise OutOfOrderError(
        f"event ts {ts:.6f} ({ev['kind']}, rank {rank}) is "
        f"{last[0] - ts:.3f} s earlier than an event already processed, "
        f"more than {window:,} events out of order; sort the trace by ts or "
        "pass each rank's file as its own FILE")


def _line_by_line(chunk: list, first: int, warn) -> tuple[list, int]:
    """Decode a chunk that holds an invalid line or a columnar batch (its rows in its
    place, ``schema.batches``): keep the valid ones, warn the rest."""
    batch, bad = [], 0
    for no, line in enumerate(chunk, first):
        if not line.strip():
            continue
        try:
            obj = loads(line)
            if is_batch(obj):
                if valid(obj):          # whole, its columns checked at once
                    batch.append(obj)
                    continue
                rows, errors = expand_checked(obj)
                batch += rows
                bad += len(errors)
                for why in errors:
                    warn(no, why)
                continue
            batch.append(check(obj))
        except orjson.JSONDecodeError as exc:
            bad += 1
            warn(no, f"not JSON ({exc})")
        except SchemaError as exc:
            bad += 1
            warn(no, str(exc))
    return batch, bad


def offline_detector(telemetry_delay_s: float, config: DetectionConfig) -> Any:
    """The worker's detector: sharded (issue 16), and planning actions with the same
    mitigation policy (issue 32: the config's [mitigate] table, else $FAILSLOW_MITIGATE,
    suggest by default), so detect's incidents carry the worker's ``evidence.action``;
    the actions themselves are not printed."""
    from failslow.streams.config import mitigate_from_env  # confluent-kafka: only here

    det = ShardedDetector(telemetry_delay_s=telemetry_delay_s, config=config)
    policy = MitigationConfig.from_mapping(dict(config.mitigate)) \
        if config.mitigate is not None else mitigate_from_env(os.environ)
    return det if policy is None else ActingDetector(det, ActionPlanner(policy))


def run(args: argparse.Namespace) -> int:
    if args.telemetry_delay < 0:
        raise DetectError("--telemetry-delay must be >= 0")
    files: list[str] = args.file
    if files.count("-") > 1:
        raise DetectError("stdin ('-') can be read once")
    with ExitStack() as stack:
        sources = []
        for name in files:
            if name == "-":
                sources.append(sys.stdin.buffer)
                continue
            try:
                sources.append(stack.enter_context(Path(name).open("rb")))
            except OSError as exc:
                raise DetectError(f"cannot read {name}: {exc.strerror}") from None
        try:
            out = stack.enter_context(Path(args.out).open("wb")) if args.out \
                else sys.stdout.buffer
        except OSError as exc:
            raise DetectError(f"cannot write {args.out}: {exc.strerror}") from None
        warned = 0

        def warn(src: int, no: int, reason: str) -> None:
            nonlocal warned
            warned += 1
            if warned <= MAX_WARNINGS:
                where = f"{files[src]} line {no}" if len(files) > 1 else f"line {no}"
                print(f"failslow detect: {where}: {reason}", file=sys.stderr)

        text = IncidentLines() if args.format == "text" else None

        def write(inc: dict) -> None:
            if text is not None:
                text.add(inc)
                return
            # numpy scalars in evidence (the models compute with numpy) are numbers
            out.write(orjson.dumps(inc, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

        # issue 16: a job larger than models.shard.SHARD_RANKS is judged in shards, as the
        # worker judges it on several partitions
        det = offline_detector(args.telemetry_delay,
                               detection_config(getattr(args, "config", None)))
        try:
            n_events, n_bad, n_inc = detect_sources(sources, det, write, warn, REORDER_WINDOW)
            if text is not None:
                out.write("".join(f"{ln}\n" for ln in text.lines()).encode())
        finally:
            out.flush()
    if n_events == 0:
        what = f"all {n_bad} line(s) invalid" if n_bad else "empty input"
        raise DetectError(f"no valid event read ({what}); nothing to detect")
    tail = f"; {n_bad} invalid line(s) skipped" if n_bad else ""
    if det.errors:
        tail += f"; {det.errors} event(s) the detector failed on ({det.last_error})"
    print(f"failslow detect: {n_events} events, {n_inc} incident events{tail}", file=sys.stderr)
    return 0
