"""How large one Kafka message value may be: the one limit producers, the stream worker
and the sink share (issue 33 item 5).

Kafka's default limit (broker ``message.max.bytes``, aiokafka's ``max_request_size``) is
1,048,576 bytes and librdkafka's own ``message.max.bytes`` 1,000,000. An internal message
of the worker carries one input part plus its header, so an input value must stay well
under both: ``MESSAGE_MAX_BYTES``.

- A producer (``collectors.publisher``) cuts its JSON arrays by bytes as well as by
  events, so every message it sends is at most ``MESSAGE_MAX_BYTES``; an event that alone
  is larger is sent to the dead-letter topic instead, with the reason.
- A consumer (the worker's route, the sink) takes a larger value only when it is a JSON
  array that ``split_value`` cuts into parts that fit; otherwise the whole record is a
  dead letter with ``too_large(size)`` as its error, the same text from every stage.
"""

from __future__ import annotations

from typing import Any

import orjson

from failslow.schema.codec import encode

MESSAGE_MAX_BYTES = 768 * 1024


def too_large(size: int, limit: int = MESSAGE_MAX_BYTES) -> str:
    """The dead-letter error of a record that cannot be cut to fit ``limit``."""
    return (f"message of {size} bytes is larger than {limit} and is not an array "
            "that can be split")


def split_value(value: bytes, limit: int = MESSAGE_MAX_BYTES) -> list[bytes] | None:
    """``value`` as parts of at most ``limit`` bytes: itself when small enough, else its
    JSON array cut in halves until each fits (order kept). None when it cannot be cut:
    not a JSON array, or one event alone is larger than ``limit``.

    >>> [len(p) for p in split_value(b"[1,2,3,4]", limit=5)]
    [5, 5]
    """
    if len(value) <= limit:
        return [value]
    try:
        items = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if type(items) is not list or len(items) < 2:
        return None
    mid = len(items) // 2
    out: list[bytes] = []
    for half in (items[:mid], items[mid:]):
        parts = split_value(orjson.dumps(half), limit)
        if parts is None:
            return None
        out += parts
    return out


def pack_messages(events: list[Any], limit: int) -> tuple[list[tuple[bytes, int]], list[bytes]]:
    """``events`` as JSON-array message values of at most ``limit`` bytes, in order, each
    with its event count; and the events that alone are larger (encoded), left out.

    >>> [n for _, n in pack_messages([{"a": "x" * 10}] * 5, 40)[0]]
    [2, 2, 1]
    """
    value = encode(events)
    if len(value) <= limit:
        return [(value, len(events))], []
    out: list[tuple[bytes, int]] = []
    oversized: list[bytes] = []
    parts: list[bytes] = []
    size = 2  # the brackets; a comma before every part after the first
    for ev in events:
        part = encode(ev)
        if len(part) + 2 > limit:
            oversized.append(part)
            continue
        if parts and size + 1 + len(part) > limit:
            out.append((b"[" + b",".join(parts) + b"]", len(parts)))
            parts, size = [], 2
        size += len(part) + (1 if parts else 0)
        parts.append(part)
    if parts:
        out.append((b"[" + b",".join(parts) + b"]", len(parts)))
    return out, oversized
