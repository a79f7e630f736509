"""Issue 17, the broker's faults seen from the worker: a failed internal send is never
dropped silently; a broker restarted without its data (Tansu keeps topics in memory) is
noticed, the internal topics are recreated and the worker comes back on its own; an
outage longer than a snapshot's flush skips the snapshot instead of stopping the worker;
a snapshot is found by its chunks' ids even when another one's chunks sit between them."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import zlib
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from proxy_support import Proxy
from test_streams_worker import brief, canon, publish, reference, scenario_events

from failslow.schema import Topics
from failslow.stack import create_topics, free_port, start_broker, wait_for_metadata
from failslow.streams.sends import SendLost, Sends
from failslow.streams.snapshots import _newest
from failslow.worker_process import WorkerProcess, read_incidents, wait_for_incidents

# -- unit: sends ------------------------------------------------------------------------------


class FakeTopic:
    """A faust topic whose sends return futures the test settles."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future] = []

    async def send(self, **kwargs: Any) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut

    def get_topic_name(self) -> str:
        return "x.internal.job"


def test_a_send_the_broker_refuses_is_reported_at_once_and_never_confirmed() -> None:
    lost: list[str] = []

    async def run() -> tuple[bool, str]:
        sends = Sends(on_lost=lost.append)
        raw = FakeTopic()
        topic = sends.track(raw)
        await topic.send(value=b"a", partition=0)
        await topic.send(value=b"b", partition=1)
        raw.futures[0].set_result("ok")
        waiter = asyncio.ensure_future(sends.confirm())
        await asyncio.sleep(0.01)
        still_waiting = not waiter.done()       # the second send is not acknowledged yet
        raw.futures[1].set_exception(RuntimeError("Unknown broker error"))
        try:
            await waiter
        except SendLost as exc:
            return still_waiting, str(exc)
        return still_waiting, "confirmed"

    still_waiting, outcome = asyncio.run(run())
    assert still_waiting
    assert "x.internal.job" in outcome and "Unknown broker error" in outcome
    assert len(lost) == 1 and "Unknown broker error" in lost[0]


def test_confirm_returns_once_every_send_is_acknowledged() -> None:
    async def run() -> int:
        sends = Sends(on_lost=lambda why: None)
        raw = FakeTopic()
        for v in (b"a", b"b", b"c"):
            await sends.track(raw).send(value=v)
        asyncio.get_running_loop().call_later(0.01, lambda: [f.set_result(1)
                                                             for f in raw.futures])
        await sends.confirm()
        return sends.pending

    assert asyncio.run(run()) == 0


# -- unit: snapshots -----------------------------------------------------------------------


class Msg:
    def __init__(self, sid: bytes, i: int, n: int, value: bytes) -> None:
        self._h = [("sid", sid), ("chunk", str(i).encode()), ("of", str(n).encode())]
        self._v = value

    def headers(self) -> list:
        return self._h

    def value(self) -> bytes:
        return self._v


