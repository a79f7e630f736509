"""orjson codec for Kafka message values and trace lines (CONTRACT.md "Encoding").

A value is one event object or a JSON array of events of one kind. A columnar batch
(``schema.batches``: ``comm_batch``, ``gpu_batch``, ``nic_batch``) is expanded into its
per-rank events here, so every consumer sees the per-rank kinds whichever form was sent. ``decode``
is strict (raises SchemaError on the first problem); ``decode_lenient`` keeps
every valid element of an array and reports the invalid ones, so one bad
sample in a batch never costs the others.

>>> decode(b'[{"v":1,"kind":"host","ts":1,"host":"a"}]')[0]["host"]
'a'
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson

from failslow.schema.batches import expand_all, expand_checked, is_batch
from failslow.schema.events import SchemaError, validate
from failslow.schema.fast import all_valid


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One rejected record: why, where it came from, and the raw bytes as text."""

    error: str
    topic: str
    raw: str

    def to_json(self) -> bytes:
        return orjson.dumps({"error": self.error, "topic": self.topic, "raw": self.raw})


def pack(obj: Any) -> Any:
    """``obj`` as compact JSON bytes, to hold many events in little memory (orjson loads
    them back equal); ``obj`` itself if it does not serialize (an integer beyond 64 bits,
    say). Copied to their length: the bytes ``orjson.dumps`` returns keep an allocation
    of 16 KiB at least (a 600-byte sample held 16 KiB, issue 16)."""
    try:
        return bytes(memoryview(orjson.dumps(obj)))
    except TypeError:
        return obj


def _loads(data: bytes | bytearray | memoryview | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"value: not JSON ({exc})") from None


def decode(data: bytes | bytearray | memoryview | str) -> list[Any]:
    """Decode one message value (an object or an array of one kind) into validated events."""
    obj = _loads(data)
    if type(obj) is list:
        if not obj:
            raise SchemaError("value: empty array")
        kind = obj[0].get("kind") if type(obj[0]) is dict else None
        if all_valid(obj) and all(item["kind"] == kind for item in obj):
            return obj
        if any(map(is_batch, obj)):
            return _decode_batched(obj)
        for i, item in enumerate(obj):
            try:
                validate(item)
            except SchemaError as exc:
                raise SchemaError(f"[{i}] {exc}") from None
            if item["kind"] != kind:
                raise SchemaError(f"[{i}] event.kind: {item['kind']!r} in an array of {kind!r}")
        return obj
    if is_batch(obj):
        rows, errors = expand_checked(obj)
        if errors:
            raise SchemaError(errors[0])
        return rows
    return [validate(obj)]


def _decode_batched(items: list[Any]) -> list[Any]:
    """``decode`` of an array that holds batches: their rows in place, all of one kind."""
    out: list[Any] = []
    for i, events, errors in expand_all(items):
        if errors:
            raise SchemaError(f"[{i}] {errors[0]}")
        if not is_batch(items[i]):
            try:
                validate(items[i])
            except SchemaError as exc:
                raise SchemaError(f"[{i}] {exc}") from None
        kind = out[0]["kind"] if out else events[0]["kind"] if events else None
        for ev in events:
            if ev["kind"] != kind:
                raise SchemaError(f"[{i}] event.kind: {ev['kind']!r} in an array of {kind!r}")
        out += events
    return out


def decode_lenient(data: bytes | bytearray | memoryview | str,
                   kinds: Collection[str] | None = None) -> tuple[list[Any], list[str]]:
    """Decode what can be decoded; return (valid events, one error line per rejected part).

    ``kinds``: the kinds the message's topic carries (``Topics.kinds_of``); events of
    another kind are rejected too, so every consumer of a topic keeps the same events."""
    try:
        obj = _loads(data)
    except SchemaError as exc:
        return [], [str(exc)]
    items = obj if type(obj) is list else [obj]
    if not items:
        return [], ["value: empty array"]
    if all_valid(items):
        good: list[Any] = items
        errors: list[str] = []
    elif any(map(is_batch, items)):
        good, errors = [], []
        for i, events, bad in expand_all(items):
            if not is_batch(items[i]):
                try:
                    validate(items[i])
                except SchemaError as exc:
                    events, bad = [], [str(exc)]
            good += events
            errors += [f"[{i}] {e}" if type(obj) is list else e for e in bad]
    else:
        good, errors = [], []
        for i, item in enumerate(items):
            try:
                good.append(validate(item))
            except SchemaError as exc:
                errors.append(f"[{i}] {exc}" if type(obj) is list else str(exc))
    if kinds is not None and any(e["kind"] not in kinds for e in good):
        wrong = [e["kind"] for e in good if e["kind"] not in kinds]
        errors.append(f"{len(wrong)} event(s) of kind {wrong[0]!r} on a topic of "
                      f"{', '.join(sorted(kinds))}")
        good = [e for e in good if e["kind"] in kinds]
    return good, errors


def encode(events: Any) -> bytes:
    """Encode one event (dict) or a list of events as one message value."""
    return orjson.dumps(events, option=orjson.OPT_SERIALIZE_NUMPY)


# Longest ``raw`` text a dead letter carries: with JSON escaping (up to 6 bytes a
# character) it still fits one Kafka message of the default 1,048,576-byte limit.
DEADLETTER_RAW_MAX = 128 * 1024


def encode_deadletter(error: str, topic: str, raw: bytes | str | None) -> bytes:
    """The dead-letter value of CONTRACT.md: ``{"error", "topic", "raw"}``; a ``raw`` longer
    than ``DEADLETTER_RAW_MAX`` is cut, ending in ``[truncated: N bytes]`` (its size)."""
    if isinstance(raw, bytes | bytearray | memoryview):
        size = len(raw)
        text = bytes(raw[:DEADLETTER_RAW_MAX]).decode("utf-8", errors="replace")
    else:
        text = raw or ""
        size = len(text.encode("utf-8", errors="replace"))
        text = text[:DEADLETTER_RAW_MAX]
    if size > DEADLETTER_RAW_MAX:
        text += f"... [truncated: {size} bytes]"
    return DeadLetter(error=error, topic=topic, raw=text).to_json()
