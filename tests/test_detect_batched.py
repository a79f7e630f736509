"""`failslow detect` on a host-batched trace (``comm_batch``, ``step_batch``, ``gpu_batch``,
``nic_batch``) gives
byte-identical incidents to the per-rank trace of the same simulated job."""

from __future__ import annotations

import orjson
import pytest

from failslow.cli import main
from failslow.schema.batches import batch_trace
from failslow.simulator import SCENARIOS, simulate


def _detect(path, capsys) -> tuple[bytes, str]:
    assert main(["detect", str(path)]) == 0
    out = capsys.readouterr()
    return out.out.encode(), out.err


@pytest.mark.parametrize("scenario", ["gpu_thermal_30", "slow_link_host_50"])
def test_batched_and_per_rank_traces_give_the_same_incidents(scenario, tmp_path, capsys):
    per_rank = tmp_path / "per_rank.jsonl"
    simulate(SCENARIOS[scenario], seed=1).write_jsonl(per_rank)
    events = [orjson.loads(line) for line in per_rank.read_bytes().splitlines()]
    batched = tmp_path / "batched.jsonl"
    lines = [orjson.dumps(ev) for ev in batch_trace(events)]
    batched.write_bytes(b"\n".join(lines) + b"\n")
    kinds = {orjson.loads(line)["kind"] for line in lines}
    assert {"comm_batch", "step_batch", "gpu_batch", "nic_batch"} <= kinds
    assert not kinds & {"comm", "step", "gpu", "nic"}
    assert len(lines) < 0.7 * len(events)

    want, want_err = _detect(per_rank, capsys)
    got, got_err = _detect(batched, capsys)
    assert want.count(b"\n") >= 2           # the fault was found: something to compare
    assert got == want
    # the same number of events reached the detector
    assert got_err.splitlines()[-1] == want_err.splitlines()[-1]


def test_simulate_writes_what_the_agents_publish_by_default(tmp_path, capsys):
    plain, batched = tmp_path / "plain.jsonl", tmp_path / "batched.jsonl"
    for path, extra in ((plain, ["--per-rank"]), (batched, [])):
        assert main(["simulate", "gpu_clock_15", "--steps", "60", "--seed", "2",
                     "--out", str(path), *extra]) == 0
    capsys.readouterr()
    kinds = {orjson.loads(line)["kind"] for line in batched.read_bytes().splitlines()}
    assert kinds == {"comm_batch", "gpu_batch", "step_batch", "nic_batch", "host"}
    kinds = {orjson.loads(line)["kind"] for line in plain.read_bytes().splitlines()}
    assert kinds == {"comm", "gpu", "step", "nic", "host"}
    assert (batched.with_name("batched.jsonl.truth.json").read_bytes()
            == plain.with_name("plain.jsonl.truth.json").read_bytes())
    want, _ = _detect(plain, capsys)
    got, _ = _detect(batched, capsys)
    assert want and got == want
