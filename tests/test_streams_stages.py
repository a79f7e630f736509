"""The worker's pieces outside faust: the detector protocol, the fetch-wait patch."""

from __future__ import annotations

from faust.transport.drivers import aiokafka as faust_aiokafka

from models.pipeline import Detector
from streams import faust_patch
from streams.detector import StreamDetector
from streams.partition import JobPartition


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
