"""simulator.batching gives schema.batches.batch_trace's output exactly, at any cluster size."""

from __future__ import annotations

import orjson
import pytest

from failslow.schema.batches import ROWS_MAX, batch_trace
from failslow.simulator import SCENARIOS, simulate
from failslow.simulator.batching import batch_events, fast_batch


def _lines(events) -> list[bytes]:
    return [orjson.dumps(ev) for ev in events]


@pytest.mark.parametrize("grain", ["comm", "collective"])
@pytest.mark.parametrize("name", ["gpu_thermal_30", "slow_link_pair_3x", "two_jobs_one_ends",
                                  "checkpoints_16"])
def test_same_lines_as_batch_trace(name, grain):
    trace = simulate(SCENARIOS[name], seed=0, steps=12, grain=grain)
    assert _lines(batch_events(trace.events())) == _lines(batch_trace(trace.events()))


def _samples(hosts: int, rounds: int, late: set[int]) -> list[dict]:
    """GPU samples of ``hosts`` hosts of 2 GPUs, host h at h * 0.3 s into each round (a few
    hosts' groups open at once); in round 1 the hosts in ``late`` send GPU 0 twice (a second
    window before the first closed), then GPU 1: a batcher that knows the host puts GPU 1
    with the first window, one that forgot it closed that window at the second."""
    out = []
    for r in range(rounds):
        for h in range(hosts):
            t = r * 10_000.0 + h * 0.3
            gpus = [0, 0, 1] if r == 1 and h in late else [0, 1]
            for i, g in enumerate(gpus):
                dt = 0.2 if r == 1 and h in late and i == 2 else 0.001 * i
                out.append({"v": 1, "kind": "gpu", "ts": t + dt, "host": f"h{h}", "gpu": g,
                            "util_pct": 50 + g, "power_w": 300.0 if g else -0.0,
                            "xid": [] if h % 3 else [94], "rank": None if h % 2 else g})
    out.sort(key=lambda e: e["ts"])
    return out


def test_same_batches_past_the_memory_of_hosts():
    """Over more hosts than the batcher remembers (4 * ROWS_MAX keys), batch_trace forgets
    the hosts not open on every close; so does batch_events (a group then closes on its
    linger instead of once complete)."""
    events = _samples(4 * ROWS_MAX + 200, 3, late={5, 4100, 4200})
    assert _lines(batch_events(events)) == _lines(batch_trace(events))
    few = _samples(50, 3, late={5, 20})
    assert _lines(batch_events(few)) == _lines(batch_trace(few))


def test_fast_batch_takes_what_to_batch_rejects_the_slow_way():
    rows = [{"v": 1, "kind": "gpu", "ts": 1.0, "host": "h0", "gpu": g, "power_w": p}
            for g, p in ((0, 0.0), (1, -0.0))]
    assert fast_batch(rows)["power_w"] == [0.0, -0.0]            # -0.0 is not 0.0
    rows[1]["extra"] = True
    assert fast_batch(rows)["absent"] == {"extra": [0]}          # two shapes: to_batch
    bad = [{"v": 1.0, "kind": "gpu", "ts": 1.0, "host": "h0", "gpu": 0}]
    with pytest.raises(ValueError):
        fast_batch(bad)                                         # v1.0 is not v1
