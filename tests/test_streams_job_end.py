"""A real ``failslow worker`` on the real Tansu broker ends a job that went silent
(``--job-idle``, event time): its open incident resolves "job ended" on the incidents
topic, byte-identical to the offline Detector with the same setting, and the metric
counts it (issue 17)."""

from __future__ import annotations

import pytest
from test_models_job_end import CUT_TS, telemetry_after
from test_streams_worker import acting, canon, metric, publish

from failslow.models.pipeline import Detector
from failslow.simulator import SCENARIOS, simulate
from failslow.stack import free_port
from failslow.worker_process import WorkerProcess, wait_for_incidents

pytestmark = pytest.mark.integration


def test_the_worker_ends_a_silent_job_like_the_offline_detector(broker, topics):
    events = [e for e in simulate(SCENARIOS["gpu_thermal_30"], seed=0).events()
              if e["ts"] < CUT_TS]
    events += telemetry_after(events, 60.0, every=1.0)
    ref = acting(Detector(job_idle_s=20.0), events)
    ended = [i for i in ref if i.get("resolved_reason") == "job ended"]
    assert ended
    publish(broker, topics, events)
    port = free_port()
    worker = WorkerProcess(broker.bootstrap, topics, group=f"{topics.prefix}g",
                           metrics_port=port, extra=["--job-idle", "20"])
    try:
        got = wait_for_incidents(broker.bootstrap, topics, len(ref), timeout=90)
        assert metric(port, "failslow_stream_jobs_ended_total") == 1
        assert metric(port, "failslow_stream_open_incidents") == 0
    finally:
        assert worker.stop() == 0
    assert canon(got) == canon(ref)