def chunks(sid: bytes, snap: dict, n: int) -> list[Msg]:
    blob = zlib.compress(orjson.dumps(snap), 1)
    size = -(-len(blob) // n)
    return [Msg(sid, i, n, blob[i * size:(i + 1) * size]) for i in range(n)]


def test_the_newest_snapshot_is_found_when_an_undelivered_ones_chunks_land_between() -> None:
    old, late, new = chunks(b"old", {"o": 1}, 2), chunks(b"late", {"o": 2}, 3), \
        chunks(b"new", {"o": 3}, 2)
    # the undelivered snapshot's first chunk landed, then the next snapshot's chunks with its
    # second chunk between them; its last chunk never came
    msgs = [*old, late[0], new[0], late[1], new[1]]
    assert _newest(msgs) == {"o": 3}
    assert _newest([*old, late[0], late[1]]) == {"o": 1}


# -- integration: the real broker --------------------------------------------------------------


@pytest.mark.integration
def test_a_broker_restarted_without_its_data_brings_the_worker_back_exact(tmp_path) -> None:
    """Tansu keeps topics in memory: after a kill -9 and a restart on the same port the
    internal topics are gone (or auto-created by the first client that asks, with other
    settings). The worker used to wait forever on its sends to them; now it recreates
    them, exits 70 once, and the restarted worker judges a job published afterwards exactly
    as the offline Detector does."""
    port = free_port()
    b = start_broker(port, log_path=tmp_path / "tansu.log")
    topics = Topics("restart.")
    log = tmp_path / "worker.log"
    group = "restart.g"
    worker: WorkerProcess | None = None
    exits: list[int] = []
    before = scenario_events("gpu_thermal_30", "a")
    after = scenario_events("input_stall_50", "b")
    ref = reference(after)
    got: list[dict] = []
    first_end = 0
    try:
        create_topics(b.bootstrap, topics)
        worker = WorkerProcess(b.bootstrap, topics, group=group, log_path=log,
                               extra=["--snapshot-interval", "0.5"])
        publish(b, topics, before)
        assert wait_for_incidents(b.bootstrap, topics, 1, timeout=90, settle=2.0)
        b.proc.kill()                                   # type: ignore[union-attr]
        b.proc.wait()                                   # type: ignore[union-attr]
        b = start_broker(port, log_path=tmp_path / "tansu.log")
        create_topics(b.bootstrap, topics)              # what an operator (or `up`) does
        deadline = time.monotonic() + 60
        while worker.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        code = worker.proc.poll()
        assert code is not None, "the worker did not notice that its topics were gone"
        exits.append(code)
        first_end = log.stat().st_size   # the first worker's lines end here (a crash's dump)
        worker = WorkerProcess(b.bootstrap, topics, group=group, log_path=log)
        publish(b, topics, after)
        deadline = time.monotonic() + 120
        stable = 0
        while time.monotonic() < deadline and stable < 4:
            if worker.proc.poll() is not None:           # as a supervisor would
                exits.append(worker.proc.returncode)
                worker = WorkerProcess(b.bootstrap, topics, group=group, log_path=log)
            now = [i for i in read_incidents(b.bootstrap, topics) if i["job_id"][:2] == "b."]
            stable = stable + 1 if len(now) == len(got) and len(got) >= len(ref) else 0
            got = now
            time.sleep(1.0)
    finally:
        if worker is not None:
            worker.stop()
        b.stop(1)
    text = log.read_text(errors="replace")
    raw = log.read_bytes()
    # the first worker's tail (with faulthandler's dump if it crashed), then the last lines
    first = raw[:first_end].decode(errors="replace")
    # a SIGSEGV in a librdkafka thread prints no faulthandler dump (those threads block
    # every signal): only a core file (ulimit -c unlimited; it lands in the cwd) says where
    hint = "" if "Fatal Python error" in first or -11 not in exits else \
        "(-11 without a Python dump: a native thread crashed; rerun with ulimit -c unlimited)\n"
    assert exits == [70], (f"{hint}first worker's log tail:\n{first[-12000:]}\n"
                           f"--- whole log's tail:\n{text[-3000:]}")
    assert "the broker lost the worker's topics" in text
    assert "_on_published error" not in text
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)


@pytest.mark.integration
def test_an_outage_longer_than_a_snapshot_flush_skips_snapshots_not_the_worker(tmp_path):
    """The broker unreachable for 15 s (a network cut, data kept): a snapshot's 10 s flush
    timed out and the worker exited 70. Now the snapshot is skipped and retried, the worker
    keeps running, and its incidents are still exactly the offline Detector's."""
    proxy_port, broker_port = free_port(), free_port()
    proxy = Proxy(proxy_port, broker_port)
    b = start_broker(broker_port, advertised_port=proxy_port)
    bootstrap = f"127.0.0.1:{proxy_port}"
    via = SimpleNamespace(bootstrap=bootstrap)
    topics = Topics("cut.")
    log = tmp_path / "worker.log"
    events = scenario_events("gpu_thermal_30", "c")
    ref = reference(events)
    first = [i for i in ref if i["status"] == "open"][0]
    cut = next(n for n, e in enumerate(events) if e["ts"] > first["ts"] + 5.0)
    worker: WorkerProcess | None = None
    try:
        wait_for_metadata(bootstrap)
        create_topics(bootstrap, topics)
        worker = WorkerProcess(bootstrap, topics, group="cut.g", log_path=log,
                               extra=["--snapshot-interval", "0.5"])
        publish(via, topics, events[:cut])
        assert wait_for_incidents(bootstrap, topics, 1, timeout=90, settle=2.0)
        proxy.cut()
        time.sleep(15)
        proxy.restore()
        survived = worker.proc.poll() is None
        publish(via, topics, events[cut:])
        got = wait_for_incidents(bootstrap, topics, len(ref), timeout=90)
        still = worker.proc.poll() is None
    finally:
        code = worker.stop() if worker is not None else None
        b.stop(1)
        proxy.cut()
    text = log.read_text(errors="replace")
    assert survived and still, text[-3000:]
    assert code == 0
    assert "snapshots are skipped until the broker takes them again" in text
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)


