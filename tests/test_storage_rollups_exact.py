"""The per-minute rollups stay exact under at-least-once delivery (issue 33 item 4): a batch
written again (the sink after a crash), a trace replayed in other batches, and a
duplicate inside one batch count once, in the raw tables and in steps_1m, comm_1m,
gpu_clocks_1m, nic_1m and the presets that read them. Before, steps_1m summed 3,840 steps
after OPTIMIZE FINAL where there were 1,920."""

from __future__ import annotations

import pytest
from storage_support import ch, minimal_event  # noqa: F401 - fixture

from failslow.storage.guard import readonly_sql
from failslow.storage.presets import PRESETS, bind
from failslow.storage.writer import Writer

pytestmark = pytest.mark.integration
T0 = 1_767_225_600.0  # a whole minute


def _steps() -> list[dict]:
    # 8 ranks x 240 steps of 0.5 s: 1,920 steps over 2 minutes.
    return [{**minimal_event("step", 0), "job_id": "j", "rank": r, "host": f"h{r // 4}",
             "step": s, "ts": T0 + 0.5 * s, "duration_s": 0.5 + 0.01 * r}
            for s in range(240) for r in range(8)]


def _gpu() -> list[dict]:
    # 120 samples of one GPU at 1 s; 60 of them throttled to 1,000 MHz.
    return [{"v": 1, "kind": "gpu", "ts": T0 + i, "host": "h0", "gpu": 3, "uuid": "u3",
             "sm_clock_mhz": 1000.0 if 30 <= i < 90 else 1980.0, "max_sm_clock_mhz": 1980.0,
             "temp_c": 80.0} for i in range(120)]


def _nic() -> list[dict]:
    return [{"v": 1, "kind": "nic", "ts": T0 + i, "host": "h0", "nic": "mlx5_0", "port": 1,
             "tx_bytes_total": 1000 * i, "rx_bytes_total": 0, "tx_pause_total": 500 * i}
            for i in range(120)]


def _comm() -> list[dict]:
    return [{"v": 1, "kind": "comm", "ts": T0 + s, "window_start_ts": T0 + s - 1, "job_id": "j",
             "rank": r, "host": "h0", "step": s,
             "ops": [{"group": "dp0", "group_size": 4, "op": "allreduce", "n": 2,
                      "blocked_s": 0.1, "min_s": 0.04, "max_s": 0.06, "bytes": 1024}]}
            for s in range(90) for r in range(4)]


def _one(ch, sql):  # noqa: F811
    return ch.query(sql)[1][0]


def test_duplicate_deliveries_are_counted_once_in_the_rollups(ch):  # noqa: F811
    w = Writer(ch)
    events = _steps() + _gpu() + _nic() + _comm()
    first = w.write(events)
    assert first.duplicates == 0 and first.rows == 1920 + 120 + 120 + 360
    # The sink re-writes its last batch after a crash; a replay arrives in other batches,
    # with a duplicate inside one of them.
    again = w.write(events)
    assert again.rows == 0 and again.events == 0 and again.duplicates == first.rows
    for i in range(0, len(events), 700):
        assert w.write(events[i:i + 700] + events[i:i + 3]).rows == 0
    for table in ("steps_1m", "comm_1m", "gpu_clocks_1m", "nic_1m"):
        ch.execute(f"OPTIMIZE TABLE {table} FINAL")

    assert _one(ch, "SELECT count() FROM steps") == (1920,)
    assert _one(ch, "SELECT sum(steps), round(sum(duration_s_sum), 6) FROM steps_1m") == \
        (1920, round(sum(e["duration_s"] for e in _steps()), 6))
    assert _one(ch, "SELECT sum(windows), sum(n_sum) FROM comm_1m") == (360, 720)
    assert _one(ch, "SELECT sum(samples) FROM gpu_clocks_1m") == (120,)
    assert _one(ch, "SELECT sum(samples) FROM nic_1m") == (120,)

    preset = PRESETS["gpu_clock_drops"]
    cols, rows = ch.query(readonly_sql(preset.sql), bind(preset, {
        "since": str(T0 - 30), "until": str(T0 + 150), "min_samples": "1"}))
    (gpu,) = [dict(zip(cols, r, strict=True)) for r in rows]
    assert (gpu["low_samples"], gpu["samples"]) == (60, 120)
    preset = PRESETS["nic_storms"]
    cols, rows = ch.query(readonly_sql(preset.sql), bind(preset, {
        "since": str(T0), "until": str(T0 + 120), "min_per_s": "0"}))
    (nic,) = [dict(zip(cols, r, strict=True)) for r in rows]
    assert nic["samples"] == 120 and nic["pause_per_s"] == 500.0


def test_a_new_row_among_stored_ones_is_written_and_the_first_delivery_wins(ch):  # noqa: F811
    w = Writer(ch)
    steps = _steps()[:16]
    w.write(steps[:8])
    changed = [{**e, "duration_s": 9.0} for e in steps[:8]]  # same keys, other values
    result = w.write(changed + steps[8:])
    assert (result.rows, result.duplicates) == (8, 8)
    assert _one(ch, "SELECT count(), max(duration_s) FROM steps") == \
        (16, max(e["duration_s"] for e in steps))
    # A far-off clock in the batch does not hide a duplicate (two time ranges looked up).
    late = {**steps[0], "ts": T0 + 86400 * 365, "step": 10_000}
    result = w.write([late, steps[1]])
    assert (result.rows, result.duplicates) == (1, 1)
