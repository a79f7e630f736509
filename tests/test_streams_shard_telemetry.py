"""A large job's own hosts' telemetry is never dropped by the input limits (issue 16).

At a large job's start (and while a backlog is read) a shard's hosts send telemetry
long before the partition has seen any of the job's steps. The partition's input limits
hold samples of hosts that no job there names yet in a bounded pool (oldest dropped); a
4,096-rank shard has 512 hosts, more than that pool holds, and the 131,072-rank run
counted 1.95 M samples dropped there. The route places each host on its shard's
partition (its GPU samples name job and rank), so the partition admits a placed host's
samples at once; the pool's bound stays for hosts nobody placed.

Here with real workers on the real broker: a 64-rank job in two shards of 32 (4 hosts
each), the pool cut to one host (``FAILSLOW_MAX_UNKNOWN_HOSTS=1``), every device sample
of the job's first step published before any of its step or comm events. The incidents
(root cause and evidence included) are byte-identical to ``failslow detect``'s."""

from __future__ import annotations

import time

import pytest
from test_streams_worker import brief, canon, metric, publish, two_workers

from failslow.models.shard import ShardedDetector
from failslow.simulator import simulate
from failslow.simulator.spec import FaultSpec as F
from failslow.simulator.spec import JobSpec, Scenario
from failslow.streams.limits import InputLimits
from failslow.worker_process import read_incidents, wait_for_incidents

SHARD = 32
TELEMETRY = ("gpu", "nic", "host")
# 64 ranks tp4 pp2 dp8 on 8 hosts, 3 s steps (warm-up steps up to 4x longer): faults from
# the first step on a host of each shard, so the early samples are the culprits' too
SCENARIO = Scenario(
    "shard_early_telemetry", "64 ranks tp4 pp2, 3 s steps: rank 9 logs ECC errors and rank "
    "45 throttles from the first step",
    (JobSpec(hosts=8, tp=4, pp=2, micro_batches=8, step_s=3.0, tp_ops=4),), steps=14,
    faults=(F("gpu_errors", 0, None, 0.3, rank=9), F("gpu_thermal", 0, None, 0.4, rank=45)))


def _events(tag: str) -> list[dict]:
    out = []
    for ev in simulate(SCENARIO, seed=0).events():
        ev = dict(ev)
        if ev.get("job_id") is not None:
            ev["job_id"] = f"{tag}.{ev['job_id']}"
        ev["host"] = f"{tag}-{ev['host']}"
        out.append(ev)
    return out


def test_a_placed_hosts_samples_are_admitted_at_once():
    lim = InputLimits(max_unknown_hosts=1)
    samples = [{"kind": "gpu", "host": f"h{i}", "ts": 1.0 + i, "gpu": 0} for i in range(4)]
    assert lim.admit(samples[:2]) == []                  # nobody placed them: held
    assert lim.counts["hosts"] == 1                      # h0's dropped: the pool holds one
    assert lim.admit(samples[2:], placed=True) == samples[2:]
    assert lim.hosts == 2 and lim.counts["hosts"] == 1
    # a placed host's held samples come out first, in order
    later = {**samples[1], "ts": 9.0}
    assert lim.admit([later], placed=True) == [samples[1], later]
    assert lim.hosts == 3


def test_placed_hosts_stay_within_max_hosts():
    lim = InputLimits(max_hosts=1, max_unknown_hosts=4)
    a = {"kind": "gpu", "host": "a", "ts": 1.0, "gpu": 0}
    b = {**a, "host": "b"}
    assert lim.admit([a], placed=True) == [a]
    assert lim.admit([b], placed=True) == []             # past max_hosts: held as before
    assert lim.hosts == 1


@pytest.fixture
def small_pool(monkeypatch):
    monkeypatch.setenv("FAILSLOW_SHARD_RANKS", str(SHARD))   # the workers' (children) too
    monkeypatch.setenv("FAILSLOW_MAX_UNKNOWN_HOSTS", "1")


def test_a_shards_own_hosts_early_telemetry_is_judged_as_detect_does(broker, topics,
                                                                      small_pool, tmp_path):
    events = _events("e")
    ref = ShardedDetector(shard_ranks=SHARD).process_batch(events)
    assert any(i["status"] == "open" and i.get("root_cause") not in (None, "unknown")
               for i in ref)
    first_job_ts = min(e["ts"] for e in events if e["kind"] not in TELEMETRY)
    early = [e for e in events if e["kind"] in TELEMETRY and e["ts"] < first_job_ts]
    rest = [e for e in events if not (e["kind"] in TELEMETRY and e["ts"] < first_job_ts)]
    assert len({e["host"] for e in early}) == 8 and len(early) > 100
    workers, ports, logs = two_workers(broker, topics, tmp_path)
    try:
        # the early samples reach the shards' partitions before any step of the job
        publish(broker, topics, early)
        deadline = time.monotonic() + 90
        seen = 0.0
        while time.monotonic() < deadline:
            try:
                seen = sum(metric(p, "failslow_stream_events_total") for p in ports)
            except OSError:
                seen = 0.0
            if seen >= len(early):
                break
            time.sleep(0.3)
        assert seen >= len(early), (seen, len(early))
        publish(broker, topics, rest)
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=150)
        capped = sum(metric(p, "failslow_stream_capped_events_total") for p in ports)
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)
    assert len(read_incidents(broker.bootstrap, topics)) == len(got)
    # nothing of the job's own hosts was dropped (copies sent to every partition before
    # the route knew a host may be, on the partitions that do not hold it)
    assert capped < len(early), capped