@pytest.mark.integration
def test_input_topics_recreated_under_a_running_worker_lose_nothing_and_restart_nothing(
        tmp_path):
    """An operator deletes and recreates the input topics while the worker runs (the broker
    keeps running). faust's rebalance on the metadata change reads the new topics from
    their start: the job published afterwards gives exactly the offline Detector's
    incidents, and the worker's topic watch (which watches the input topics' ids too, to
    commit their start when the broker lost everything) does not restart the worker."""
    from confluent_kafka.admin import AdminClient

    port = free_port()
    b = start_broker(port, log_path=tmp_path / "tansu.log")
    topics = Topics("recreate.")
    log = tmp_path / "worker.log"
    worker: WorkerProcess | None = None
    before = scenario_events("gpu_thermal_30", "a")
    after = scenario_events("input_stall_50", "b")
    ref = reference(after)
    try:
        create_topics(b.bootstrap, topics)
        worker = WorkerProcess(b.bootstrap, topics, group="recreate.g", log_path=log)
        publish(b, topics, before)
        assert wait_for_incidents(b.bootstrap, topics, 1, timeout=90, settle=2.0)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for fut in admin.delete_topics(topics.inputs(), operation_timeout=10).values():
            fut.result()
        time.sleep(1.0)
        create_topics(b.bootstrap, topics)
        publish(b, topics, after)
        deadline = time.monotonic() + 120
        got: list[dict] = []
        stable = 0
        while time.monotonic() < deadline and stable < 5 and worker.proc.poll() is None:
            now = [i for i in read_incidents(b.bootstrap, topics) if i["job_id"][:2] == "b."]
            stable = stable + 1 if len(now) == len(got) and len(got) >= len(ref) else 0
            got = now
            time.sleep(1.0)
        running = worker.proc.poll() is None
    finally:
        if worker is not None:
            worker.stop()
        b.stop(1)
    text = log.read_text(errors="replace")
    assert running, text[-3000:]
    assert "the broker lost the worker's topics" not in text
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)


READER = r"""
import json, sys, time
from failslow.streams.route_stage import HostMapReader
from failslow.streams.routing import HostMap

hostmap = HostMap()
reader = HostMapReader(sys.argv[1], sys.argv[2], 4, hostmap, fetch_wait_ms=100)
reader.start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    known = sorted(h for h in ("a", "b") if hostmap.partitions(h, time.time()))
    print(json.dumps(known), flush=True)
    time.sleep(0.2)
"""


@pytest.mark.integration
def test_the_host_map_reader_survives_its_topic_deleted_and_created_again(tmp_path) -> None:
    """The worker's topic watch recreates the host-map topic after a broker restart lost
    it (and an operator may). A librdkafka reader of it died of SIGSEGV there (librdkafka
    2.16.0: a KIP-951 leader update with no topic id or name; 4 of 4 runs of this test):
    the worker exited -11 instead of 70. The reader, in a child process so that a crash
    cannot take pytest with it, keeps running and reads the new topic."""
    import sys

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    b = start_broker(free_port())
    topic = "hm.internal.hostmap"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})

    def create_and_announce(host: str, partition: int) -> None:
        admin.create_topics([NewTopic(topic, 4, 1)])[topic].result()
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce(topic, orjson.dumps({"host": host, "partition": 1}), partition=partition)
        assert p.flush(10) == 0

    def wait_for(child: subprocess.Popen, host: str) -> bool:
        assert child.stdout is not None
        deadline = time.monotonic() + 30
        for line in child.stdout:
            if host in orjson.loads(line) or time.monotonic() > deadline:
                return host in orjson.loads(line)
        return False

    child = None
    try:
        create_and_announce("a", 1)
        child = subprocess.Popen([sys.executable, "-c", READER, b.bootstrap, topic],
                                 stdout=subprocess.PIPE, stderr=open(tmp_path / "r.log", "wb"))
        assert wait_for(child, "a")
        for fut in admin.delete_topics([topic], operation_timeout=10).values():
            fut.result()
        time.sleep(0.5)
        # on a partition it had read nothing from: one it had read keeps its position (every
        # client's does on Tansu; the worker restarts after a recreation anyway)
        create_and_announce("b", 2)
        learnt = wait_for(child, "b")
        code = child.poll()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        b.stop(1)
    err = (tmp_path / "r.log").read_text(errors="replace")[-3000:]
    assert code is None, f"the reader died ({code}): {err}"
    assert learnt, err


@pytest.mark.integration
def test_a_worker_whose_host_map_topic_is_recreated_exits_70_not_sigsegv(tmp_path) -> None:
    """The whole worker, its host-map topic deleted and created again under it (what its
    own topic watch does after a broker restart, or an operator): it notices, says so
    and exits 70. With a librdkafka host-map reader it died of SIGSEGV (3 of 3 runs)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    b = start_broker(free_port(), log_path=tmp_path / "tansu.log")
    topics = Topics("hmre.")
    log = tmp_path / "worker.log"
    worker: WorkerProcess | None = None
    name = "hmre.internal.hostmap"
    try:
        create_topics(b.bootstrap, topics)
        worker = WorkerProcess(b.bootstrap, topics, group="hmre.g", log_path=log)
        publish(b, topics, scenario_events("gpu_thermal_30", "a"))
        assert wait_for_incidents(b.bootstrap, topics, 1, timeout=90, settle=2.0)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        parts = len(admin.list_topics(name, timeout=10).topics[name].partitions)
        for fut in admin.delete_topics([name], operation_timeout=10).values():
            fut.result()
        time.sleep(0.3)
        with contextlib.suppress(Exception):   # the worker's watch may have made it first
            admin.create_topics([NewTopic(name, parts, 1)])[name].result()
        try:
            code = worker.proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        if worker is not None:
            worker.stop()
        b.stop(1)
    text = log.read_text(errors="replace")
    assert code == 70, text[-3000:]
    assert "the broker lost the worker's topics" in text
