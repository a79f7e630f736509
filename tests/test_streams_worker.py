"""Real ``failslow worker`` processes on the real Tansu broker: simulator scenarios give the
same incidents as the offline Detector, a kill -9 mid-stream loses and duplicates
nothing, two workers share the work, garbage goes to the dead-letter topic."""

from __future__ import annotations

import urllib.request
from collections import Counter

import orjson
from confluent_kafka import Producer

from failslow.collectors.publisher import Publisher
from failslow.models.acting import ActingDetector
from failslow.models.actions import ActionPlanner, MitigationConfig
from failslow.models.pipeline import Detector
from failslow.schema import Topics
from failslow.simulator import SCENARIOS, simulate
from failslow.stack import free_port
from failslow.streams.snapshots import scan
from failslow.worker_process import WorkerProcess, read_incidents, wait_for_incidents


def two_workers(broker, topics, tmp_path) -> tuple[list[WorkerProcess], list[int], list]:
    """Two ``failslow worker`` processes in one group, each with its own metrics port and
    log file: (workers, their metrics ports, their logs). The caller stops them."""
    ports = [free_port(), free_port()]
    while ports[1] == ports[0]:
        ports[1] = free_port()
    logs = [tmp_path / f"w{n}.log" for n in range(2)]
    workers = [WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g",
                             metrics_port=p, log_path=log)
               for p, log in zip(ports, logs, strict=True)]
    return workers, ports, logs


def scenario_events(name: str, tag: str) -> list[dict]:
    """A scenario's trace with its job and hosts renamed, so several share one broker."""
    out = []
    for ev in simulate(SCENARIOS[name], seed=0).events():
        ev = dict(ev)
        if "job_id" in ev and ev["job_id"] is not None:
            ev["job_id"] = f"{tag}.{ev['job_id']}"
        ev["host"] = f"{tag}-{ev['host']}"
        out.append(ev)
    return out


def acting(det, events: list[dict]) -> list[dict]:
    """The incidents ``det`` gives for ``events`` wrapped as the worker and ``failslow
    detect`` wrap it: planning actions in the default ``suggest`` mode (issue 32), so an
    incident carries the same ``evidence.action``."""
    out = ActingDetector(det, ActionPlanner(MitigationConfig())).process_batch(events)
    return [i for i in out if i["kind"] == "incident"]


def reference(events: list[dict]) -> list[dict]:
    """What ``failslow detect`` emits for these events before its end-of-file flush
    (a stream has no end, so the worker never flushes)."""
    return acting(Detector(), events)


def brief(incidents: list[dict]) -> list[tuple]:
    return sorted((i["incident_id"], i["ts"], i["status"], i.get("root_cause"), i["slowdown_pct"])
                  for i in incidents)


def canon(incidents: list[dict]) -> Counter:
    return Counter(orjson.dumps(i, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
                   for i in incidents)


def publish(broker, topics: Topics, events: list[dict], slice_s: float = 1.0) -> None:
    """Publish in ``ts`` slices of ``slice_s``, as live collectors do (one batch per sample
    interval), so no message spans more event time than a live one would."""
    pub = Publisher(broker.bootstrap, topics)
    start = 0
    for n in range(1, len(events) + 1):
        if n == len(events) or events[n]["ts"] - events[start]["ts"] >= slice_s:
            pub.publish(events[start:n])
            start = n
    assert pub.flush(15) == 0
    pub.close()


def metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def dead_letters(bootstrap: str, topics: Topics) -> list[dict]:
    """Every record on the dead-letter topic, decoded, partition by partition."""
    return [orjson.loads(m.value()) for p in range(4)
            for m in scan(bootstrap, topics.deadletter, p, idle_polls=1)]


SCENARIO_SET = ["gpu_thermal_30", "slow_link_host_50", "gpu_clock_15", "input_stall_50",
                "checkpoints_16"]


def test_scenarios_match_offline_detection_and_garbage_goes_to_deadletter(broker, topics):
    events, ref = [], []
    for name in SCENARIO_SET:
        evs = scenario_events(name, name)
        events += evs
        ref += reference(evs)
    assert ref, "the scenarios must produce incidents"
    events.sort(key=lambda e: e["ts"])
    publish(broker, topics, events)
    raw = Producer({"bootstrap.servers": broker.bootstrap})
    raw.produce(topics.for_kind("step"), b"not json", key=b"gpu_thermal_30.job0")
    raw.produce(topics.for_kind("gpu"), b'{"v":1,"kind":"gpu","ts":1.0}', key=b"gpu_thermal_30-h0")
    raw.produce(topics.for_kind("host"), b'[{"v":2}]')
    raw.produce(topics.for_kind("collective"),
                b'[{"v":1,"kind":"collective"}]', key=b"gpu_thermal_30.job0/dp0")
    assert raw.flush(10) == 0
    port = free_port()
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g", metrics_port=port)
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
        assert brief(got) == brief(ref)
        dead = dead_letters(broker.bootstrap, topics)
        assert metric(port, "failslow_stream_deadletters_total") == len(dead)
        assert metric(port, "failslow_stream_events_total") >= len(events)
        last = {i["incident_id"]: i["status"] for i in ref}
        assert metric(port, "failslow_stream_open_incidents") == list(last.values()).count("open")
        # Every device sample joined the steps it explains (none applied after them).
        assert metric(port, "failslow_stream_late_samples_total") == 0
    finally:
        assert worker.stop() == 0
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)
    assert len(dead) == 4
    assert {d["topic"] for d in dead} == {topics.for_kind(k) for k in
                                          ("step", "gpu", "host", "collective")}
    assert any("not JSON" in d["error"] for d in dead) and any(d["raw"] == "not json" for d in dead)


