"""Shared fixtures: a real Tansu broker for the session, a fresh topic prefix per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from failslow.stack import Broker, create_topics, start_broker
from schema import Topics


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
