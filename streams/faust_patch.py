"""The one patch of a private faust method the worker needs: the fetch wait.

faust builds its aiokafka consumer with a fixed 1,500 ms fetch wait
(``AIOKafkaConsumerThread._create_worker_consumer``), and Tansu holds every fetch for
the full wait (MEASURED.md: 100 ms -> ~30-50 ms delivery instead of 386-751 ms). The
patch reads the wait from the app the consumer belongs to (``set_fetch_wait``), so two
apps in one process keep their own value and no module-level state is involved.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

_ATTR = "failslow_fetch_wait_ms"


def set_fetch_wait(app: Any, ms: int) -> None:
    """Make the consumers of ``app`` wait at most ``ms`` for data (installs the patch once)."""
    setattr(app, _ATTR, ms)
    install()


def install() -> None:
    """Patch ``AIOKafkaConsumerThread._create_worker_consumer`` (idempotent). An app
    without ``set_fetch_wait`` keeps faust's default."""
    cls = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_failslow_patched", False):
        return
    original = cls._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        wait = getattr(self.app, _ATTR, None)
        if wait is not None:
            consumer._fetch_max_wait_ms = wait
        return consumer

    cls._create_worker_consumer = create  # type: ignore[method-assign]
    cls._failslow_patched = True  # type: ignore[attr-defined]