def test_kill_9_mid_stream_loses_and_duplicates_nothing(broker, topics):
    events = scenario_events("gpu_thermal_30", "k") + scenario_events("input_stall_50", "s")
    events.sort(key=lambda e: e["ts"])
    ref = (reference([e for e in events if e["host"].startswith("k-")])
           + reference([e for e in events if e["host"].startswith("s-")]))
    first = [i for i in ref if i["status"] == "open"][0]
    cut = next(n for n, e in enumerate(events) if e["ts"] > first["ts"] + 5.0)
    publish(broker, topics, events[:cut])
    group = f"{topics.prefix}g"
    worker = WorkerProcess(broker.bootstrap, topics, group=group,
                           extra=["--snapshot-interval", "0.5"])
    try:
        early = wait_for_incidents(broker.bootstrap, topics, 1, timeout=60, settle=2.0)
        assert early, "the worker must have emitted incidents before the crash"
    finally:
        worker.kill()
    assert worker.proc.returncode == -9
    publish(broker, topics, events[cut:])
    worker = WorkerProcess(broker.bootstrap, topics, group=group)
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
    finally:
        assert worker.stop() == 0
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)


def test_two_workers_share_partitions_and_match_one(broker, topics, tmp_path):
    names = ["gpu_thermal_30", "gpu_errors_40", "gpu_clock_15", "input_stall_50"]
    events, ref = [], []
    for name in names:
        evs = scenario_events(name, name)
        events += evs
        ref += reference(evs)
    events.sort(key=lambda e: e["ts"])
    publish(broker, topics, events)
    workers, ports, logs = two_workers(broker, topics, tmp_path)
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
        shares = [metric(p, "failslow_stream_events_total") for p in ports]
        late_samples = sum(metric(p, "failslow_stream_late_samples_total") for p in ports)
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    assert all(s > 0 for s in shares), f"both workers must process events: {shares}"
    assert sum(shares) >= len(events)
    # Two workers emit exactly the incidents of one (and of `failslow detect`): the same
    # ids, times, root causes, mitigations and evidence, whichever worker routed what and
    # in whatever order their partitions were fetched.
    assert late_samples == 0, "device samples reached a job after the steps they explain"
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)
    assert len(read_incidents(broker.bootstrap, topics)) == len(got)


def test_jobs_of_another_shape_match_offline_detection(broker, topics):
    """Jobs not from our simulator (``test_models_generalize``'s generator): an NCCL-Inspector
    -like job (no step events, collectives that name no step), a job whose steps carry only
    ``comm_s``, hosts' clocks up to 50 ms apart. The worker must emit what the offline
    Detector does, and fail on no event."""
    from test_models_generalize import Cluster, trace

    jobs = [Cluster(ranks=32, step_s=0.5, fields="inspector", group="ddp", slow_rank=5,
                    factor=1.5, seed=4, job="insp-1"),
            Cluster(ranks=64, step_s=0.5, fields="comm", tp=True, slow_host=2, factor=1.5,
                    seed=5, job="comm-2")]
    events, ref = [], []
    for c in jobs:
        evs = trace(c)
        # both jobs run at the same time, on their own hosts, in the past: the worker
        # dead-letters events stamped ahead of its own clock (issue 33), and 1.8e9 (2027)
        # once was
        shift = 1.767e9 - evs[0]["ts"]
        for e in evs:
            e["host"] = f"{c.job}-{e['host']}"
            e["ts"] += shift
            if "start_ts" in e:
                e["start_ts"] += shift
        events += evs
        ref += reference(evs)
    assert {(i["fault"], i.get("rank")) for i in ref if i["status"] == "open"} == \
        {("slow_rank", 5), ("slow_host", None)}
    events.sort(key=lambda e: e["ts"])
    publish(broker, topics, events)
    port = free_port()
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g", metrics_port=port)
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
        errors = metric(port, "failslow_stream_detector_errors_total")
        dead = metric(port, "failslow_stream_deadletters_total")
    finally:
        assert worker.stop() == 0
    assert errors == 0 and dead == 0
    assert brief(got) == brief(ref)
    assert canon(got) == canon(ref)


