"""Publisher against the real Tansu broker: batching, keys, compression, spool under an outage."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from fakes.kafka import read_events, read_messages

from failslow.collectors.publisher import Publisher, PublisherError
from failslow.collectors.spool import Spool
from failslow.schema import Topics
from failslow.stack import create_topics, free_port, start_broker


def host_event(i: int, host: str = "h0") -> dict:
    # procs_running carries a sequence number so order can be checked end to end.
    return {"v": 1, "kind": "host", "ts": 1.7e9 + i, "host": host, "procs_running": i}


def coll_event(i: int, group: str) -> dict:
    return {"v": 1, "kind": "collective", "ts": 1.7e9 + i, "job_id": "j", "rank": 0,
            "host": "h0", "group": group, "group_size": 2, "op": "allreduce", "seq": i,
            "start_ts": 1.7e9 + i - 0.01, "duration_s": 0.01, "bytes": 1024}


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_batches_per_topic_and_key(broker, topics, compression):
    pub = Publisher(broker.bootstrap, topics, compression=compression, batch_events=7)
    events = [host_event(i, f"h{i % 3}") for i in range(30)]
    events += [coll_event(i, "dp0" if i % 2 else "tp1") for i in range(20)]
    pub.publish(events)
    assert pub.flush(10) == 0
    pub.close()
    assert pub.stats["delivered"] == 50 and pub.stats["failed"] == 0

    msgs = read_messages(broker.bootstrap, topics.for_kind("host"), expect_events=30)
    assert all(1 <= len(evs) <= 7 for _, evs in msgs)
    assert all(ev["host"] == key for key, evs in msgs for ev in evs)
    for h in ("h0", "h1", "h2"):  # one key stays in one partition, in publish order
        seq = [ev["procs_running"] for key, evs in msgs if key == h for ev in evs]
        assert seq == sorted(seq) and len(seq) == 10
    colls = read_messages(broker.bootstrap, topics.for_kind("collective"), expect_events=20)
    assert {key for key, _ in colls} == {"j/dp0", "j/tp1"}
    assert sorted(ev["seq"] for _, evs in colls for ev in evs) == list(range(20))


def test_publish_after_close_is_refused(broker, topics):
    pub = Publisher(broker.bootstrap, topics)
    pub.close()
    with pytest.raises(PublisherError):
        pub.publish([host_event(0)])


def test_no_spool_counts_failures():
    # Nothing listens on this port: every delivery times out and is counted, not raised.
    pub = Publisher(f"127.0.0.1:{free_port()}", Topics("x."), delivery_timeout_s=0.5)
    pub.publish([host_event(i) for i in range(5)])
    left = pub.close(timeout=3)
    assert left == 0 and pub.stats["failed"] == 5 and pub.stats["delivered"] == 0


def test_spool_keeps_order_across_restart_and_bounds_size(tmp_path):
    spool = Spool(tmp_path, max_bytes=64 << 10, segment_bytes=4096)
    for i in range(10):
        spool.append("t", "k", b"x" * 100 + str(i).encode(), 1)
    first = spool.peek(3)
    spool.commit(first)
    spool.close()
    again = Spool(tmp_path, max_bytes=64 << 10, segment_bytes=4096)
    assert [r.value[100:] for r in again.peek(100)] == [str(i).encode() for i in range(3, 10)]
    dropped = sum(again.append("t", "k", b"y" * 1000, 2) for _ in range(200))
    assert dropped == again.dropped_events > 0 and again.size_bytes <= 64 << 10
    assert again.events + dropped == 7 + 400


def test_closing_while_broker_down_keeps_events_for_next_run(tmp_path, broker, topics):
    dead = f"127.0.0.1:{free_port()}"
    pub = Publisher(dead, topics, spool_dir=str(tmp_path), delivery_timeout_s=0.5)
    pub.publish([host_event(i) for i in range(12)])
    assert pub.close(timeout=2) == 12
    assert pub.stats["spooled"] == 12
    # The next collector on the same spool, with a reachable broker, delivers them in order.
    pub2 = Publisher(broker.bootstrap, topics, spool_dir=str(tmp_path))
    pub2.publish([host_event(12)])
    assert pub2.flush(20) == 0
    pub2.close()
    got = read_events(broker.bootstrap, topics.for_kind("host"), expect_events=13)
    assert [ev["procs_running"] for ev in got] == list(range(13))


@pytest.mark.integration
def test_broker_down_10s_then_back_every_sample_arrives_in_order(tmp_path):
    port = free_port()
    topics = Topics("outage.")
    b = start_broker(port)
    create_topics(b.bootstrap, topics, partitions=1)
    pub = Publisher(b.bootstrap, topics, spool_dir=str(tmp_path / "spool"),
                    delivery_timeout_s=2.0)
    produced: list[int] = []
    stop = threading.Event()

    def sample_loop() -> None:  # a collector sampling every 50 ms
        i = 0
        while not stop.is_set():
            pub.publish([host_event(i)])
            produced.append(i)
            i += 1
            time.sleep(0.05)

    t = threading.Thread(target=sample_loop)
    t.start()
    try:
        time.sleep(1.0)
        b.stop(timeout=0.5)
        first_while_down = len(produced)
        time.sleep(10.0)
        b = start_broker(port)
        create_topics(b.bootstrap, topics, partitions=1)  # Tansu is memory-only
        time.sleep(2.0)
        stop.set()
        t.join()
        assert pub.flush(30) == 0
        pub.close()
        got = [ev["procs_running"] for ev in
               read_events(b.bootstrap, topics.for_kind("host"), timeout=30)]
    finally:
        stop.set()
        b.stop(timeout=0.5)
    # What the first broker acknowledged died with it; everything after arrives, in order.
    assert got, "nothing arrived after the restart"
    assert got == list(range(got[0], produced[-1] + 1))
    assert got[0] <= first_while_down
    assert pub.stats["spooled"] > 0 and pub.stats["dropped"] == 0


def test_an_unusable_spool_folder_is_one_log_line_and_publishing_goes_on(
        tmp_path, broker, topics, caplog):
    # A file where the spool folder should be (root ignores read-only modes, so this is
    # how a folder that cannot be written is made here): one clear line, then live.
    blocked = tmp_path / "spool"
    blocked.write_text("not a folder")
    with caplog.at_level("WARNING", logger="failslow.collectors.publisher"):
        pub = Publisher(broker.bootstrap, topics, spool_dir=str(blocked))
    pub.publish([host_event(i) for i in range(5)])
    assert pub.close(timeout=10) == 0
    assert pub.stats["delivered"] == 5
    lines = [r.getMessage() for r in caplog.records if "spool" in r.getMessage()]
    assert len(lines) == 1 and "without a spool" in lines[0], lines


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 64 KiB tmpfs, filled up: every write fails with ENOSPC."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?): no full disk to test with")
    try:
        (mnt / "spool").mkdir()
        with open(mnt / "filler", "wb") as f, contextlib.suppress(OSError):
            f.write(b"x" * (1 << 20))
        yield mnt / "spool"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_while_spooling_is_one_log_line_and_publishing_goes_on(
        full_disk, caplog):
    # The broker is down, so events head for the spool, on a full disk.
    pub = Publisher(f"127.0.0.1:{free_port()}", Topics("x."), spool_dir=str(full_disk),
                    delivery_timeout_s=0.3)
    with caplog.at_level("WARNING", logger="failslow.collectors.publisher"):
        for i in range(20):
            pub.publish([host_event(i)])
            time.sleep(0.05)
        left = pub.close(timeout=2)
    full = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
    assert len(full) == 1, full
    assert left == 0 and pub.stats["failed"] == 20


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_the_spool_fsync_policy_keeps_records(tmp_path, policy):
    spool = Spool(tmp_path, fsync=policy)
    for i in range(50):
        spool.append("t", "k", str(i).encode(), 1)
    spool.close()
    assert [r.value for r in Spool(tmp_path).peek(100)] == [str(i).encode() for i in range(50)]
    with pytest.raises(ValueError, match="fsync"):
        Spool(tmp_path, fsync="sometimes")


def comm_record(i: int, ops: int = 12) -> dict:
    return {"v": 1, "kind": "comm", "ts": 1.7e9 + i, "window_start_ts": 1.7e9 + i - 1,
            "job_id": "big", "rank": 0, "host": "h0", "step": i, "step_end": True,
            "ops": [{"group": f"dp{k}-a-long-communicator-name", "group_size": 64,
                     "op": "allreduce", "n": 3, "blocked_s": 0.123456789, "min_s": 0.0123,
                     "max_s": 0.0456, "bytes": 3 << 20, "first_seq": 1000 * i + k,
                     "last_seq": 1000 * i + k + 2, "first_start_ts": 1.7e9 + i - 0.5}
                    for k in range(ops)]}


def raw_messages(bootstrap: str, topic: str, expect: int) -> list[tuple[str, bytes]]:
    """(key, value) of the messages on ``topic`` (4 partitions), read by assignment."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
    out: list[tuple[str, bytes]] = []
    deadline = time.monotonic() + 20
    try:
        while len(out) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                out.append((msg.key().decode(), msg.value()))
    finally:
        consumer.close()
    return out


