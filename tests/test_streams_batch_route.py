"""The worker's path for a host's columnar batches (issue 31): the route finds a
``comm_batch`` message's job from its key and its shards from its rank column without a
decode, and the job stage's one-pass decode gives what ``decode_lenient`` gives (the valid
batches kept whole)."""

from __future__ import annotations

import orjson

from failslow.schema import decode_lenient
from failslow.schema.batches import expand, to_batch
from failslow.streams.job_stage import decode_value
from failslow.streams.routing import job_of_key
from failslow.streams.sharding import shard_parts

_ROW: dict = {}


def _comm(rank: int) -> dict:
    """A simulator's comm window, as rank ``rank`` of host h0."""
    if not _ROW:
        from failslow.simulator import simulate
        from failslow.simulator.scenarios import SCENARIOS

        name = next(iter(SCENARIOS))
        _ROW.update(next(e for e in simulate(SCENARIOS[name], seed=0, steps=2,
                                             grain="comm").events() if e["kind"] == "comm"))
    return dict(_ROW, host="h0", rank=rank, ts=_ROW["ts"] + rank * 0.001)


def _batch(ranks: list[int]) -> dict:
    rows = [_comm(r) for r in ranks]
    assert decode_lenient(orjson.dumps(rows))[1] == []
    return to_batch(rows)


def test_a_comm_batch_message_names_its_job_by_its_key():
    value = orjson.dumps([_batch([0, 1])])
    assert job_of_key("team/j7", value) == "team/j7"
    assert job_of_key("", value) is None


def test_a_batch_of_one_shard_goes_on_whole_and_a_straddling_one_is_cut():
    assert shard_parts(orjson.dumps([_batch([0, 1, 2, 3])]), 4) is None
    parts = shard_parts(orjson.dumps([_batch([2, 3, 4, 5])]), 4)
    assert parts is not None and sorted(parts) == [0, 1]
    got = {k: [r for b in orjson.loads(v) for r in expand(b)] for k, v in parts.items()}
    assert [r["rank"] for r in got[0]] == [2, 3] and [r["rank"] for r in got[1]] == [4, 5]
    # a rank column the pattern cannot read is decoded: its errors are the home's
    bad = orjson.dumps([_batch([0, 1])]).replace(b'"rank":[0,1]', b'"rank":[0,"x"]')
    assert shard_parts(bad, 4) is None


def test_the_one_pass_decode_of_batches_is_decode_lenient():
    good = orjson.dumps([_batch([0, 1]), _batch([2, 3])])
    events, errors = decode_value(good, frozenset(("comm", "collective")))
    # kept whole (the Detector takes them so); their rows are decode_lenient's
    assert events == orjson.loads(good) and errors == []
    rows = [r for b in events for r in expand(b)]
    assert (rows, errors) == decode_lenient(good, frozenset(("comm", "collective")))
    assert [e["rank"] for e in rows] == [0, 1, 2, 3]
    # one bad row: the same valid rows and error lines as decode_lenient
    b = _batch([0, 1])
    b["ts"] = [10.0, "late"]
    value = orjson.dumps([b, _batch([2])])
    assert decode_value(value) == decode_lenient(value)
    assert decode_value(value)[1]
    # a row of a kind the topic does not carry
    assert decode_value(good, frozenset(("step",))) == decode_lenient(good,
                                                                      frozenset(("step",)))


def test_a_batch_read_as_one_shard_from_its_column_is_what_split_batch_gives():
    from failslow.schema.batches import split_batch
    from failslow.streams.sharding import batch_shard, event_shard

    def cut(b: dict) -> dict:
        return split_batch(b, lambda row: event_shard(row, 4))

    for ranks in ([4, 5, 6, 7], [8], [2, 3, 4, 5], [0, 1]):
        b = _batch(ranks)
        k = batch_shard(b, 4)
        assert (k is None) == (len(cut(b)) > 1)
        if k is not None:
            assert cut(b) == {k: [b]}
    # what the column cannot say alone goes to split_batch: a rank absent from a row,
    # a rank that is not an int, a rank column shorter than the others
    b = _batch([4, 5])
    assert batch_shard(dict(b, rank=[4, True]), 4) is None
    assert batch_shard(dict(b, rank=[4]), 4) is None
    assert batch_shard(dict(b, absent={"rank": [1]}), 4) is None
    # a message of shard-1 batches: each goes whole to shard 1, as before
    value = orjson.dumps([_batch([4, 5]), _batch([6, 7])])
    parts = shard_parts(value, 4)
    assert parts is not None and list(parts) == [1]
    assert orjson.loads(parts[1]) == orjson.loads(value)