def test_internal_topics_are_created_with_a_retention(broker, topics):
    """Kafka keeps a topic 7 days by default: the job topic (every input event again) and
    the snapshot topic (MBs every few seconds) would fill the broker's disk."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    from failslow.streams.app import WorkerConfig, ensure_internal_topics

    cfg = WorkerConfig(bootstrap=broker.bootstrap, topics=topics, internal_retention_h=2)
    assert ensure_internal_topics(cfg) == 4
    assert ensure_internal_topics(cfg) == 4          # a second worker: they exist, kept
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    got = {}
    for name in ("job", "snapshots", "hostmap"):
        res = ConfigResource("topic", cfg.internal(name))
        conf = admin.describe_configs([res])[res].result(timeout=10)
        got[name] = {k: conf[k].value for k in ("cleanup.policy", "retention.ms", "segment.ms")}
    assert got["job"] == got["snapshots"] == {"cleanup.policy": "delete",
                                              "retention.ms": str(2 * 3_600_000),
                                              "segment.ms": str(1_200_000)}
    assert got["hostmap"]["cleanup.policy"] == "delete"
    assert int(got["hostmap"]["retention.ms"]) >= 3_600_000


def test_a_message_near_the_broker_limit_does_not_stop_the_worker(broker, topics):
    # A valid 999,900-byte array of steps (another job's): routing it on through the
    # internal job topic must not exceed the broker's 1,048,576-byte limit. It is split
    # into smaller parts; the worker neither exits nor loses the events.
    big, n = [], 0
    while sum(len(orjson.dumps(e)) + 1 for e in big) < 999_000:
        big.append({"v": 1, "kind": "step", "ts": 1.7e9 + n, "job_id": "big.job",
                    "rank": n % 64, "world_size": 64, "host": f"big-h{n % 8}", "step": n // 64,
                    "duration_s": 1.0, "note": "x" * 400})
        n += 1
    value = orjson.dumps(big)
    value = value[:-1] + b" " * (999_900 - len(value)) + b"]"
    assert len(value) == 999_900
    raw = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 1_048_576})
    raw.produce(topics.for_kind("step"), value, key=b"big.job")
    # Garbage of the same size: dead-lettered, its raw text cut to fit a message.
    raw.produce(topics.for_kind("step"), b"\x01" * 999_900, key=b"big.job")
    assert raw.flush(10) == 0
    events = scenario_events("gpu_thermal_30", "t")
    ref = reference(events)
    publish(broker, topics, events)
    port = free_port()
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g", metrics_port=port)
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
        assert metric(port, "failslow_stream_events_total") >= len(events) + len(big)
        dead = dead_letters(broker.bootstrap, topics)
    finally:
        assert worker.stop() == 0
    assert brief(got) == brief(ref)
    assert len(dead) == 1 and "not an array that can be split" in dead[0]["error"]
    assert dead[0]["raw"].endswith("[truncated: 999900 bytes]")


def test_a_broker_outage_is_a_few_log_lines_and_sigterm_still_stops_the_worker(tmp_path):
    # Its own broker: this test kills it.
    import signal
    import subprocess
    import time

    from failslow.stack import create_topics, start_broker

    b = start_broker()
    topics = Topics("outage.")
    log = tmp_path / "worker.log"
    worker = None
    try:
        create_topics(b.bootstrap, topics)
        port = free_port()
        worker = WorkerProcess(b.bootstrap, topics, group="outage.g", metrics_port=port,
                               log_path=log, extra=["--stop-timeout", "5"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                metric(port, "failslow_stream_messages_total")
                break
            except OSError:
                time.sleep(0.5)
        time.sleep(3)  # joined its group
        b.stop(0.1)
        time.sleep(10)
        lines_in_outage = log.read_text().count("\n")
        t0 = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        try:
            code = worker.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        stopped_s = time.monotonic() - t0
    finally:
        if worker is not None and worker.proc.poll() is None:
            worker.kill()
        b.stop(1)
    assert code in (0, 75), f"SIGTERM did not stop the worker within 30 s ({code})"
    assert stopped_s < 20
    assert lines_in_outage < 40, log.read_text()[-3000:]
