"""The job stage decodes the parts of a pack together (``job_stage.decode_values``, issue
31): whatever the parts hold (valid batches and events, a bad batch, a row of another
topic's kind, a value that is no JSON, an empty array, an item that is no object), each
part's events and errors are exactly ``decode_value``'s for it alone."""

from __future__ import annotations

import copy

import orjson

from failslow.schema.batches import batch_trace, is_batch
from failslow.schema.topics import TOPIC_KINDS
from failslow.simulator import SCENARIOS, simulate
from failslow.streams.job_stage import decode_value, decode_values

KINDS = {name: kinds for name, kinds in TOPIC_KINDS.items()}


def _topic_of(obj: dict) -> str:
    kind = obj["kind"]
    row = kind[:-len("_batch")] if kind.endswith("_batch") else kind
    return next(t for t, kinds in KINDS.items() if kinds and row in kinds)


def _parts() -> list[tuple[bytes, frozenset[str] | None]]:
    """One part per object of a small batched trace (values as the Publisher sends them:
    a JSON array), with its topic's kinds."""
    events = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0, grain="comm").events())
    objs = list(batch_trace(events))[:400]
    assert any(map(is_batch, objs)) and not all(map(is_batch, objs))
    return [(orjson.dumps([o]), KINDS[_topic_of(o)]) for o in objs]


def _same(parts: list[tuple[bytes, frozenset[str] | None]]) -> None:
    assert decode_values(parts) == [decode_value(v, k) for v, k in parts]


def test_valid_parts_decode_as_each_alone():
    parts = _parts()
    got = decode_values(parts)
    assert got == [decode_value(v, k) for v, k in parts]
    assert all(not errors for _, errors in got)
    # several objects in one part (a job's comm batches of a slice in one message)
    joined = [(orjson.dumps([orjson.loads(v)[0] for v, _ in parts[i:i + 7]
                             if _topic_of(orjson.loads(v)[0]) == _topic_of(
                                 orjson.loads(parts[i][0])[0])]), parts[i][1])
              for i in range(0, len(parts), 7)]
    _same(joined)
    assert decode_values([]) == []


def test_a_bad_part_gets_its_own_errors_and_the_others_their_events():
    parts = _parts()
    batch_at = next(i for i, (v, _) in enumerate(parts) if is_batch(orjson.loads(v)[0]))
    bad_batch = copy.deepcopy(orjson.loads(parts[batch_at][0]))
    bad_batch[0]["ts"][0] = "soon"           # one row of the batch is wrong
    plain_at = next(i for i, (v, _) in enumerate(parts) if not is_batch(orjson.loads(v)[0]))
    bad_plain = copy.deepcopy(orjson.loads(parts[plain_at][0]))
    bad_plain[0].pop("ts")
    cases = [
        (batch_at, orjson.dumps(bad_batch)),
        (plain_at, orjson.dumps(bad_plain)),
        (3, b"[{not json"),
        (4, b"[]"),
        (5, b"[1, 2]"),
        (6, b'[{"v": 1, "kind": ["gpu"]}]'),
        (7, b'{"v": 1}'),
    ]
    for at, value in cases:
        mixed = list(parts)
        mixed[at] = (value, parts[at][1])
        _same(mixed)
        got = decode_values(mixed)
        assert got[at][1], value           # the bad part's errors are named
        assert all(not errors for i, (_, errors) in enumerate(got) if i != at)
    # a valid event on a topic that does not carry its kind
    other = next(k for t, k in KINDS.items() if k and k != parts[0][1])
    mixed = [(parts[0][0], other), *parts[1:]]
    _same(mixed)
    assert decode_values(mixed)[0][1]
