"""Shared fixtures: a real Tansu broker for the session, a fresh topic prefix per test;
and the rule that a test using a real broker or database is an ``integration`` test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from failslow.schema import Topics
from failslow.stack import Broker, create_topics, start_broker

# Fixtures that start a broker or a database: a test using one is marked ``integration``
# even if its module forgot to say so, so ``pytest -m "not integration"`` stays fast.
REAL_SERVICE_FIXTURES = {"broker", "topics", "ch", "tls_broker", "tls_server", "server_url"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """A real Tansu broker on a free loopback port, stopped at the end of the session."""
    b = start_broker()
    try:
        yield b
    finally:
        b.stop(timeout=2)


@pytest.fixture
def topics(broker: Broker) -> Topics:
    """A unique topic prefix for one test, with every CONTRACT.md topic created (4 partitions)."""
    t = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    create_topics(broker.bootstrap, t, partitions=4)
    return t
