"""``schema.batches.valid``: a batch's columns checked at once, never more lenient than
expanding it and validating every row (``expand_checked``), and true for what the
simulator and ``to_batch`` write; the batch consumers take whole only what it passes."""

from __future__ import annotations

import copy
import math
import random

import pytest

from failslow.schema.batches import expand, expand_checked, take, to_batch, valid, valid_many
from failslow.simulator import SCENARIOS, simulate

BAD_VALUES = [None, "x", True, -1, 0, -0.5, 2**70, 2**40, 1e300, [], [1], [None], {},
              [[1.5]], [["a"]], 1.0, 3, "allreduce", "up", 1e11]


def _batches() -> list[dict]:
    events = list(simulate(SCENARIOS["slow_link_host_50"], seed=3, steps=6).events())
    out = []
    for kind in ("comm", "gpu", "nic"):
        rows = [e for e in events if e["kind"] == kind]
        host = rows[0]["host"]
        out.append(to_batch([e for e in rows if e["host"] == host][:4]))
    return out


def _mutants(batch: dict, rng: random.Random, count: int) -> list[dict]:
    out = []
    n = len(batch.get("rank") or batch.get("gpu") or batch["nic"])
    for _ in range(count):
        m = copy.deepcopy(batch)
        where = m["ops"] if "ops" in m and rng.random() < 0.4 else m
        name = rng.choice(sorted(k for k in where if k != "kind"))
        how = rng.randrange(6)
        value = rng.choice(BAD_VALUES)
        if how == 0:
            where[name] = value
        elif how == 1 and type(where[name]) is list and where[name]:
            where[name][rng.randrange(len(where[name]))] = value
        elif how == 2:
            del where[name]
        elif how == 3:
            where[name] = [value] * (n + rng.choice((-1, 0, 1)))
        elif how == 4:
            m.setdefault("absent", {})[name] = [rng.randrange(-1, n + 1)]
        else:
            where[name + "_extra"] = value
        out.append(m)
    return out


def test_what_the_simulator_and_to_batch_write_is_valid():
    for b in _batches():
        assert valid(b)
        gpu = [b] if b["kind"] in ("gpu_batch", "nic_batch") else []
        for g in gpu:
            assert valid(take(g, [2, 0]))
            assert expand(take(g, [2, 0])) == [expand(g)[2], expand(g)[0]]


@pytest.mark.parametrize("seed", range(3))
def test_valid_is_never_more_lenient_than_the_rows(seed):
    rng = random.Random(seed)
    passed = failed = 0
    for b in _batches():
        for m in _mutants(b, rng, 400):
            rows, errors = expand_checked(m)
            if valid(m):
                passed += 1
                assert not errors, (m, errors)
            else:
                failed += 1
    assert passed and failed > passed / 4     # both sides exercised


def test_a_bad_batch_is_refused_with_one_line_naming_the_field():
    gpu = next(b for b in _batches() if b["kind"] == "gpu_batch")
    gpu["temp_c"] = [1.0]
    assert not valid(gpu)
    rows, errors = expand_checked(gpu)
    assert rows == [] and errors == ["gpu_batch.temp_c: 1 values for 4 rows"]


@pytest.mark.parametrize("seed", range(2))
def test_batches_checked_together_pass_exactly_when_each_passes(seed):
    """``valid_many``: a chunk's batches checked a field at a time over all of them pass
    only when every one passes ``valid`` (and here, whenever they do)."""
    rng = random.Random(seed)
    good = _batches()
    assert valid_many([copy.deepcopy(b) for b in good for _ in range(3)])
    passed = failed = 0
    for b in good:
        for m in _mutants(b, rng, 300):
            group = [copy.deepcopy(x) for x in rng.sample(good, 2)] + [m]
            rng.shuffle(group)
            each = all(valid(o) for o in group)
            assert valid_many(group) == each, m
            assert valid_many([m]) == valid(m), m
            passed += each
            failed += not each
    assert passed and failed


LONG_BAD = [math.nan, math.inf, -math.inf, -0.0, 0.0, 2**63, 2**63 - 1, -(2**63), -(2**63) - 1,
            2**64 - 1, 2**31, -(2**31) - 1, True, 1.0e10, 9.99e9, -1e-300, 1, 3.5, None, "x"]


@pytest.mark.parametrize("seed", range(2))
def test_long_joined_columns_give_the_verdicts_of_min_and_max(seed, monkeypatch):
    """A chunk's joined columns of a few hundred values are bounded by numpy
    (``schema.fast.lo_hi``): the same verdicts as ``min()`` / ``max()`` of the lists,
    NaN, infinities, -0.0, ints beyond 64 bits and bools included."""
    from failslow.schema import fast as schema_fast

    rng = random.Random(seed)
    good = _batches()
    for _ in range(150):
        group = [copy.deepcopy(b) for b in good for _ in range(40)]
        for _ in range(rng.randrange(1, 3)):
            m = rng.choice(group)
            where = m["ops"] if "ops" in m and rng.random() < 0.5 else m
            name = rng.choice(sorted(k for k in where if type(where[k]) is list
                                     and k not in ("kind", "absent")))
            col = where[name]
            if col and type(col[0]) is not list:
                col[rng.randrange(len(col))] = rng.choice(LONG_BAD)
        fast = valid_many(group)
        with monkeypatch.context() as mp:
            mp.setattr(schema_fast, "_NP_MIN", 10**9)        # min() and max() only
            assert valid_many(group) == fast


