"""`failslow demo`: the whole pipeline on one machine, in the foreground.

A fresh embedded stack (Tansu on a free loopback port, a chdb folder owned by this
process) and a simulated cluster with injected fail-slows, published in (sped-up)
real time through the collectors' publisher. A faust worker (a child process, as in
production) detects; the sink writes raw events and incidents to ClickHouse; the
notifier prints incidents as they arrive. At the end: a summary against the
simulator's ground truth, and the SQL to look further.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from failslow.config import Settings
from failslow.embedded import PLAINTEXT_FLAGS, start_broker
from failslow.errors import FailslowError
from failslow.home import private_home
from failslow.schema import Topics
from failslow.worker_process import WorkerProcess

log = logging.getLogger("failslow.demo")


def demo_scenario(steps: int = 110):
    """64 ranks on 8 hosts: a thermal throttle, a congested host NIC, a benign checkpoint
    and a host whose CPUs get stolen, each starting at its own time."""
    from failslow.simulator import FaultSpec, JobSpec, Scenario

    return Scenario(
        "demo", "64-rank DP job: GPU thermal throttle, NIC congestion, checkpoint, CPU "
        "contention", (JobSpec(job_id="llm-pretrain-7b", hosts=8, step_s=1.0),),
        faults=(FaultSpec("gpu_thermal", 20, None, 0.35, rank=13, job="llm-pretrain-7b"),
                FaultSpec("slow_link", 45, None, 0.6, host="h5", job="llm-pretrain-7b"),
                FaultSpec("checkpoint", 68, 74, job="llm-pretrain-7b"),
                FaultSpec("cpu_contention", 82, None, 0.3, host="h2", job="llm-pretrain-7b")),
        steps=steps)


@dataclass
class DemoOptions:
    speed: float = 3.0
    steps: int = 110
    seed: int = 0
    keep_running: bool = False


class _Threads:
    """Background services of the demo; all stop on one event."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self, name: str, target: Any) -> None:
        def body() -> None:
            try:
                target(self.stop)
            except Exception as exc:  # surfaced in the summary, never a silent hang
                self.errors.append(f"{name}: {exc}")
                log.exception("%s failed", name)

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self, timeout: float) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def run_demo(settings: Settings, opts: DemoOptions, out: TextIO = sys.stdout) -> int:
    home = settings.home / "demo"
    if home.exists():
        shutil.rmtree(home)
    private_home(settings.home, create=True)
    home.mkdir(mode=0o700)
    topics = Topics(settings.topic_prefix)
    t0 = time.monotonic()

    _say(out, "failslow demo: starting the embedded stack")
    broker = start_broker(topics, log_path=home / "tansu.log")
    try:
        return _run(settings, opts, out, home, broker, topics, t0)
    finally:
        # The Kafka clients lived in _run's frame and are gone (collected here, some sit
        # in cycles): none is left to log "Disconnected" under the summary when the
        # broker stops.
        gc.collect()
        broker.stop(timeout=2)


