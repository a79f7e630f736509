"""A simulated job loaded into chdb once per pytest process, for the tests that query it
(presets, Grafana panels, cost): the ``two_faults`` scenario (rank 13 thermally
throttled from 30 s, host h0's NICs congested from 50 s), its raw events and the
incidents the Detector raised on them, written by the storage writer into a database
of its own in the shared chdb folder (tests/storage_support.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from storage_support import chdb_url

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate
from failslow.storage.client import Client, connect
from failslow.storage.migrations import migrate
from failslow.storage.writer import Writer

SCENARIO, SEED, STEPS = "two_faults", 1, 110
CULPRIT_RANK, CULPRIT_HOST, CULPRIT_GPU, CONGESTED_HOST = 13, "h1", 5, "h0"


@dataclass
class SimJob:
    database: str
    truth: dict[str, Any]
    incidents: list[dict[str, Any]]
    start_ts: float
    end_ts: float

    def client(self) -> Client:
        return connect(chdb_url(self.database), own=True)


_loaded: list[SimJob] = []


def simulated_job() -> SimJob:
    """The loaded job (loaded on first use)."""
    if not _loaded:
        _loaded.append(_load())
    return _loaded[0]


def _load() -> SimJob:
    trace = simulate(SCENARIOS[SCENARIO], seed=SEED, steps=STEPS)
    events = list(trace.events())
    det = Detector()
    incidents: list[dict[str, Any]] = []
    for i in range(0, len(events), 5000):
        incidents += det.process_batch(events[i:i + 5000])
    incidents += det.flush()
    database = f"failslow_sim_{uuid.uuid4().hex[:10]}"
    client = connect(chdb_url(database), own=True)
    try:
        migrate(client)
        writer = Writer(client)
        for ev in events + incidents:
            if not writer.add(ev):
                writer.flush()
        result = writer.flush()
        assert not result.rejected, result.rejected[:3]
    finally:
        client.close()
    ts = [e["ts"] for e in events]
    return SimJob(database, trace.truth, incidents, min(ts), max(ts))
