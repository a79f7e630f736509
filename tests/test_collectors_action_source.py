"""Action sources (issue 32): a rank reads its job's actions from a real Tansu broker (its
own consumer, in a thread) or from the file the host agent appends to; ``poll`` never
blocks and hands over only this job's actions."""

from __future__ import annotations

import time

import orjson
import pytest

from failslow.collectors.action_sources import FileActionSource, KafkaActionSource
from failslow.collectors.publisher import Publisher


def _action(job: str, version: int) -> dict:
    return {"v": 1, "kind": "action", "ts": 1000.0 + version, "action_id": f"{job}:{version}",
            "job_id": job, "incident_id": f"{job}:slow_rank:1:0",
            "type": "rebalance_microbatches", "mode": "apply", "apply_at_step": 10,
            "expires_ts": 2000.0, "shares": [0.6, 0.4], "reason": "r", "version": version}


@pytest.mark.integration
def test_kafka_source_hands_over_only_its_job_without_blocking(broker, topics):
    src = KafkaActionSource(broker.bootstrap, "job-a", topic=topics.for_kind("action"))
    try:
        t0 = time.monotonic()
        assert src.poll() == []
        assert time.monotonic() - t0 < 0.05
        pub = Publisher(broker.bootstrap, topics)
        pub.publish([_action("job-b", 1), _action("job-a", 2), _action("job-a", 3)])
        assert pub.flush(10) == 0
        pub.close()
        got: list[dict] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += src.poll()
            time.sleep(0.05)
        assert [a["version"] for a in got] == [2, 3]
    finally:
        src.close()


def test_file_source_reads_appended_lines_and_waits_for_a_cut_one(tmp_path):
    path = tmp_path / "actions.jsonl"
    src = FileActionSource(path)
    assert src.poll() == []                              # no file yet: no action
    line = orjson.dumps(_action("j", 1))
    path.write_bytes(line + b"\n" + line[:20])           # the second line is being written
    assert [a["version"] for a in src.poll()] == [1]
    with open(path, "ab") as f:
        f.write(line[20:] + b"\nnot json\n")
    assert [a["version"] for a in src.poll()] == [1]
    assert src.poll() == []


@pytest.mark.integration
def test_the_host_agent_relays_each_job_s_actions_to_its_file(broker, topics, tmp_path):
    from failslow.collectors.action_sources import ActionRelay

    relay = ActionRelay(KafkaActionSource(broker.bootstrap, None,
                                          topic=topics.for_kind("action")), tmp_path).start()
    ranks = [FileActionSource(ActionRelay.path_for(tmp_path, job)) for job in ("a", "b")]
    try:
        pub = Publisher(broker.bootstrap, topics)
        pub.publish([_action("a", 1), _action("b", 2), _action("a", 3), _action("../x", 4)])
        assert pub.flush(10) == 0
        pub.close()
        deadline = time.monotonic() + 30
        while relay.relayed < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [a["version"] for a in ranks[0].poll()] == [1, 3]
        assert [a["version"] for a in ranks[1].poll()] == [2]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["actions-a.jsonl",
                                                              "actions-b.jsonl"]
    finally:
        relay.stop()


class _Once:
    def __init__(self, actions):
        self.actions = actions

    def poll(self):
        out, self.actions = self.actions, []
        return out


def test_balanced_sampler_follows_the_distributed_sampler_s_order_and_the_shares():
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    from failslow.collectors.actions import BalancedSampler, Mitigation

    # one real process group of one rank, standing for rank 1 of 3 data-parallel ranks
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        go = {**_action("j", 1), "shares": [0.5, 0.25, 0.25], "apply_at_step": 1,
              "expires_ts": 4e9}
        mit = Mitigation(_Once([go]), "j", dp_rank=1, dp_size=3)
        data = list(range(40))
        ds = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
        sampler = BalancedSampler(ds, 12, mit)
        sampler.set_epoch(2)
        order = list(iter(ds))            # the DistributedSampler's own epoch order
        batches = list(sampler)
        assert len(batches) == len(sampler) == 3
        assert batches[0] == order[4:8]           # equal shares: rank 1 takes 4 of 12
        assert batches[1] == order[12 + 6:12 + 9]  # from step 1: 6, 3, 3
        assert mit.loss_scale() == 3 * 3 / 12
    finally:
        dist.destroy_process_group()
