"""Where each event is processed: a job's home partition and the host -> partitions map.

Every job has one *home partition* ``crc32(job_id) % N`` of the internal job topic
(and of the incidents topic: N is the incidents topic's partition count). Step,
comm and collective messages are forwarded there unchanged (raw bytes, no re-encode);
telemetry, keyed by host, is forwarded to the home partitions of the jobs
running on that host, which the job stage learns from step events and
announces on the internal host-map topic.

``crc32 % N`` is also librdkafka's default (``consistent_random``) partitioner,
so incidents keyed by ``job_id`` land on the same partition number either way.

>>> home_partition("job0", 4) == home_partition("job0", 4)
True
>>> job_of_collective_key("team-a/job7/dp3")
'team-a/job7'
"""

from __future__ import annotations

import re
import zlib

import orjson

from failslow.schema.limits import MESSAGE_MAX_BYTES, split_value  # noqa: F401


def home_partition(job_id: str, partitions: int) -> int:
    """The partition (0..N-1) on which all of ``job_id``'s events meet."""
    return zlib.crc32(job_id.encode()) % partitions


# The lead of a value whose first event starts with "v" and "kind", as every failslow
# producer writes it (orjson keeps insertion order): `{"v":1,"kind":"comm"` or `[{...`.
_LEAD_KIND = re.compile(rb'\s*\[?\s*\{\s*"v"\s*:\s*1\s*,\s*"kind"\s*:\s*"(\w+)"')


def lead_kind(value: bytes) -> str | None:
    """The kind of a message's first event when the value leads with ``v`` and ``kind``
    (no decode); None otherwise (the caller decodes).

    >>> lead_kind(b'[{"v":1,"kind":"comm","ts":1.0}]'), lead_kind(b'{"ts":1,"v":1}')
    ('comm', None)
    """
    m = _LEAD_KIND.match(value)
    return m.group(1).decode() if m else None


def job_of_key(key: str, value: bytes) -> str | None:
    """``job_id`` of a job message (steps or collectives topic) from its key, which is
    ``job_id/group`` for ``collective`` events and ``job_id`` for ``comm`` and ``step``:
    the two kinds of the collectives topic are told apart by the value's lead. None when
    the key is empty or the lead is not known: the caller reads the value.

    >>> job_of_key("team/j7", b'[{"v":1,"kind":"comm"}]'), job_of_key("team/j7/dp0", b'{"v":1,"kind":"collective"}')
    ('team/j7', 'team/j7')
    """
    kind = lead_kind(value)
    if kind == "collective":
        return job_of_collective_key(key) or None
    if kind in _JOB_KEYED:
        return key or None
    return None


# Kinds keyed by their ``job_id`` alone (schema.topics.key_for). A host's ``comm_batch``
# is one of them (issue 31): read as unknown, every batch of the collectives topic was
# decoded and expanded in the route stage to find a job its key already named, a third
# of the worker's extra CPU over `failslow detect` at 1,024 ranks.
_JOB_KEYED = frozenset(("comm", "step", "comm_batch", "step_batch"))


def job_of_collective_key(key: str) -> str:
    """``job_id`` from a collectives key ``job_id/group``.

    Group names (``dp3``, ``pp1-2``) carry no ``/``; job ids may, so split at the last one.
    """
    return key.rpartition("/")[0]


# The largest input value forwarded as one part: the limit every stage shares
# (schema/limits.py); a larger value is cut by split_value or dead-lettered whole.
PART_MAX_BYTES = MESSAGE_MAX_BYTES


HOSTMAP_TTL_S = 300.0


class HostMap:
    """host -> {home partition: last time announced (wall s)}, forgetting silent entries.

    A job stage re-announces its hosts every ``ttl_s / 3``, so an entry that has
    not been refreshed for ``ttl_s`` belongs to a job that ended or moved.
    """

    def __init__(self, ttl_s: float = HOSTMAP_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._hosts: dict[str, dict[int, float]] = {}

    def add(self, host: str, partition: int, now: float) -> None:
        self._hosts.setdefault(host, {})[partition] = now

    def partitions(self, host: str, now: float) -> list[int]:
        parts = self._hosts.get(host)
        if not parts:
            return []
        # a copy in one call: the job stage's judge thread reads while the route adds
        live = [p for p, seen in list(parts.items()) if now - seen <= self.ttl_s]
        if len(live) != len(parts):
            self._hosts[host] = {p: parts[p] for p in live}
        return live

    def __len__(self) -> int:
        return len(self._hosts)


PLACED = 2   # a part's flags: 1 report its bad records, 2 its host was placed there


def pack(parts: list[tuple]) -> bytes:
    """Many input messages bound for one home partition as one internal message.

    A part is (source topic, its Kafka timestamp in s, report bad records?, key, value)
    and optionally placed? (telemetry sent to the partitions its host is placed on, not
    to every partition: issue 16). Layout: 4-byte big-endian header length, a JSON header
    with one ``[topic, ts, flags, key, length]`` per part (flags: 1 report, 2 placed),
    then the values back to back (raw: nothing is decoded or re-encoded on the way).

    >>> unpack(pack([("t", 1.5, True, b"k", b"[1]", True)]))
    [('t', 1.5, True, b'k', b'[1]', True)]
    """
    head = orjson.dumps([[p[0], p[1], int(p[2]) | (PLACED if p[5:6] == (True,) else 0),
                          p[3].decode("utf-8", "replace") if p[3] is not None else None,
                          len(p[4])] for p in parts])
    return b"".join([len(head).to_bytes(4, "big"), head, *(p[4] for p in parts)])


def unpack(data: bytes) -> list[tuple[str, float, bool, bytes | None, bytes, bool]]:
    """The parts of a ``pack``ed message: (topic, ts, report, key, value, placed)."""
    n = int.from_bytes(data[:4], "big")
    pos = 4 + n
    out = []
    for t, ts, flags, k, length in orjson.loads(data[4:pos]):
        out.append((t, ts, bool(flags & 1), k.encode() if k is not None else None,
                    data[pos:pos + length], bool(flags & PLACED)))
        pos += length
    return out