def _run(settings: Settings, opts: DemoOptions, out: TextIO, home: Path, broker: Any,
         topics: Topics, t0: float) -> int:
    from failslow.alerting.notifiers import build_notifiers
    from failslow.alerting.service import NotifyService
    from failslow.simulator import simulate
    from failslow.storage.client import connect
    from failslow.storage.embedded import ChdbClient
    from failslow.storage.migrations import migrate
    from failslow.storage.serve import QueryServer
    from failslow.storage.sink import Sink

    folder = home / "chdb"
    threads = _Threads()
    worker: WorkerProcess | None = None
    client = None
    server = None
    try:
        _say(out, f"  broker    Tansu on {broker.bootstrap} (in memory)")
        client = connect(f"chdb://{folder}", own=True)
        assert isinstance(client, ChdbClient)
        migrate(client)
        server = QueryServer(client).start()
        _say(out, f"  database  chdb folder {folder}")

        worker = WorkerProcess(broker.bootstrap, topics, group="failslow-demo-worker",
                               log_path=home / "worker.log",
                               extra=["--home", str(home), *PLAINTEXT_FLAGS])
        sink = Sink(client, broker.bootstrap, topics, group_id="failslow-demo-sink",
                    max_delay_s=0.3)
        threads.start("sink", lambda stop: sink.run(stop))
        notifiers = build_notifiers(
            slack_webhook_url=settings.slack_webhook_url,
            pagerduty_routing_key=settings.pagerduty_routing_key,
            pagerduty_url=settings.pagerduty_url, webhook_url=settings.webhook_url,
            console=True)
        notify = NotifyService(broker.bootstrap, topics, notifiers, home / "notify")
        threads.start("notify", notify.run)
        _say(out, "  streams   faust worker (child process, log in "
                  f"{home / 'worker.log'}); sink and notifier in this process")

        trace = simulate(demo_scenario(opts.steps), seed=opts.seed)
        truth = trace.truth
        _say(out, f"\nsimulating job {truth['job_ids'][0]}: {truth['world_size']} ranks, "
                  f"{opts.steps} steps of ~{truth['step_s']:.1f} s, played {opts.speed:g}x "
                  "faster than real time")
        _say(out, f"  published as its {len(truth['hosts'])} hosts' agents publish: a message "
                  "per host and window (comm_batch, step_batch, gpu_batch, nic_batch)")
        for f in truth["faults"]:
            _say(out, f"  injected  {_target(f):<26} {f['kind']:<15} at +{f['onset_ts'] - truth['start_ts']:.0f} s "
                      f"({f['intensity'] * 100:.0f} % slower)")
        for b in truth["benign"]:
            _say(out, f"  benign    {b['kind']:<42} at +{b['start_ts'] - truth['start_ts']:.0f} s")
        _say(out, "\nincidents as the pipeline reports them:")

        published = _publish(trace, broker.bootstrap, topics, opts.speed, worker, out)
        # Let the last steps travel through worker, sink and notifier.
        _settle(sink, published, timeout=20)
        time.sleep(2.0)
        if opts.keep_running:
            _say(out, "\n--keep-running: the stack stays up; Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):
                while worker.proc.poll() is None:
                    time.sleep(1)
        worker.stop(20)
        worker = None
        threads.join(15)
        rows = client.query(
            "SELECT incident_id, status, fault, severity, rank, host, peer_host, root_cause, "
            "mitigation, slowdown_pct, gpu_hours_lost, onset_ts, detected_ts "
            "FROM incidents_current "
            "ORDER BY detected_ts")
        raw = client.query("SELECT (SELECT count() FROM steps), (SELECT count() FROM comm), "
                           "(SELECT count() FROM collectives)")
        _summary(out, truth, rows, raw, sink, notify, published, time.monotonic() - t0,
                 folder, threads.errors)
        return 1 if threads.errors else 0
    finally:
        if worker is not None:
            worker.stop(20)
        threads.join(5)
        if server is not None:
            server.stop()
        if client is not None:
            client.close()


def _target(f: dict) -> str:
    if f.get("rank") is not None:
        return f"rank {f['rank']} ({f['host']} gpu {f['gpu']})"
    if f.get("nic") is not None:
        return f"{f['host']} NIC {f['nic']}"
    return f"host {f['host']}"


def _publish(trace: Any, bootstrap: str, topics: Topics, speed: float, worker: WorkerProcess,
             out: TextIO) -> int:
    """``_play`` through a Publisher of its own, closed (and dropped) before returning."""
    from failslow.collectors.publisher import Publisher

    pub = Publisher(bootstrap, topics, linger_ms=5)
    published = _play(trace, pub, speed, worker, out)
    if pub.close(timeout=15):
        raise FailslowError("the broker did not acknowledge every event")
    return published


def _agent_chunks(trace: Any) -> Iterator[list[dict]]:
    """The trace as the host agents publish it (``commands.replay.as_agents_publish``: a
    ``comm_batch`` per host and window, a ``step_batch`` per host and step, a ``gpu_batch``
    / ``nic_batch`` per host and sample), cut after each host's step."""
    from failslow.commands.replay import as_agents_publish

    chunk: list[dict] = []
    for ev in as_agents_publish(trace.events()):
        chunk.append(ev)
        if ev["kind"] in ("step_batch", "step"):
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _play(trace: Any, pub: Any, speed: float, worker: WorkerProcess, out: TextIO) -> int:
    """Publish the trace as the host agents would (each batch a message of its own), paced
    to the wall clock; a progress line every ~10 s of job time. Returns the per-rank events
    published (a batch counts its rows, as the sink does)."""
    from failslow.commands.replay import publish_messages, rows, sent_ts

    start = trace.truth["start_ts"]
    wall0 = time.monotonic()
    n = 0
    next_note = 10.0
    for chunk in _agent_chunks(trace):
        t_rel = max(map(sent_ts, chunk)) - start
        delay = t_rel / speed - (time.monotonic() - wall0)
        if delay > 0:
            time.sleep(delay)
        publish_messages(pub, chunk)
        n += sum(map(rows, chunk))
        if t_rel >= next_note:
            _say(out, f"  .. job time +{t_rel:4.0f} s, {n:,} events published")
            next_note += 10.0
        if worker.proc.poll() is not None:
            raise FailslowError(f"the worker exited with code {worker.proc.returncode}; "
                                "see worker.log in the demo folder")
    return n


def _settle(sink: Any, published: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sink.stats.events >= published:
            return
        time.sleep(0.25)


def _summary(out: TextIO, truth: dict, rows: Any, raw: Any, sink: Any, notify: Any,
             published: int, elapsed: float, folder: Path, errors: list[str]) -> None:
    cols, data = rows
    incidents = [dict(zip(cols, r, strict=True)) for r in data]
    _say(out, f"\nsummary ({elapsed:.0f} s wall):")
    steps, comm, collectives = raw[1][0]
    _say(out, f"  events published {published:,}; rows in ClickHouse: steps {steps:,}, comm "
              f"{comm:,}, collectives {collectives:,}; incident changes "
              f"{notify.stats['incidents']}, notifications {notify.stats['queued']}")
    _say(out, f"  incidents ({len(incidents)}):")
    for inc in incidents:
        where = (f"rank {inc['rank']}" if inc["rank"] is not None else "") + \
                (f" host {inc['host']}" if inc["host"] else "") + \
                (f" <-> {inc['peer_host']}" if inc["peer_host"] else "")
        _say(out, f"    {inc['status']:<8} {inc['severity']:<8} {inc['fault']:<12} "
                  f"{where.strip():<22} cause={inc['root_cause'] or '-':<15} "
                  f"action={inc['mitigation'] or '-':<22} {inc['slowdown_pct']:.0f} %"
                  + _lost(inc["gpu_hours_lost"]))
    _say(out, f"  GPU-hours lost to fail-slows: "
              f"{sum(i['gpu_hours_lost'] or 0.0 for i in incidents):.3f}")
    found = 0
    for f in truth["faults"]:
        hit = any(_matches(f, inc) for inc in incidents)
        found += hit
        _say(out, f"  truth: {f['kind']:<15} {_target(f):<26} -> "
                  f"{'FOUND' if hit else 'missed'}")
    _say(out, f"  found {found} of {len(truth['faults'])} injected fail-slows")
    for e in errors:
        _say(out, f"  error: {e}")
    _say(out, "\nwhere to look (the data stays in the folder; each command runs as shown):")
    for cmd in next_commands(folder, truth, incidents, bool(comm)):
        _say(out, f"  {cmd}")


def cli_prefix() -> str:
    """How to run failslow again from the shell that started this one: ``failslow`` when
    that is on PATH, else the console script's path (`make demo` runs .venv/bin/failslow
    with no virtualenv active), else this interpreter with ``-m failslow.cli``."""
    argv0 = sys.argv[0]
    if Path(argv0).name == "failslow":
        here = os.path.abspath(argv0)
        on_path = shutil.which("failslow")
        if on_path and os.path.samefile(on_path, here):
            return "failslow"
        rel = os.path.relpath(here)
        return shlex.quote(here if rel.startswith("..") else rel)
    return f"{shlex.quote(sys.executable)} -m failslow.cli"


def next_commands(folder: Path, truth: dict, incidents: list[dict], comm: bool) -> list[str]:
    """Shell commands into the demo's database (its folder named: it is not the default
    one), quoted so each runs as printed."""
    db = f"{cli_prefix()} query --clickhouse {shlex.quote(f'chdb://{folder}')}"
    job = (truth.get("job_ids") or ["JOB"])[0]
    # Ready-made questions (--list-presets); the simulated job's own clock, not the last 24 h.
    span = (f" --param since={truth['start_ts']:.0f} --param until={truth['end_ts'] + 1:.0f}"
            if "start_ts" in truth and "end_ts" in truth else "")
    sql = [
        "SELECT fault, rank, host, root_cause, mitigation, slowdown_pct, gpu_hours_lost "
        "FROM failslow.incidents_current",
        "SELECT rank, avg(duration_s) FROM failslow.steps GROUP BY rank ORDER BY 2 DESC LIMIT 5",
    ]
    if comm:  # whom each group waits for: its member blocked least (docs/contract.md)
        sql.append("SELECT `group`, argMin(rank, b) AS waited_for, min(b), max(b) FROM "
                   "(SELECT `group`, rank, sum(blocked_s) AS b FROM failslow.comm WHERE n > 0 "
                   "GROUP BY `group`, rank) GROUP BY `group` ORDER BY max(b) - min(b) DESC "
                   "LIMIT 5")
    cmds = [f"{db} {shlex.quote(sql[0])}",
            f"{db} --preset slowest_ranks --param job={shlex.quote(job)}{span}",
            f"{db} --preset gpu_hours_by_host{span}",
            *(f"{db} {shlex.quote(q)}" for q in sql[1:])]
    report = (f"{cli_prefix()} report --clickhouse {shlex.quote(f'chdb://{folder}')}")
    cmds.append(f"{report} --job {shlex.quote(job)}")
    paged = [i for i in incidents if i["severity"] != "info"]
    if paged:
        cmds.append(f"{report} {shlex.quote(paged[0]['incident_id'])}")
    return cmds


def _lost(gpu_hours: float | None) -> str:
    return "" if gpu_hours is None else f", {gpu_hours:.3f} GPU-h lost"


def _matches(f: dict, inc: dict) -> bool:
    if inc["fault"] != f["fault"]:
        return False
    if f["fault"] == "slow_rank":
        return inc["rank"] == f["rank"]
    return inc["host"] == f["host"] or inc["peer_host"] == f["host"]
