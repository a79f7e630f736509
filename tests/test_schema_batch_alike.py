"""``schema.batches.valid_many``'s layout checks over a chunk's batches of a kind at once
(``_rows_alike``, ``_nested_alike``, issue 31): taken when the batches are written the usual
way (also with ``peer`` absent from some entries, or a host whose ranks have different
entry counts), and never passing a chunk that a batch of fails ``valid`` (a chunk they do
not pass is checked batch by batch, as before them)."""

from __future__ import annotations

import copy
import random

import pytest

from failslow.schema import batches
from failslow.schema.batches import batch_trace, valid, valid_many
from failslow.simulator import SCENARIOS, simulate


def _comm_batches() -> list[dict]:
    events = list(simulate(SCENARIOS["pipeline_stage_slow"], seed=4, steps=4).events())
    out = [e for e in batch_trace(events) if e["kind"] == "comm_batch"]
    assert any(e.get("ops_absent") for e in out) and any(not e.get("ops_absent") for e in out)
    return out


def test_a_chunk_written_the_usual_way_is_checked_at_once(monkeypatch):
    good = _comm_batches()
    # a host whose ranks have different entry counts: one count per row
    odd = copy.deepcopy(good[0])
    lens = odd["ops_len"]
    odd["ops_len"] = [lens] * len(odd["rank"]) if type(lens) is int else lens
    chunk = [*good, odd]
    assert all(map(valid, chunk))
    calls = []
    real = batches._absent_ok
    monkeypatch.setattr(batches, "_absent_ok", lambda *a: calls.append(a) or real(*a))
    assert valid_many(chunk)
    assert calls == []          # no batch checked on its own


LAYOUTS = [
    ("ops_absent", {}), ("ops_absent", None), ("ops_absent", []), ("ops_absent", {"peer": []}),
    ("ops_absent", {"peer": [0, 0]}), ("ops_absent", {"peer": [-1]}),
    ("ops_absent", {"peer": [10**4]}), ("ops_absent", {"peer": [True]}),
    ("ops_absent", {"peer": "x"}), ("ops_absent", {"n": [0]}), ("ops_absent", {"zz": [0]}),
    ("ops_absent", {"peer": [0], "first_seq": [1]}), ("ops_len", 0), ("ops_len", -1),
    ("ops_len", True), ("ops_len", 10**6), ("ops_len", [1]), ("ops_len", [0, "1"]),
    ("absent", None), ("absent", {}), ("absent", []), ("absent", {"gpu": [0]}),
    ("absent", {"ts": [0]}), ("v", True), ("v", 1.0), ("v", 2), ("host", None), ("host", ["h"]),
    ("rank", []), ("rank", "x"), ("zz", [1]), ("ops", []),
]


@pytest.mark.parametrize("seed", range(2))
def test_batches_checked_at_once_pass_only_when_each_passes(seed):
    rng = random.Random(seed)
    good = _comm_batches()
    passed = failed = 0
    for _ in range(600):
        group = copy.deepcopy(rng.sample(good, rng.randint(1, 6)))
        for o in group:
            if rng.random() < 0.3:
                name, value = rng.choice(LAYOUTS)
                if name == "ops_len" and type(value) is list and value == [1]:
                    value = [o["ops_len"] if type(o["ops_len"]) is int else 1] * len(o["rank"])
                o[name] = copy.deepcopy(value)
            if rng.random() < 0.1 and type(o["ops"]) is dict:
                o["ops"]["zz"] = [1] * (len(o["ops"]["group"]) + rng.choice((-1, 0)))
        each = all(map(valid, group))
        together = valid_many(group)
        assert each or not together, group      # never more lenient than each alone
        passed += together
        failed += not each
    assert passed > 50 and failed > 50
