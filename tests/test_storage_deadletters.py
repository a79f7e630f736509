"""Each bad record lands in `dead_letters` once (issue 33 item 7), and the sink and the
worker agree on what is too large (item 5): the sink, reading the real Tansu broker into
chdb, judges every record itself; a dead letter another stage sent for a record the sink
rejects too is not stored again, one for a reason of that stage alone is."""

from __future__ import annotations

import uuid

import orjson
from confluent_kafka import Producer
from storage_support import ch, minimal_event  # noqa: F401 - fixture

from failslow.schema import decode_lenient, encode, encode_deadletter
from failslow.schema.limits import MESSAGE_MAX_BYTES, split_value, too_large
from failslow.storage.sink import Sink


def _produce(bootstrap, messages):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                  "message.max.bytes": 4 << 20})
    for topic, key, value in messages:
        p.produce(topic, value, key=key)
    assert p.flush(15) == 0


def test_each_bad_record_lands_once_and_too_large_is_agreed(broker, topics, ch):  # noqa: F811
    steps, hosts = topics.for_kind("step"), topics.for_kind("host")
    bad = encode([minimal_event("step", 1), {"v": 1, "kind": "step", "ts": 1.7e9}])
    big = encode([{**minimal_event("host", 1), "pad": "x" * (800 << 10)}])  # one event
    many = encode([{**minimal_event("host", i), "pad": "y" * 1000} for i in range(1000)])
    assert len(big) > MESSAGE_MAX_BYTES and split_value(big) is None
    assert len(many) > MESSAGE_MAX_BYTES and split_value(many) is not None
    # What the worker sends for the same records (its route and job stage use the same
    # shared checks), and one dead letter for a reason of the worker's own.
    _, errors = decode_lenient(bad)
    clock = encode(minimal_event("step", 9))
    worker = [(topics.deadletter, b"job0", encode_deadletter("; ".join(errors), steps, bad)),
              (topics.deadletter, b"h0", encode_deadletter(too_large(len(big)), hosts, big)),
              (topics.deadletter, b"job0",
               encode_deadletter("ts 1.0 year ahead of the worker's clock", steps, clock))]
    _produce(broker.bootstrap, [(steps, b"job0", bad), (hosts, b"h0", big),
                                (hosts, b"h0", many), *worker])

    sink = Sink(ch, broker.bootstrap, topics, group_id=f"sink-{uuid.uuid4().hex[:8]}",
                max_delay_s=0.2)
    stats = sink.run(max_seconds=60, idle_exit_s=2.0)

    _, rows = ch.query("SELECT reporter, error, raw FROM dead_letters ORDER BY reporter, error")
    assert [r[0] for r in rows] == ["deadletter-topic", "sink", "sink"], rows
    assert rows[0][1] == "ts 1.0 year ahead of the worker's clock"
    assert "step.job_id" in rows[1][1] and orjson.loads(rows[1][2]) == orjson.loads(bad)
    assert rows[2][1] == too_large(len(big))
    assert rows[2][2].endswith(f"... [truncated: {len(big)} bytes]")  # cut as on the topic
    assert stats.dead_letters == 2 and stats.dead_letters_shared == 2
    # The too-large event is not stored; the good step of the bad array and the 1,000
    # events of the array that splits are.
    assert ch.query("SELECT count() FROM host")[1][0][0] == 1000
    assert ch.query("SELECT count() FROM steps")[1][0][0] == 1
