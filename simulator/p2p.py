"""Pipeline point-to-point traffic as other producers name it.

The simulator names the channel between two pipeline neighbours ``pp{a}-{b}``, a
two-member group (as ``collectors.torch_hook`` does: ``p2p{lo}-{hi}``). Megatron-style
jobs send and receive on the *pipeline-parallel group* instead: every stage of one
(data-parallel, tensor-parallel) slot, ``group_size`` the pipeline depth, the other end
named only by ``peer``. ``megatron_groups`` rewrites a trace's ``send`` / ``recv`` ops
(``collective`` events and ``comm`` entries alike) that way, so a detector can be tried on
both namings of the same physics; the truth does not change.

>>> from simulator import SCENARIOS, simulate
>>> trace = simulate(SCENARIOS["slow_link_pair_3x"], seed=0, steps=2, grain="collective")
>>> evs = [e for b in megatron_groups(trace) for e in b if e.get("op") == "send"]
>>> evs[0]["group"], evs[0]["group_size"]
('pipe13', 4)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from failslow.simulator.trace import Trace

P2P = ("send", "recv")


def megatron_groups(trace: Trace) -> Iterator[list[dict[str, Any]]]:
    """``trace.batches()`` with every send/recv moved to its rank's pipeline group
    ``pipe{slot}`` (slot = the rank's position inside its stage), of size the pipeline
    depth; ``seq`` counts the group's ops of each rank."""
    jobs = {j.job_id: j for j in trace.scenario.jobs}
    gpus = trace.scenario.gpus_per_host
    per_stage = {j: spec.hosts * gpus // spec.pp for j, spec in jobs.items()}
    depth = {j: spec.pp for j, spec in jobs.items()}
    seqs: dict[tuple[str, int], int] = {}
    for batch in trace.batches():
        out = []
        for ev in batch:
            kind = ev["kind"]
            if kind == "collective" and ev["op"] in P2P:
                job = ev["job_id"]
                slot = ev["rank"] % per_stage[job]
                key = (job, ev["rank"])
                seq = seqs.get(key, 0)
                seqs[key] = seq + 1
                ev = {**ev, "group": f"pipe{slot}", "group_size": depth[job], "seq": seq}
            elif kind == "comm" and any(e["op"] in P2P for e in ev["ops"]):
                job = ev["job_id"]
                slot = ev["rank"] % per_stage[job]
                ops = [{**e, "group": f"pipe{slot}", "group_size": depth[job]}
                       if e["op"] in P2P else e for e in ev["ops"]]
                ev = {**ev, "ops": ops}
            out.append(ev)
        yield out
