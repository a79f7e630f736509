"""The embedded broker starts on loopback, answers Kafka requests and refuses a taken port."""

from __future__ import annotations

import socket

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from failslow.schema import Topics
from failslow.stack import StackError, create_topics, start_broker


def test_topics_are_created_and_roundtrip_a_message(broker, topics):
    names = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=5).topics
    assert set(topics.all()) <= set(names)
    assert len(names[topics.for_kind("step")].partitions) == 4
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(topics.for_kind("step"), key=b"job0", value=b'{"x":1}')
    assert p.flush(10) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-" + topics.prefix,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 3000,
                  "fetch.wait.max.ms": 100})
    c.subscribe([topics.for_kind("step")])
    got = None
    for _ in range(100):
        msg = c.poll(0.2)
        if msg is not None and not msg.error():
            got = msg
            break
    c.close()
    assert got is not None and got.key() == b"job0" and got.value() == b'{"x":1}'


def test_create_topics_twice_keeps_the_existing_topics(broker, topics):
    create_topics(broker.bootstrap, topics, partitions=2)
    names = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=5).topics
    assert {len(names[t].partitions) for t in topics.all()} == {4}


def test_refuses_a_port_taken_by_something_else():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(StackError, match="already taken"):
            start_broker(port)


def test_a_topic_prefix_keeps_tests_apart(broker):
    a, b = Topics("a1."), Topics("b1.")
    create_topics(broker.bootstrap, a, 1)
    names = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=5).topics
    assert a.for_kind("gpu") in names and b.for_kind("gpu") not in names
