"""The sink against the REAL Tansu broker, writing to a real chdb folder: every kind
lands in its table, garbage goes to the dead-letter topic and table, and offsets are
committed only after ClickHouse acknowledged the batch."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from storage_support import ch, full_event, minimal_event  # noqa: F401 - fixture

from failslow.schema import encode, encode_deadletter
from failslow.schema.topics import key_for
from failslow.storage.migrations import migrate
from failslow.storage.sink import Sink, consumer_config
from failslow.storage.writer import KIND_TABLE


def _produce(bootstrap, messages):
    """Send (topic, key, value); return {(topic, partition): next offset} from delivery."""
    produced: dict[tuple[str, int], int] = {}

    def on_delivery(err, msg):
        assert err is None, err
        key = (msg.topic(), msg.partition())
        produced[key] = max(produced.get(key, 0), msg.offset() + 1)

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for topic, key, value in messages:
        p.produce(topic, value, key=key, on_delivery=on_delivery)
    assert p.flush(15) == 0
    return produced


def _committed(bootstrap, group, partitions):
    c = Consumer(consumer_config(bootstrap, group))
    try:
        got = c.committed([TopicPartition(t, p) for t, p in partitions], timeout=10)
    finally:
        c.close()
    return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}


def _count(client, table):
    return client.query(f"SELECT count() FROM {table}")[1][0][0]


def test_sink_writes_every_kind_and_dead_letters_garbage(broker, topics, ch):  # noqa: F811
    messages = []
    for kind in KIND_TABLE:
        batch = [full_event(kind, i) for i in range(3)] + [minimal_event(kind, 5)]
        messages.append((topics.for_kind(kind), key_for(batch[0]), encode(batch)))
    garbage = [(topics.for_kind("step"), b"job0", b"not json at all"),
               (topics.for_kind("gpu"), b"h0", encode({**minimal_event("gpu"), "gpu": "zero"})),
               # one bad element in an array: the two good ones are still written
               (topics.for_kind("host"), b"h1",
                encode([minimal_event("host", 7), {"v": 2, "kind": "host"},
                        minimal_event("host", 8)]))]
    foreign = (topics.deadletter, b"x", encode_deadletter("from elsewhere", "other.topic", "{"))
    produced = _produce(broker.bootstrap, messages + garbage + [foreign])

    group = f"sink-{uuid.uuid4().hex[:8]}"
    sink = Sink(ch, broker.bootstrap, topics, group_id=group, max_delay_s=0.2)
    stats = sink.run(max_seconds=60, idle_exit_s=2.0)

    # + the sink's own 3 dead letters, read back from the topic and skipped
    assert stats.messages == len(messages) + len(garbage) + 1 + 3
    for kind, table in KIND_TABLE.items():
        extra = 2 if kind == "host" else 0
        assert _count(ch, table) == 4 + extra, table
    assert stats.dead_letters == 3 and stats.write_errors == 0
    _, rows = ch.query("SELECT topic, reporter, error FROM dead_letters ORDER BY error")
    assert len(rows) == 4  # 3 rejected here + 1 read from the dead-letter topic
    by_reporter = sorted(r[1] for r in rows)
    assert by_reporter == ["deadletter-topic", "sink", "sink", "sink"]
    errors = " | ".join(r[2] for r in rows)
    assert "not JSON" in errors and "gpu.gpu" in errors and "event.v" in errors
    # Everything consumed, including the sink's own dead letters, is committed.
    committed = _committed(broker.bootstrap, group, produced)
    for tp, offset in produced.items():
        # the dead-letter topic also holds the sink's own records, so it may be further on
        assert committed[tp] == offset or tp[0] == topics.deadletter and committed[tp] > offset

    # The dead letters reached the topic too, and a second sink does not store them twice.
    again = Sink(ch, broker.bootstrap, topics, group_id=f"{group}-2", max_delay_s=0.2)
    again.run(max_seconds=60, idle_exit_s=2.0)
    assert _count(ch, "dead_letters FINAL") == 4


def test_offsets_are_committed_only_after_clickhouse_acked(broker, topics, ch):  # noqa: F811
    steps = [minimal_event("step", i) for i in range(50)]
    produced = _produce(broker.bootstrap,
                        [(topics.for_kind("step"), b"job0", encode(steps[i:i + 10]))
                         for i in range(0, 50, 10)])
    group = f"sink-{uuid.uuid4().hex[:8]}"
    ch.execute("DROP TABLE steps_1m_mv")
    ch.execute("DROP TABLE steps")
    # A view in its place: ClickHouse now refuses every write of steps (a missing table
    # would be recreated by the sink).
    ch.execute("CREATE VIEW steps AS SELECT now64(3) AS ts")
    failing = Sink(ch, broker.bootstrap, topics, group_id=group, max_delay_s=0.2,
                   retry_max_s=0.5)
    stats = failing.run(max_seconds=6)
    assert stats.messages == 5 and stats.write_errors >= 1 and stats.commits == 0
    assert _committed(broker.bootstrap, group, produced) == {}

    ch.execute("DROP VIEW steps")
    assert migrate(ch) == [1, 4, 9, 11]  # 9 added steps.own_s, 11 steps.samples
    recovered = Sink(ch, broker.bootstrap, topics, group_id=group, max_delay_s=0.2)
    stats = recovered.run(max_seconds=60, idle_exit_s=2.0)
    assert stats.messages == 5 and stats.events == 50
    assert _count(ch, "steps") == 50
    assert _committed(broker.bootstrap, group, produced) == produced
