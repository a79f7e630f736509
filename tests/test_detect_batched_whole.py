"""Batches handed to the detector whole (issue 31): `failslow detect` decodes a
``comm_batch`` / ``gpu_batch`` line without expanding it (its columns validated at once),
the telemetry store takes a host's GPUs as arrays, and the incidents and the store's state
are those of the per-rank trace of the same job, byte for byte. A bad batch costs one
warning line and never the other lines."""

from __future__ import annotations

import math

import orjson
import pytest
from batch_support import detect_all, store_state

from failslow.models.telemetry import TelemetryStore
from failslow.schema.batches import batch_trace, to_batch
from failslow.simulator import SCENARIOS, simulate


# scenarios whose root cause is read from GPU, NIC or host telemetry
@pytest.mark.parametrize("scenario,steps", [("gpu_thermal_30", 60), ("gpu_errors_40", 70),
                                            ("pcie_degraded_25", 60), ("cpu_contention_30", 60),
                                            ("nic_errors_flap", None)])
def test_incidents_and_telemetry_state_are_those_of_the_per_rank_trace(scenario, steps):
    events = list(simulate(SCENARIOS[scenario], seed=2, steps=steps).events())
    batched = list(batch_trace(events))
    assert {"comm_batch", "gpu_batch"} <= {e["kind"] for e in batched}
    want, det_a, warned_a = detect_all([orjson.dumps(e) for e in events])
    got, det_b, warned_b = detect_all([orjson.dumps(e) for e in batched])
    assert not warned_a and not warned_b
    assert want.count(b"\n") >= 1            # something was found: the comparison says much
    assert got == want
    assert store_state(det_b.store) == store_state(det_a.store)
    assert det_b.rejected == det_a.rejected == 0


def test_a_gpu_batch_updates_the_store_as_its_samples_one_by_one():
    events = list(simulate(SCENARIOS["gpu_thermal_30"], seed=4, steps=12).events())
    gpu = [e for e in events if e["kind"] == "gpu"]
    one, whole = TelemetryStore(), TelemetryStore()
    for e in gpu:
        one.observe_gpu(e)
    for b in batch_trace(gpu):
        whole.observe_gpu_batch(b)
    assert len(one.gpus) == 16 and store_state(whole) == store_state(one)
    key = (gpu[0]["host"], gpu[0]["gpu"])
    dev = whole.gpus[key]
    assert dev.n == sum((e["host"], e["gpu"]) == key for e in gpu) > 1
    assert dev.gauges and all(not math.isnan(x) for x in dev.gauges.values())


def _gpu_rows(n: int = 4) -> list[dict]:
    return [{"v": 1, "kind": "gpu", "ts": 1.7e9 + g / 1000, "host": "h0", "gpu": g,
             "uuid": f"U{g}", "temp_c": 40.0 + g, "sm_clock_mhz": 1980.0} for g in range(n)]


def test_a_bad_batch_line_is_one_warning_and_costs_no_other_line():
    good = to_batch(_gpu_rows())
    short = dict(good, temp_c=[1.0])                       # a column of the wrong length
    one_bad = dict(good, temp_c=[40.0, "hot", 42.0, 43.0])  # one row's value of a wrong type
    lines = [orjson.dumps(x) for x in (good, short, one_bad, good)]
    _, det, warned = detect_all(lines)
    assert warned == [(2, "gpu_batch.temp_c: 1 values for 4 rows"),
                      (3, "gpu_batch row 1 (gpu 1): gpu.temp_c: expected a number, got str "
                          "'hot'")]
    # 4 + 4 rows of the good lines and the 3 good rows of line 3 reached the store
    assert det.store.gpus[("h0", 0)].n == 3 and det.store.gpus[("h0", 1)].n == 2


def test_a_job_cut_in_shards_takes_its_batches_as_its_rows():
    """A comm_batch of a job judged in shards (models.shard) goes row by row to its
    ranks' shards: the incidents are the per-rank trace's."""
    from failslow.models.shard import ShardedDetector

    events = list(simulate(SCENARIOS["gpu_thermal_30"], seed=1, steps=60).events())
    outs = []
    for seq in (events, list(batch_trace(events))):
        det = ShardedDetector(shard_ranks=8)
        out = []
        for i in range(0, len(seq), 512):
            out += det.process_batch(seq[i:i + 512])
        out += det.flush() + det.end_jobs()
        assert det.rejected == det.errors == 0
        outs.append([orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY) for x in out])
    assert outs[0] and outs[1] == outs[0]


def test_a_step_batch_is_taken_from_its_columns_and_survives_a_snapshot():
    """A host's ``step_batch`` goes whole to the detector: its rows wait for their step as
    (batch, row) references, no per-rank event made of them; a snapshot taken while steps
    wait restores them, and the run goes on to the per-rank trace's incidents."""
    from failslow.models.pipeline import Detector

    events = list(simulate(SCENARIOS["gpu_thermal_30"], seed=3, steps=50).events())
    batched = list(batch_trace(events))
    assert "step_batch" in {e["kind"] for e in batched}
    assert "step" not in {e["kind"] for e in batched}

    def run(seq: list[dict], snap_at: int | None = None) -> tuple[list[bytes], Detector]:
        det, out = Detector(), []
        for i in range(0, len(seq), 64):
            out += det.process_batch(seq[i:i + 64])
            if snap_at is not None and i // 64 == snap_at:
                pending = [v for row in det.jobs["job0"].pending.values()
                           for v in row.values()]
                assert pending and all(type(v) is tuple and v[0]["kind"] == "step_batch"
                                       for v in pending)
                det = Detector.from_state(orjson.loads(orjson.dumps(det.state_dict())))
        out += det.flush()
        return [orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)
                for x in out], det

    want, det_a = run(events)
    got, det_b = run(batched)
    assert want and got == want
    assert det_b.rejected == det_a.rejected == 0
    # a snapshot while a step's rows wait (chunk 40: the middle of the run)
    snapped, _ = run(batched, snap_at=40)
    assert snapped == want


def test_a_bad_step_batch_is_rejected_whole():
    from failslow.models.pipeline import Detector

    rows = [{"v": 1, "kind": "step", "ts": 1.7e9 + r / 1000, "job_id": "j", "rank": r,
             "world_size": 4, "host": "h0", "step": 0, "duration_s": 1.0} for r in range(4)]
    det = Detector()
    det.process_batch([dict(to_batch(rows), duration_s=[1.0, 1.0])])
    assert det.rejected == 1 and "j" not in det.jobs
    det.process_batch([to_batch(rows)])
    assert det.rejected == 1 and det.jobs["j"].evaluated == 0
