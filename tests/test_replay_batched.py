"""`failslow replay` publishes what the host agents publish: a per-rank trace's windows, steps
and samples as one batch message per host and window (``schema.batches.batch_trace``'s
boundaries), an already batched trace as it is; ``--per-rank`` one event at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from failslow.commands.replay import as_agents_publish, order_ts
from failslow.schema.batches import BATCH_KINDS, batch_trace, expand
from failslow.schema.topics import KIND_TOPIC, key_for
from failslow.simulator import SCENARIOS, simulate

pytestmark = pytest.mark.integration

STEPS = 40          # long enough for the congested NIC (from 30 s at ~1 s steps) to be found


def read_items(bootstrap: str, topics: list[str], expect: int, timeout: float = 30.0,
               partitions: int = 4) -> dict[str, list[tuple[str, list[dict]]]]:
    """Topic -> (key, items as sent) of every message on it, per partition in offset
    order: batches not expanded. Reads until ``expect`` messages came and the topics then
    stayed quiet for 1 s, or ``timeout``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics
                     for p in range(partitions)])
    out: dict[str, list[tuple[str, list[dict]]]] = {t: [] for t in topics}
    n = 0
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while n < expect or time.monotonic() - quiet_since < 1.0:
            if time.monotonic() > deadline:
                break
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            out[msg.topic()].append((msg.key().decode(), orjson.loads(msg.value())))
            n += 1
            quiet_since = time.monotonic()
    finally:
        consumer.close()
    return out


def replay(broker, topics, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "failslow.cli", "replay", *args,
                          "--bootstrap", broker.bootstrap, "--topic-prefix", topics.prefix],
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 0, out.stderr
    return out.stdout


