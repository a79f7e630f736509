"""Runs of ``comm_batch`` events of one job taken together (issue 31): the detector joins
the hosts' batches that come in a row (``pipeline._comm_run``, ``CommRows.of_batches``) and
takes each batch's rows the way it would take that batch alone, so the incidents are the
same as with each batch given on its own."""

from __future__ import annotations

import copy
import random

import orjson
import pytest

from failslow.models import pipeline
from failslow.models.comm import _JOINED, CommRows
from failslow.models.pipeline import Detector
from failslow.schema.batches import batch_trace
from failslow.schema.events import SchemaError
from failslow.simulator import SCENARIOS, simulate


def _dump(incidents: list[dict]) -> bytes:
    return b"\n".join(orjson.dumps(x, option=orjson.OPT_SORT_KEYS) for x in incidents)


def _alone(events: list[dict]) -> tuple[bytes, int]:
    """Each event given on its own: no run of batches to join."""
    det = Detector()
    out = []
    for e in events:
        out += det.process_batch([e])
    out += det.flush()
    return _dump(out), det.rejected


def _together(events: list[dict], runs: list[int]) -> tuple[bytes, int]:
    det = Detector()
    real = pipeline._comm_run

    def run(evs, k):
        got = real(evs, k)
        runs.append(len(got))
        return got

    pipeline._comm_run = run
    try:
        out = det.process_batch(events) + det.flush()
    finally:
        pipeline._comm_run = real
    return _dump(out), det.rejected


@pytest.mark.parametrize("name,steps", [
    ("long8_stage_clock_30", 17),     # 8 s steps: sub-step judgements mid-step
    ("pipeline_stage_slow", 40),      # pipeline pairs, a slow stage
])
def test_a_run_of_batches_gives_the_incidents_of_each_batch_alone(name, steps):
    events = list(batch_trace(list(simulate(SCENARIOS[name], seed=2, steps=steps).events())))
    runs: list[int] = []
    together, bad = _together(copy.deepcopy(events), runs)
    assert max(runs) >= 4, "no run of batches joined: nothing compared"
    want, want_bad = _alone(events)
    assert b'"severity":"warning"' in want or b'"severity":"critical"' in want, \
        "nothing found: nothing compared"
    assert (together, bad) == (want, want_bad)


def test_a_refused_batch_in_a_run_is_counted_and_the_rest_taken():
    events = list(batch_trace(list(simulate(SCENARIOS["long8_stage_clock_30"], seed=2,
                                            steps=12).events())))
    comm = [i for i, e in enumerate(events) if e["kind"] == "comm_batch"]
    # every fifth comm_batch broken two ways of_batch refuses
    for k, i in enumerate(comm[::5]):
        e = events[i]
        if k % 2:
            e["ts"] = [1.0] * (len(e["rank"]) + 1)      # a column of the wrong length
        else:
            e["absent"] = {"host": [0]}
    runs: list[int] = []
    together, bad = _together(copy.deepcopy(events), runs)
    assert bad == len(comm[::5]) and max(runs) >= 4
    assert (together, bad) == _alone(events)


def _joined(run: list[dict]) -> tuple[CommRows | None, int]:
    parts, bad = [], 0
    for o in run:
        try:
            parts.append(CommRows.of_batch(o))
        except (SchemaError, KeyError, TypeError, ValueError):
            bad += 1
    return (CommRows.joined(parts) if parts else None), bad


def _columns(c: CommRows | None) -> object:
    if c is None:
        return None
    return (c.n, c.job_id, c.at, c.seg, [list(getattr(c, k)) for k in _JOINED])


_BREAK = [
    lambda o: o.pop("step", None), lambda o: o.update(step=[1] * len(o["rank"])),
    lambda o: o.update(step=[1]), lambda o: o.update(ops_len=0),
    lambda o: o.update(ops_len=[o["ops_len"]] * len(o["rank"])),
    lambda o: o["ops"].pop("peer"), lambda o: o.pop("ops_absent", None),
    lambda o: o.update(ops_absent={"peer": [0, -1]}), lambda o: o.update(ops_absent={"n": [0]}),
    lambda o: o.update(absent={"gpu": [0]}), lambda o: o.update(absent={"ts": [0]}),
    lambda o: o.update(host=None), lambda o: o.pop("host"),
    lambda o: o.update(host=["h"] * len(o["rank"])), lambda o: o.update(host=["h"]),
    lambda o: o.update(ts=o["ts"][:-1]), lambda o: o.update(rank=[]), lambda o: o.pop("job_id"),
    lambda o: o["ops"].update(n=o["ops"]["n"][:-1]), lambda o: o["ops"].update(n=3),
    lambda o: o["ops"].update(peer=5), lambda o: o["ops"].update(peer=[1]),
    lambda o: o.update(gpu=None), lambda o: o.update(world_size=[1] * len(o["rank"])),
    lambda o: o.update(ops="x"), lambda o: o.update(ops_len=-1),
    lambda o: o.update(window_start_ts=1.0), lambda o: o.update(ops_absent={"peer": "x"}),
]


def test_batches_read_straight_are_the_batches_read_one_by_one_and_joined():
    events = list(batch_trace(list(simulate(SCENARIOS["pipeline_stage_slow"], seed=1,
                                            steps=4).events())))
    batches = [e for e in events if e["kind"] == "comm_batch"]
    assert any(e.get("ops_absent") for e in batches)
    rng = random.Random(3)
    kinds = set()
    for _ in range(400):
        k = rng.randint(1, 5)
        i = rng.randrange(len(batches) - k)
        run = copy.deepcopy(batches[i:i + k])
        for o in run:
            if rng.random() < 0.4:
                try:
                    rng.choice(_BREAK)(o)
                except (KeyError, TypeError, IndexError):
                    pass
        try:
            want: object = _joined(copy.deepcopy(run))
            want = (_columns(want[0]), want[1])        # type: ignore[index]
        except Exception as exc:  # noqa: BLE001 - of_batch's own errors pass through alike
            with pytest.raises(type(exc)):
                CommRows.of_batches(run)
            kinds.add("raised")
            continue
        got, bad = CommRows.of_batches(run)
        assert (_columns(got), bad) == want
        kinds.add("refused" if bad else "taken")
    assert {"refused", "taken"} <= kinds