def test_messages_are_cut_by_bytes_not_only_by_events(broker, topics):
    """Issue 33 item 5: 500 comm records of 12 ops were one ~1.3 MB message that librdkafka
    refused with an uncaught MSG_SIZE_TOO_LARGE."""
    import orjson

    from failslow.schema.limits import MESSAGE_MAX_BYTES

    events = [comm_record(i) for i in range(600)]
    assert len(orjson.dumps(events[:500])) > 1_000_000  # one message of old: too large
    pub = Publisher(broker.bootstrap, topics)
    pub.publish(events)
    assert pub.flush(20) == 0
    pub.close()
    assert pub.stats["delivered"] == 600 and pub.stats["failed"] == 0
    assert pub.stats["too_large"] == 0
    msgs = raw_messages(broker.bootstrap, topics.for_kind("comm"), expect=3)
    assert len(msgs) >= 3 and all(len(v) <= MESSAGE_MAX_BYTES for _, v in msgs)
    got = [ev["step"] for _, v in msgs for ev in orjson.loads(v)]
    assert got == list(range(600))


def test_an_event_alone_too_large_is_dead_lettered_with_the_reason(broker, topics):
    import orjson

    huge = {**host_event(1), "pad": "x" * (5 << 20)}  # a 5 MB event
    pub = Publisher(broker.bootstrap, topics)
    pub.publish([host_event(0), huge, host_event(2)])
    assert pub.flush(20) == 0
    pub.close()
    assert pub.stats["too_large"] == 1 and pub.stats["failed"] == 0
    assert [ev["procs_running"] for ev in read_events(broker.bootstrap, topics.for_kind("host"),
                                                       expect_events=2)] == [0, 2]
    [(key, value)] = raw_messages(broker.bootstrap, topics.deadletter, expect=1)
    dead = orjson.loads(value)
    assert key == "h0" and dead["topic"] == topics.for_kind("host")
    assert "larger than" in dead["error"] and str(len(orjson.dumps(huge))) in dead["error"]


def test_replay_of_large_comm_records_keeps_its_summary(broker, topics, tmp_path):
    import os
    import subprocess
    import sys

    import orjson

    trace = tmp_path / "big.jsonl"
    lines = [orjson.dumps(comm_record(i)) for i in range(600)]
    lines.insert(10, b'{"v": 1, "kind": "comm", "ts": "not a number"}')
    trace.write_bytes(b"\n".join(lines) + b"\n")
    env = {**os.environ, "FAILSLOW_BOOTSTRAP": broker.bootstrap,
           "FAILSLOW_TOPIC_PREFIX": topics.prefix, "FAILSLOW_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "failslow.cli", "replay", str(trace)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "replayed 600 of 600 events" in out.stdout and "1 bad lines" in out.stdout
    assert f"{trace}:11" in out.stderr
