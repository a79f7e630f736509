"""The worker's pieces outside faust: the detector protocol, the fetch-wait patch, the route
stage (fake topics, no broker)."""

from __future__ import annotations

import orjson
from faust.transport.drivers import aiokafka as faust_aiokafka

from failslow.models.pipeline import Detector
from failslow.streams import faust_patch
from failslow.streams.detector import StreamDetector
from failslow.streams.partition import JobPartition


def test_the_models_detector_is_a_stream_detector():
    assert isinstance(Detector(), StreamDetector)
    assert isinstance(JobPartition(0).detector, StreamDetector)
    assert not isinstance(object(), StreamDetector)


class _Thread:
    def __init__(self, app):
        self.app = app


class _Consumer:
    _fetch_max_wait_ms = 1500


def test_the_fetch_wait_comes_from_each_app(monkeypatch):
    cls = faust_aiokafka.AIOKafkaConsumerThread
    monkeypatch.setattr(cls, "_create_worker_consumer", lambda self, transport: _Consumer())
    monkeypatch.setattr(cls, "_failslow_patched", False, raising=False)

    class App:
        pass

    a, b, plain = App(), App(), App()
    faust_patch.set_fetch_wait(a, 30)
    faust_patch.set_fetch_wait(b, 250)
    faust_patch.install()  # a second install changes nothing
    create = cls._create_worker_consumer
    assert create(_Thread(a), None)._fetch_max_wait_ms == 30
    assert create(_Thread(b), None)._fetch_max_wait_ms == 250
    assert create(_Thread(plain), None)._fetch_max_wait_ms == 1500


# -- the route stage, without faust or a broker ------------------------------------------

class _Topic:
    def __init__(self):
        self.sent = []

    async def send(self, **kwargs):
        self.sent.append(kwargs)


class _Msg:
    def __init__(self, topic, key, value, ts=1.0):
        self.topic, self.key, self.value, self.timestamp = topic, key, value, ts


def _router(partitions=4):
    from failslow.schema import Topics
    from failslow.streams.config import WorkerConfig
    from failslow.streams.metrics import Metrics
    from failslow.streams.outputs import Outputs
    from failslow.streams.route_stage import RouteStage
    from failslow.streams.routing import HostMap

    cfg = WorkerConfig(bootstrap="unused:1", topics=Topics("t."))
    topics = {name: _Topic() for name in ("job", "incidents", "dead", "hostmap")}
    metrics = Metrics()
    out = Outputs(metrics, partitions=partitions, **topics)
    return RouteStage(cfg, partitions, out, metrics, HostMap()), cfg, topics, metrics


def _routed(job_topic):
    from failslow.streams.routing import unpack

    return [(sent["partition"], part) for sent in job_topic.sent for part in unpack(sent["value"])]


def test_the_route_stage_sends_a_job_home_and_its_hosts_telemetry_after_it():
    import asyncio

    from failslow.streams.routing import home_partition

    router, cfg, topics, metrics = _router()
    steps, gpu = cfg.topics.for_kind("step"), cfg.topics.for_kind("gpu")
    step = orjson.dumps([{"v": 1, "kind": "step", "job_id": "job5", "host": "h1"}])
    sample = orjson.dumps([{"v": 1, "kind": "gpu", "host": "h1"}])
    stray = orjson.dumps([{"v": 1, "kind": "gpu", "host": "h9"}])
    # the telemetry comes first in the batch: the steps still tell where it goes
    asyncio.run(router.route_batch([_Msg(gpu, b"h1", sample), _Msg(steps, b"job5", step),
                                    _Msg(gpu, b"h9", stray)], now=100.0))
    home = home_partition("job5", 4)
    routed = _routed(topics["job"])
    assert (home, (steps, 1.0, True, b"job5", step, False)) in routed
    # placed on its host's partition: the partition admits it at once (issue 16)
    assert [(p, part[5]) for p, part in routed if part[4] == sample] == [(home, True)]
    # a host no job runs on yet: every partition, one copy reports its bad records
    copies = [(p, part[2]) for p, part in routed if part[4] == stray]
    assert sorted(p for p, _ in copies) == [0, 1, 2, 3]
    assert sum(report for _, report in copies) == 1
    assert not any(part[5] for _, part in routed if part[4] == stray)
    assert metrics.unmapped._value.get() == 1
    assert topics["dead"].sent == []


def test_the_route_stage_dead_letters_a_job_message_that_names_no_job():
    import asyncio

    router, cfg, topics, metrics = _router()
    steps = cfg.topics.for_kind("step")
    asyncio.run(router.route_batch([_Msg(steps, None, b'[{"v":1,"kind":"step"}]')], now=1.0))
    assert topics["job"].sent == []
    [dead] = topics["dead"].sent
    assert b"no job_id" in dead["value"]
    assert metrics.deadletters.labels(steps)._value.get() == 1