@pytest.mark.parametrize("seed", range(3))
def test_packed_number_columns_give_the_verdicts_of_each_batch_alone(seed):
    """A chunk's number columns are checked packed (``schema.fast.packed``: one
    ``struct.pack`` per column, the bounds of all columns of a format at once, a bool looked
    for among the 0s and 1s): a chunk passes exactly when every batch passes ``valid`` alone,
    with a bool, a None, a str, NaN, an int beyond 64 or 32 bits or a float in an int column
    in a list or written once, among columns of 0s and 1s or not."""
    rng = random.Random(seed)
    good = _batches()
    # (what orjson decodes: no NaN nor infinity, whose order min() and max() of a short list
    # take by position)
    odd = [x for x in LONG_BAD if type(x) is not float or math.isfinite(x)] + [
        False, 0, 1, 0.0, 1.0, -1, 2**31 - 1, 2**53 + 1, 1e19, -1e19]
    verdicts = set()
    for _ in range(300):
        group = [copy.deepcopy(b) for b in good for _ in range(rng.randrange(1, 4))]
        if rng.random() < 0.5:       # columns of 0s and 1s, where a bool hides
            for b in group:
                if b["kind"] == "nic_batch":
                    b["rx_errors_total"] = [rng.randrange(2) for _ in b["nic"]]
                elif b["kind"] == "gpu_batch":
                    b["ecc_sbe_total"] = rng.randrange(2)
        for _ in range(rng.randrange(0, 3)):
            m = rng.choice(group)
            where = m["ops"] if "ops" in m and rng.random() < 0.5 else m
            name = rng.choice(sorted(k for k in where if k not in (
                "v", "kind", "host", "job_id", "rank", "gpu", "nic", "absent", "ops",
                "ops_len", "ops_absent")))
            col = where[name]
            if type(col) is list and col and type(col[0]) is not list:
                col[rng.randrange(len(col))] = rng.choice(odd)
            elif type(col) is not list:
                where[name] = rng.choice(odd)
        each = all(valid(o) for o in group)
        assert valid_many(group) == each, group
        verdicts.add(each)
    assert verdicts == {True, False}


@pytest.mark.parametrize("seed", range(3))
def test_ordered_pairs_checked_over_joined_columns_as_batch_by_batch(seed):
    """``valid_many`` checks each (low, high) rule (``window_start_ts <= ts``, ``min_s <=
    max_s``, ``first_seq <= last_seq``) over the chunk's joined columns: a pair written as
    two columns, a value for all rows and a column, two values, absent or null in some
    rows, gives the verdict of checking each batch alone."""
    rng = random.Random(seed)
    comm = next(b for b in _batches() if b["kind"] == "comm_batch")
    pairs = [(comm, "window_start_ts", "ts"), (comm["ops"], "min_s", "max_s"),
             (comm["ops"], "first_seq", "last_seq")]
    cases = 0
    for _ in range(300):
        group = [copy.deepcopy(comm) for _ in range(rng.randrange(1, 5))]
        picked = rng.sample(group, rng.randrange(1, len(group) + 1))
        for m in [m for m in picked for _ in range(rng.randrange(1, 4))]:
            top = rng.randrange(len(pairs))
            _, lo, hi = pairs[top]
            where = m if top == 0 else m["ops"]
            if lo not in where or hi not in where:
                continue
            n = len(where[hi]) if type(where[hi]) is list else len(m["rank"])
            how = rng.randrange(5)
            if how == 0:        # one row out of order
                i = rng.randrange(n)
                low = where[lo] if type(where[lo]) is list else [where[lo]] * n
                high = where[hi] if type(where[hi]) is list else [where[hi]] * n
                where[lo] = list(low)
                where[lo][i] = (high[i] or 0) + rng.choice((0, 1, 0.5, -1))
            elif how == 1:      # one value for all rows (in order or not)
                high = where[hi] if type(where[hi]) is list else [where[hi]] * n
                high = [v for v in high if v is not None] or [0]
                where[lo] = rng.choice((min(high), max(high), min(high) - 1))
            elif how == 2 and top == 2:     # null in a row of an optional field
                name = rng.choice((lo, hi))
                if name in where:
                    col = where[name] if type(where[name]) is list else [where[name]] * n
                    where[name] = list(col)
                    where[name][rng.randrange(n)] = None
            elif how == 3 and top == 2:      # absent from the batch
                del where[rng.choice((lo, hi))]
            else:               # the high bound one value for all rows
                low = where[lo] if type(where[lo]) is list else [where[lo]] * n
                low = [v for v in low if v is not None] or [0]
                where[hi] = rng.choice((max(low), min(low)))
        each = all(valid(o) for o in group)
        assert valid_many(group) == each, group
        cases += not each
    assert cases > 30
    # a null in a row leaves the rows after it where they are: (5, 4) is out of order, (5, 5)
    # is not, whichever of its neighbours the null's removal would pair them with
    total = sum(comm["ops_len"]) if type(comm["ops_len"]) is list \
        else comm["ops_len"] * len(comm["rank"])
    for low, high, ok in (([None, 5, 0], [0, 5, 9], True), ([None, 5, 0], [9, 4, 9], False)):
        m = copy.deepcopy(comm)
        m["ops"]["first_seq"] = (low * total)[:total]
        m["ops"]["last_seq"] = (high * total)[:total]
        assert valid(m) == ok
        assert valid_many([m, copy.deepcopy(m)]) == ok
