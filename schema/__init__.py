"""The shared wire schema of CONTRACT.md v1: typed records, validation and the orjson codec."""

from failslow.schema.codec import DeadLetter, decode, decode_lenient, encode, encode_deadletter
from failslow.schema.events import (
    KINDS,
    CollectiveEvent,
    CommEvent,
    CommOp,
    Event,
    GpuEvent,
    HostEvent,
    IncidentEvent,
    NicEvent,
    SchemaError,
    StepEvent,
    validate,
)
from failslow.schema.topics import Topics

__all__ = [
    "KINDS",
    "CollectiveEvent",
    "CommEvent",
    "CommOp",
    "DeadLetter",
    "Event",
    "GpuEvent",
    "HostEvent",
    "IncidentEvent",
    "NicEvent",
    "SchemaError",
    "StepEvent",
    "Topics",
    "decode",
    "decode_lenient",
    "encode",
    "encode_deadletter",
    "validate",
]