def detect(path: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "failslow.cli", "detect", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [orjson.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture(scope="module")
def per_rank_trace(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A 16-rank job on 2 hosts whose host h1's NICs are congested from 30 s: its per-rank
    trace file and what the host agents publish of it."""
    path = tmp_path_factory.mktemp("replay") / "trace.jsonl"
    simulate(SCENARIOS["slow_link_host_50"], seed=1, steps=STEPS).write_jsonl(path)
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return path, list(batch_trace(events))


def consumed(broker, topics, expected: list[dict]) -> dict[str, list[tuple[str, list[dict]]]]:
    """Topic -> its messages, as many as ``expected`` (what was published) makes on it."""
    names = sorted({KIND_TOPIC[ev["kind"]] for ev in expected})
    batches = sum(ev["kind"] in BATCH_KINDS for ev in expected)
    got = read_items(broker.bootstrap, [topics.prefix + t for t in names], max(batches, 1))
    return {t: got[topics.prefix + t] for t in names}


def test_a_per_rank_trace_goes_out_as_the_host_agents_publish_it(broker, topics,
                                                                  per_rank_trace, tmp_path):
    path, expected = per_rank_trace
    lines = len(path.read_bytes().splitlines())
    out = replay(broker, topics, str(path))
    batches = [ev for ev in expected if ev["kind"] in BATCH_KINDS]
    assert f"replayed {lines} of {lines} events as {len(batches)} batches" in out, out
    got = consumed(broker, topics, expected)
    # one message per batch: per host and window (comm), step (steps), sample (gpu, nic)
    for kind in BATCH_KINDS:
        mine = [ev for ev in batches if ev["kind"] == kind]
        assert mine, kind
        msgs = [(key, items) for key, items in got[KIND_TOPIC[kind]]
                if items[0]["kind"] == kind]
        assert len(msgs) == len(mine), kind
        assert all(len(items) == 1 for _, items in msgs), kind
        assert all(key == key_for(items[0]) for key, items in msgs), kind
        # 8 GPUs a host: each host's step and sample whole in one batch
        if kind in ("step_batch", "gpu_batch"):
            assert {len(items[0][BATCH_KINDS[kind].row_key]) for _, items in msgs} == {8}
        # the same batches batch_trace makes (as `failslow simulate` writes them), each
        # key's in order
        by_key: dict[str, list[dict]] = {}
        for ev in mine:
            by_key.setdefault(key_for(ev), []).append(ev)
        sent: dict[str, list[dict]] = {}
        for key, items in msgs:
            sent.setdefault(key, []).append(items[0])
        assert sent == by_key, kind
    # every per-rank event is there once, and detection on what was consumed finds what
    # it finds on the per-rank file
    items = [ev for msgs in got.values() for _, evs in msgs for ev in evs]
    assert sum(len(expand(ev)) if ev["kind"] in BATCH_KINDS else 1 for ev in items) == lines
    wire = tmp_path / "wire.jsonl"
    wire.write_bytes(b"".join(orjson.dumps(ev) + b"\n" for ev in sorted(items, key=order_ts)))
    incidents = detect(path)
    assert any(inc["fault"] == "slow_link" and inc.get("host") == "h1" for inc in incidents)
    assert detect(wire) == incidents


def test_a_batched_trace_goes_out_as_it_is(broker, topics, per_rank_trace, tmp_path):
    _, expected = per_rank_trace
    cut = [ev for ev in expected if order_ts(ev) < order_ts(expected[0]) + 8]
    path = tmp_path / "batched.jsonl"
    path.write_bytes(b"".join(orjson.dumps(ev) + b"\n" for ev in cut))
    replay(broker, topics, str(path))
    got = consumed(broker, topics, cut)
    sent = sorted((orjson.dumps(ev) for msgs in got.values() for _, evs in msgs for ev in evs))
    assert sent == sorted(orjson.dumps(ev) for ev in cut)


def test_per_rank_publishes_one_event_at_a_time(broker, topics, per_rank_trace, tmp_path):
    path, _ = per_rank_trace
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    events = [ev for ev in events if ev["ts"] < events[0]["ts"] + 8]
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(orjson.dumps(ev) + b"\n" for ev in events))
    out = replay(broker, topics, str(cut), "--per-rank")
    assert f"replayed {len(events)} of {len(events)} events" in out
    got = [ev for msgs in consumed(broker, topics, events).values() for _, evs in msgs
           for ev in evs]
    assert sorted(map(orjson.dumps, got)) == sorted(map(orjson.dumps, events))
    assert not any(ev["kind"] in BATCH_KINDS for ev in got)


def test_a_trace_of_batches_and_per_rank_events_mixed(per_rank_trace):
    # a cluster where some hosts' samples came through an agent (batches) and the jobs'
    # records straight from the ranks: the batches go as they are, the rest is batched
    path, expected = per_rank_trace
    made = [ev for ev in expected if ev["kind"] in ("gpu_batch", "nic_batch")]
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    mixed = sorted(made + [ev for ev in events if ev["kind"] not in ("gpu", "nic")],
                   key=order_ts)
    out = list(as_agents_publish(mixed))
    assert [ev for ev in out if ev["kind"] in ("gpu_batch", "nic_batch")] == made
    assert {ev["kind"] for ev in out} == {ev["kind"] for ev in expected}

    def flat(items: list[dict]) -> list[bytes]:
        return sorted(orjson.dumps(row) for ev in items
                      for row in (expand(ev) if ev["kind"] in BATCH_KINDS else [ev]))

    assert flat(out) == flat(expected)


def test_per_rank_expands_a_batched_trace(broker, topics, per_rank_trace, tmp_path):
    _, expected = per_rank_trace
    cut = [ev for ev in expected if order_ts(ev) < order_ts(expected[0]) + 4]
    path = tmp_path / "batched.jsonl"
    path.write_bytes(b"".join(orjson.dumps(ev) + b"\n" for ev in cut))
    rows = [row for ev in cut for row in (expand(ev) if ev["kind"] in BATCH_KINDS else [ev])]
    out = replay(broker, topics, str(path), "--per-rank")
    assert f"replayed {len(rows)} of {len(rows)} events" in out
    got = [ev for msgs in consumed(broker, topics, rows).values() for _, evs in msgs
           for ev in evs]
    assert sorted(map(orjson.dumps, got)) == sorted(map(orjson.dumps, rows))
