"""A bounded on-disk FIFO of Kafka messages, kept while the broker is unreachable.

Records live in append-only segment files (``000000000001.seg``, ...); each
record is ``[u32 length][u32 crc32][u32 events][u16 topic len][u16 key len]
topic key value``. The read position (segment, byte offset) is persisted in
``head`` after every commit, so a restarted collector resumes where the last
one stopped and replays what was not yet acknowledged, in order.

When the spool holds more than ``max_bytes``, whole segments are dropped from
the oldest end and their events are counted in ``dropped``: under a long
outage the newest samples are the ones worth keeping. A torn record at the end
of a segment (a crash mid-write) is skipped.

``fsync`` says when appended records are forced to the disk: ``always`` (after every
record: nothing acknowledged to the caller is lost to a power failure, at the cost of
one disk sync per message), ``interval`` (the default: at most every ``fsync_interval_s``,
so a power failure loses at most that much of an outage's samples; a process crash
loses nothing, the data is in the page cache), ``never`` (left to the OS). The cost of
each on this machine is printed by ``bench/spool_fsync.py``.

>>> import tempfile
>>> s = Spool(tempfile.mkdtemp())
>>> s.append("t", "k", b"[1]", 1)
0
>>> [r.value for r in s.peek(10)]
[b'[1]']
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_HEADER = struct.Struct(">IIIHH")  # length of the rest, crc32 of the rest, events, topic, key
_HEAD_FILE = "head"
FSYNC_POLICIES = ("always", "interval", "never")


@dataclass(frozen=True, slots=True)
class Record:
    """One spooled message; ``pos`` = (segment number, byte offset) identifies it."""

    pos: tuple[int, int]
    end: int
    topic: str
    key: str
    value: bytes
    events: int


@dataclass
class _Segment:
    number: int
    path: Path
    size: int = 0
    records: int = 0
    events: int = 0


class Spool:
    """Bounded FIFO of messages on disk; ``max_bytes`` caps its size (oldest dropped first)."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = 256 << 20,
                 segment_bytes: int = 4 << 20, fsync: str = "interval",
                 fsync_interval_s: float = 1.0) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"spool fsync policy {fsync!r} is not one of "
                             f"{', '.join(FSYNC_POLICIES)}")
        self.fsync = fsync
        self.fsync_interval_s = fsync_interval_s
        self._synced = time.monotonic()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = max(4096, min(segment_bytes, max_bytes // 4))
        self.dropped_events = 0
        self.dropped_records = 0
        self._segments: list[_Segment] = []
        self._head: tuple[int, int] = (0, 0)
        self._tail_file: BinaryIO | None = None
        self._load()

    # -- state -------------------------------------------------------------------------------

    def _load(self) -> None:
        for path in sorted(self.directory.glob("*.seg")):
            seg = _Segment(int(path.stem), path)
            for rec in self._scan(seg, 0):
                seg.records += 1
                seg.events += rec.events
                seg.size = rec.end
            self._segments.append(seg)
        try:
            number, offset = (int(x) for x in (self.directory / _HEAD_FILE).read_text().split())
        except (FileNotFoundError, ValueError):
            number, offset = (self._segments[0].number, 0) if self._segments else (0, 0)
        for seg in [s for s in self._segments if s.number < number]:
            self._remove(seg)  # fully delivered before the last stop
        self._segments = [s for s in self._segments if s.number >= number]
        if self._segments and self._segments[0].number == number:
            seg = self._segments[0]
            for rec in self._scan(seg, 0):  # records before the head were already delivered
                if rec.end > offset:
                    break
                seg.records -= 1
                seg.events -= rec.events
        elif self._segments:
            number, offset = self._segments[0].number, 0
        self._head = (number, offset)

    def _scan(self, seg: _Segment, offset: int, limit: int | None = None):
        try:
            data = seg.path.read_bytes()
        except FileNotFoundError:
            return
        n = 0
        while offset + _HEADER.size <= len(data) and (limit is None or n < limit):
            length, crc, events, tlen, klen = _HEADER.unpack_from(data, offset)
            body_start = offset + 8
            end = body_start + length
            if end > len(data) or zlib.crc32(data[body_start:end]) != crc:
                return  # a torn write at the end: nothing valid follows
            p = offset + _HEADER.size
            topic = data[p:p + tlen].decode()
            key = data[p + tlen:p + tlen + klen].decode()
            value = data[p + tlen + klen:end]
            yield Record((seg.number, offset), end, topic, key, value, events)
            offset = end
            n += 1

    @property
    def records(self) -> int:
        return sum(s.records for s in self._segments)

    @property
    def events(self) -> int:
        return sum(s.events for s in self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def __len__(self) -> int:
        return self.records

    # -- writing -----------------------------------------------------------------------------

    def append(self, topic: str, key: str, value: bytes, events: int) -> int:
        """Append one message; returns the number of events dropped to stay under max_bytes."""
        t, k = topic.encode(), key.encode()
        body = struct.pack(">IHH", events, len(t), len(k)) + t + k + value
        record = struct.pack(">II", len(body), zlib.crc32(body)) + body
        tail = self._segments[-1] if self._segments else None
        try:
            if tail is None or self._tail_file is None or \
                    tail.size + len(record) > self.segment_bytes:
                tail = self._new_segment()
            assert self._tail_file is not None
            self._tail_file.write(record)
            self._tail_file.flush()
            self._sync(self._tail_file)
        except OSError:
            # Full disk, a folder gone read-only: drop this file handle (its buffer holds
            # the failed write) so the next append starts a new segment; a torn record
            # left on disk fails its CRC and is skipped.
            self._discard_tail()
            raise
        tail.size += len(record)
        tail.records += 1
        tail.events += events
        return self._enforce_bound()

    def _discard_tail(self) -> None:
        f, self._tail_file = self._tail_file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass

    def _sync(self, f: BinaryIO) -> None:
        if self.fsync == "never":
            return
        now = time.monotonic()
        if self.fsync == "always" or now - self._synced >= self.fsync_interval_s:
            os.fsync(f.fileno())
            self._synced = now

    def _new_segment(self) -> _Segment:
        if self._tail_file is not None:
            self._tail_file.close()
        number = self._segments[-1].number + 1 if self._segments else self._head[0] + 1
        seg = _Segment(number, self.directory / f"{number:012d}.seg")
        self._tail_file = open(seg.path, "ab")  # noqa: SIM115 - kept open while it is the tail
        if not self._segments:
            self._set_head((number, 0))
        self._segments.append(seg)
        return seg

    def _enforce_bound(self) -> int:
        dropped = 0
        while self.size_bytes > self.max_bytes and len(self._segments) > 1:
            seg = self._segments.pop(0)
            dropped += seg.events
            self.dropped_records += seg.records
            self._remove(seg)
            self._set_head((self._segments[0].number, 0))
        self.dropped_events += dropped
        return dropped

    def _remove(self, seg: _Segment) -> None:
        try:
            seg.path.unlink()
        except FileNotFoundError:
            pass

    # -- reading -----------------------------------------------------------------------------

    def peek(self, limit: int) -> list[Record]:
        """Up to ``limit`` oldest records, without removing them."""
        out: list[Record] = []
        for seg in self._segments:
            start = self._head[1] if seg.number == self._head[0] else 0
            if seg is self._segments[-1] and self._tail_file is not None:
                self._tail_file.flush()
            out.extend(self._scan(seg, start, limit - len(out)))
            if len(out) >= limit:
                break
        return out

    def commit(self, records: list[Record]) -> None:
        """Remove ``records`` (a prefix of what ``peek`` returned) from the spool."""
        for rec in records:
            if not self._segments or rec.pos < self._head:
                continue  # dropped (spool full) or committed while it was being replayed
            seg = self._segments[0]
            if rec.pos[0] != seg.number:
                continue
            seg.records -= 1
            seg.events -= rec.events
            self._head = (seg.number, rec.end)
            if seg.records == 0 and len(self._segments) > 1:
                self._segments.pop(0)
                self._remove(seg)
                self._head = (self._segments[0].number, 0)
        if self._segments and self._segments[-1].records == 0 and len(self._segments) == 1:
            # Empty: start afresh so the directory does not keep an ever-growing file.
            seg = self._segments.pop()
            if self._tail_file is not None:
                self._tail_file.close()
                self._tail_file = None
            self._remove(seg)
            self._head = (seg.number, 0)
        self._set_head(self._head)

    def _set_head(self, head: tuple[int, int]) -> None:
        self._head = head
        tmp = self.directory / (_HEAD_FILE + ".tmp")
        tmp.write_text(f"{head[0]} {head[1]}\n")
        os.replace(tmp, self.directory / _HEAD_FILE)

    def close(self) -> None:
        if self._tail_file is not None:
            try:
                if self.fsync != "never":
                    os.fsync(self._tail_file.fileno())
            except OSError:
                pass
            self._discard_tail()
