"""Issue 17 (worker memory flat): asking the broker for topic ids does not leak. The
worker's ``TopicWatch`` (and the sink's and notifier's watch) asks every second;
confluent-kafka 2.16.1 keeps one reference too many on each ``Uuid`` that
``describe_topics`` returns, so each ask kept one object per topic for ever (~10 a second
in the 30-min soak's worker: 4,080 -> 7,280 ``Uuid`` objects between minutes 5 and 10)."""

from __future__ import annotations

import gc
import logging

from failslow.schema.kafka_security import TopicIdWatch


def uuids() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "Uuid")


def test_asking_for_topic_ids_again_and_again_keeps_no_uuid(broker, topics):
    names = list(topics.inputs())
    watch = TopicIdWatch(broker.bootstrap, names, logging.getLogger("test"), timeout_s=5.0)
    first = watch.ids()
    assert first is not None and all(first[n] for n in names)
    before = uuids()
    for _ in range(40):
        assert watch.ids() == first       # the ids are still read right
    # before: 40 x len(names) more, one per topic per ask
    assert uuids() - before <= len(names), (before, uuids())
    assert watch.lost() == {}
