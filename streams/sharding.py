"""Where one job's events go when it is cut into shards (issue 16; the plan itself is the
job's: ``models.shard``).

A job of more than ``shard_ranks`` ranks is judged in shards of ``shard_ranks``
consecutive ranks (``models.shard.shard_of``); shard ``k`` of a job lives on partition
``home + k`` (mod N) of the job topic, so faust's round-robin assignment gives a job's
neighbouring shards to different workers, and its incidents go to the same partition
number of the incidents topic (keyed by ``job_id`` as always). A job of at most
``shard_ranks`` ranks is one shard, on its home partition: nothing changes for it.

The route stage finds an event's shard from its ``rank`` alone (``shard_parts``): a
message whose ranks are all below ``shard_ranks`` (every message of a small job) goes
on whole and undecoded, as before; the others are decoded once and cut into one JSON
array per shard (orjson writes the same numbers it read, so each shard decodes exactly
the events the producer sent; a host's columnar batch goes whole to its shard, or cut
into a batch per shard when its ranks straddle two). A host's telemetry goes to the
partitions of the shards holding its ranks (``HostMap``: learned from the step events
routed, and announced by the job stage of each shard).

>>> shard_partition("job0", 1, 8) == (shard_partition("job0", 0, 8) + 1) % 8
True
>>> sorted(shard_parts(b'[{"rank":1},{"rank":5},{"rank":4}]', 4).items())
[(0, b'[{"rank":1}]'), (1, b'[{"rank":5},{"rank":4}]')]
>>> shard_parts(b'[{"rank":1},{"rank":3}]', 4) is None
True
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from failslow.models.shard import SHARD_RANKS, shard_of
from failslow.schema.batches import BATCH_KINDS, ROWS_MAX, is_batch, split_batch
from failslow.streams.routing import HostMap, home_partition
from failslow.streams.rows import has_absent

__all__ = ["SHARD_RANKS", "shard_of", "shard_partition", "shard_parts", "event_shard",
           "prune_foreign_hosts"]

_RANK = re.compile(rb'"rank"\s*:\s*(\d+)')
# a "rank" field that is a number or a list of numbers (a batch's column)
_RANKS = re.compile(rb'"rank"\s*:\s*(\d+|\[\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\])')
_NUMS = re.compile(rb'\d+')


def shard_partition(job_id: str, shard: int, partitions: int) -> int:
    """The partition of the job topic (and of the incidents topic) that holds ``shard``
    of ``job_id``; shard 0 is the job's home partition."""
    return (home_partition(job_id, partitions) + shard) % partitions


def event_shard(ev: Any, shard_ranks: int = SHARD_RANKS) -> int:
    """The shard of a decoded event (0 when it names no valid rank: its errors are the
    home partition's to report)."""
    r = ev.get("rank") if type(ev) is dict else None
    return shard_of(r, shard_ranks) if type(r) is int else 0


def shard_parts(value: bytes, shard_ranks: int = SHARD_RANKS) -> dict[int, bytes] | None:
    """A job message cut per shard: shard -> a JSON array of its events, in their order.
    None when every event is in shard 0 (the message goes on whole, undecoded) or the
    value is not a JSON array (its home partition reports it)."""
    if b'_batch"' in value:
        # a columnar batch (schema.batches) lists its ranks in a column: read without a
        # decode when every "rank" of the value is a number or a list of numbers (issue
        # 31: each host's batch of a small job was decoded here, to go on whole)
        found = _RANKS.findall(value)
        if len(found) == value.count(b'"rank"') and not any(
                int(r) >= shard_ranks for m in found for r in _NUMS.findall(m)):
            return None
    elif not any(int(m) >= shard_ranks for m in _RANK.findall(value)):
        return None
    try:
        items = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if type(items) is not list:
        items = [items]
    parts: dict[int, list[Any]] = {}
    for ev in items:
        if is_batch(ev):
            k = batch_shard(ev, shard_ranks)
            if k is not None:   # one host's ranks: the batch whole, not cut row by row
                parts.setdefault(k, []).append(ev)
                continue
            for k, evs in split_batch(ev, lambda row: event_shard(row, shard_ranks)).items():
                parts.setdefault(k, []).extend(evs)
            continue
        parts.setdefault(event_shard(ev, shard_ranks), []).append(ev)
    if len(parts) == 1 and 0 in parts:
        return None
    return {k: orjson.dumps(evs) for k, evs in parts.items()}


def batch_shard(ev: dict, shard_ranks: int = SHARD_RANKS) -> int | None:
    """The one shard of a batch whose rank column (one int per row, none absent) falls
    in a single shard, read from the column; None sends it to ``split_batch`` (ranks of
    two shards, or a layout to check row by row: a column of another length).
    ``split_batch`` expanded every host's batch into per-rank events to find what its
    column says (issue 31: 13,751 batches, half the route's shard split for a 4,096-rank
    job in 4 shards). A batch malformed otherwise (a field of the wrong type) goes to its
    ranks' shard, not shard 0, whose partition dead-letters it the same way."""
    bk = BATCH_KINDS[ev["kind"]]
    ranks, keys = ev.get("rank"), ev.get(bk.row_key)
    if (type(ranks) is not list or type(keys) is not list or not keys
            or len(ranks) != len(keys) or len(keys) > ROWS_MAX or ev.get("v") != 1
            or has_absent(ev, ("rank",)) or not all(type(r) is int for r in ranks)
            or any(type(v) is list and len(v) != len(keys) for v in ev.values())):
        return None
    lo, hi = shard_of(min(ranks), shard_ranks), shard_of(max(ranks), shard_ranks)
    return lo if lo == hi else None


def prune_foreign_hosts(state: Any, partition: int, hostmap: HostMap, now: float) -> int:
    """Drop from ``state``'s detector the device state of hosts that the host map places on
    other partitions only and that no job of this partition runs on; returns how many.

    At a job's start the route sends a host's telemetry to every partition until it knows
    the host's shard, and each partition keeps that host's device state: a shard of a
    131,072-rank job held every host of the job, a snapshot 4x a lone job's. The state of
    a host placed elsewhere is never read here (a job here that starts on that host
    later gets its samples from its first announcement on, as before), so it goes before
    each snapshot. A detector without ``forget_hosts`` is left alone."""
    det = getattr(state, "detector", None)
    forget = getattr(det, "forget_hosts", None)
    held = getattr(det, "device_hosts", None)
    if forget is None or held is None:
        return 0
    foreign = []
    for host in held():
        homes = hostmap.partitions(host, now)
        if homes and partition not in homes and not state.runs_on(host):
            foreign.append(host)
    return int(forget(foreign)) if foreign else 0
