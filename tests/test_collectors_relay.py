"""The local hand-off (collectors/relay.py) with a real broker: 8 ranks of a host hand
their windows and steps to the agent over a Unix socket, the agent publishes one columnar
message per window (``comm_batch``) and per step (``step_batch``), decoding gives back exactly the ranks' events, and an agent restart loses
nothing the ranks buffered meanwhile."""

from __future__ import annotations

import logging
import uuid

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from waiting import wait_until

from failslow.collectors.publisher import Publisher
from failslow.collectors.relay import AgentPublisher, Relay
from failslow.schema import decode

T0 = 1_767_225_600.0
RANKS = 8


def _window(rank: int, w: int) -> list[dict]:
    ts = T0 + w + rank * 1e-4
    comm = {"v": 1, "kind": "comm", "ts": ts, "job_id": "job0", "rank": rank, "host": "h3",
            "window_start_ts": T0 + w - 1, "ops": [
                {"group": "dp0", "group_size": 8, "op": "allreduce", "n": 4,
                 "blocked_s": 0.2 + rank / 100, "min_s": 0.03, "max_s": 0.09,
                 "bytes": 1 << 30, "first_seq": 4 * w, "last_seq": 4 * w + 3}],
            "step": w, "step_end": True, "world_size": RANKS, "gpu": rank}
    step = {"v": 1, "kind": "step", "ts": ts, "job_id": "job0", "rank": rank,
            "world_size": RANKS, "host": "h3", "step": w, "duration_s": 1.0}
    return [comm, step]


def _raw(bootstrap: str, topic: str, expect: int) -> list[bytes]:
    """Message values on ``topic`` until ``expect`` comm events arrived."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
    out: list[bytes] = []
    try:
        wait_until(lambda: out.extend(m.value() for m in consumer.consume(100, 0.2)
                                      if m.error() is None) or
                   sum(len(decode(v)) for v in out) >= expect, timeout=30, what="windows")
    finally:
        consumer.close()
    return out


def _comm_sent(windows) -> list[bytes]:
    return sorted(orjson.dumps(_window(r, w)[0]) for w in windows for r in range(RANKS))


@pytest.mark.integration
def test_ranks_hand_off_windows_and_the_agent_publishes_one_message_per_window(
        broker, topics, tmp_path, caplog):
    sock = str(tmp_path / "agent.sock")
    spool = str(tmp_path / "spool")
    pub = Publisher(broker.bootstrap, topics, spool_dir=spool, linger_ms=5)
    relay = Relay(sock, pub, linger_s=2.0).start()
    ranks = [AgentPublisher(sock, retry_s=0.05) for _ in range(RANKS)]
    for w in range(4):
        for r, rank in enumerate(ranks):
            rank.publish(_window(r, w))
        assert all(rank.flush(5) == 0 for rank in ranks)
    wait_until(lambda: relay.batcher.pending == 0, timeout=10, what="the last window out")
    assert pub.flush(10) == 0
    values = _raw(broker.bootstrap, topics.for_kind("comm"), 4 * RANKS)
    # one message per window, a comm_batch of all 8 ranks; decoded: the ranks' events
    assert len(values) == 4
    assert all(orjson.loads(v)[0]["kind"] == "comm_batch" for v in values)
    assert [sorted(e["rank"] for e in decode(v)) for v in values] == [list(range(RANKS))] * 4
    got = sorted(orjson.dumps(e) for v in values for e in decode(v))
    assert got == _comm_sent(range(4))
    # and their steps: one step_batch per step of all 8 ranks (the step written once)
    steps = _raw(broker.bootstrap, topics.for_kind("step"), 4 * RANKS)
    assert len(steps) == 4
    assert [orjson.loads(v)[0]["step"] for v in steps] == [0, 1, 2, 3]
    assert all(orjson.loads(v)[0]["kind"] == "step_batch" for v in steps)
    assert sorted(orjson.dumps(e) for v in steps for e in decode(v)) == sorted(
        orjson.dumps(_window(r, w)[1]) for w in range(4) for r in range(RANKS))

    # the agent restarts; the ranks go on training and keep their windows meanwhile
    relay.stop()
    assert pub.close(10) == 0
    caplog.set_level(logging.WARNING, logger="failslow.collectors.relay")
    for w in range(4, 7):
        for r, rank in enumerate(ranks):
            rank.publish(_window(r, w))
    assert all(rank.stats["pending"] == 6 for rank in ranks)
    said = [r.message for r in caplog.records if "is not answering" in r.message]
    assert len(said) == RANKS and "\n" not in said[0]        # once per rank, one line
    pub = Publisher(broker.bootstrap, topics, spool_dir=spool, linger_ms=5)
    relay = Relay(sock, pub, linger_s=0.5).start()
    for r, rank in enumerate(ranks):
        rank.publish(_window(r, 7))
    assert all(rank.flush(10) == 0 for rank in ranks)
    wait_until(lambda: relay.batcher.pending == 0, timeout=10, what="the backlog out")
    assert pub.flush(10) == 0
    values = _raw(broker.bootstrap, topics.for_kind("comm"), 8 * RANKS)
    got = sorted(orjson.dumps(e) for v in values for e in decode(v))
    assert got == _comm_sent(range(8))                      # nothing lost, nothing twice
    steps = [e for v in _raw(broker.bootstrap, topics.for_kind("step"), 8 * RANKS)
             for e in decode(v)]
    assert sorted(orjson.dumps(e) for e in steps) == sorted(
        orjson.dumps(_window(r, w)[1]) for w in range(8) for r in range(RANKS))
    assert all(rank.close(5) == 0 for rank in ranks)
    relay.stop()
    pub.close(10)


class _ListPublisher:
    def __init__(self) -> None:
        self.values: list[list[dict]] = []

    def publish(self, events) -> None:
        self.values.append(list(events))


class _Gpus:
    name = "gpus"

    def sample(self) -> list[dict]:
        return [{"v": 1, "kind": "gpu", "ts": T0, "host": "h3", "gpu": i, "uuid": f"GPU-{i}",
                 "sm_clock_mhz": 1980.0 - i, "temp_c": 60.0} for i in range(8)]


def test_the_agent_publishes_a_cycle_s_gpu_samples_as_one_batch():
    from failslow.collectors.agent import Agent
    from failslow.schema import encode

    batched, plain = _ListPublisher(), _ListPublisher()
    Agent([_Gpus()], batched, on_change=False, batch=True).cycle()
    Agent([_Gpus()], plain, on_change=False).cycle()
    assert [[e["kind"] for e in v] for v in batched.values] == [["gpu_batch"]]
    assert decode(encode(batched.values[0])) == plain.values[0] == _Gpus().sample()


def test_a_rank_without_its_agent_keeps_a_bounded_buffer_and_says_so_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="failslow.collectors.relay")
    rank = AgentPublisher(str(tmp_path / "nobody.sock"), max_buffer_bytes=4000, retry_s=0.0)
    for w in range(20):
        rank.publish(_window(0, w))      # never raises, never blocks
    st = rank.stats
    assert st["published"] == 40 and st["delivered"] == 0
    assert 0 < st["pending"] < 40 and st["dropped"] == 40 - st["pending"]
    lines = [r.message for r in caplog.records]
    assert len([m for m in lines if "is not answering" in m]) == 1
    assert len([m for m in lines if "buffer full" in m]) == 1
    assert rank.close(0.1) == st["pending"]
