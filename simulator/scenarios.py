"""The named scenarios: every fault at several intensities and durations, combinations,
pure-benign runs, and sizes from 16 to 4,096 ranks (the big ones are marked large).

Targets vary on purpose (different ranks, hosts, stages) so that no detector can
learn "rank 5 is the culprit". Times are seconds since the trace start; with the
default 1 s steps, step N starts near N seconds (warm-up steps are longer).
"""

from __future__ import annotations

from failslow.simulator.scenarios_long import LONG_STEPS
from failslow.simulator.scenarios_policy import POLICY
from failslow.simulator.spec import FaultSpec as F
from failslow.simulator.spec import JobSpec, Scenario

DP16 = (JobSpec(),)                                              # 2 hosts, 16-way DP
HYB32 = (JobSpec(hosts=4, tp=4, pp=2, micro_batches=4),)         # tp4 pp2 dp4
PP64 = (JobSpec(hosts=8, tp=8, pp=4, micro_batches=8),)          # tp8 pp4 dp2
ZERO32 = (JobSpec(hosts=4, tp=2, pp=1, dp_op="zero"),)           # tp2 dp16, ZeRO

_ALL = [
    # -- benign only --
    Scenario("healthy_16", "16-rank DP job, noise and warm-up only, no faults", DP16),
    Scenario("healthy_hybrid_64", "64 ranks tp8 pp4 dp2, healthy", PP64, steps=80),
    Scenario("checkpoints_16", "16-rank DP, a 6-12 s checkpoint pause every ~35 s (benign)",
             DP16, faults=(F("checkpoint", 30, 38), F("checkpoint", 65, 77),
                           F("checkpoint", 100, 106))),
    Scenario("eval_longseq_32", "hybrid 32 ranks: evaluation phase and longer sequences "
             "slow the whole job (benign job-wide)", HYB32,
             faults=(F("eval", 30, 40, 0.6), F("long_seq", 70, 100, 0.25))),
    Scenario("gc_spikes_16", "single-step GC pauses on single ranks and job-wide (benign)",
             DP16, faults=(F("gc_spike", 25, intensity=0.8, rank=3),
                           F("gc_spike", 50, intensity=1.5, rank=12),
                           F("gc_spike", 80, intensity=0.5))),
    Scenario("restart_16", "a rank restarts: the job stops ~20 s and resumes from the last "
             "checkpoint with a new warm-up (benign)", DP16,
             faults=(F("checkpoint", 30, 36), F("restart", 60, 80, rank=9))),
    Scenario("two_jobs_one_ends", "two 16-rank jobs; job1 ends at 60 s and its GPUs go idle "
             "(benign)", (JobSpec(), JobSpec(job_id="job1", hosts=2, tp=2)),
             faults=(F("job_end", 60, job="job1"),)),
    # -- GPU faults --
    Scenario("gpu_thermal_30", "16-rank DP: rank 5 throttles thermally, 30 % slower, "
             "30-90 s", DP16, faults=(F("gpu_thermal", 30, 90, 0.3, rank=5),)),
    Scenario("gpu_thermal_5", "16-rank DP: subtle 5 % thermal throttle on rank 11 from 40 s "
             "to the end", DP16, faults=(F("gpu_thermal", 40, None, 0.05, rank=11),)),
    Scenario("gpu_thermal_3x_short", "hybrid 32: rank 21 throttles to 3x for 8 s", HYB32,
             faults=(F("gpu_thermal", 50, 58, 2.0, rank=21),)),
    Scenario("gpu_power_20", "hybrid 32: rank 6 power-capped, 20 % slower, 30-100 s", HYB32,
             faults=(F("gpu_power", 30, 100, 0.2, rank=6),)),
    Scenario("gpu_clock_15", "16-rank DP: rank 2's clock stuck low (no reason bits), 15 %",
             DP16, faults=(F("gpu_clock", 35, 95, 0.15, rank=2),)),
    Scenario("pcie_degraded_25", "ZeRO 32: rank 17's PCIe trains down (x4), 25 %", ZERO32,
             faults=(F("pcie_degraded", 30, 100, 0.25, rank=17),)),
    Scenario("gpu_errors_40", "16-rank DP: rank 14 logs ECC/XID errors and slows 40 %", DP16,
             faults=(F("gpu_errors", 45, 100, 0.4, rank=14),)),
    Scenario("pipeline_stage_slow", "64 ranks tp8 pp4: a stage-1 GPU (rank 20) 25 % slower; "
             "lateness propagates down the pipeline", PP64, steps=80,
             faults=(F("gpu_clock", 25, 65, 0.25, rank=20),)),
    # -- network faults --
    Scenario("slow_link_host_50", "16-rank DP: host h1's NICs congested, transfers 50 % "
             "slower (PFC/CNP climb)", DP16,
             faults=(F("slow_link", 30, 90, 0.5, host="h1"),)),
    Scenario("slow_link_pair_3x", "64 ranks pp4: the pipeline link rank 9 <-> 25 at 3x "
             "transfer time", PP64, steps=80,
             faults=(F("slow_link", 25, 65, 2.0, rank=9, peer_rank=25),)),
    Scenario("slow_link_nic_2x", "hybrid 32: one NIC (h2 mlx5_3) at 2x transfer time from "
             "40 s on", HYB32, faults=(F("slow_link", 40, None, 1.0, host="h2", nic=3),)),
    Scenario("nic_errors_flap", "16-rank DP: host h0 NIC symbol errors and link flaps, 60 %",
             DP16, faults=(F("nic_errors", 30, 80, 0.6, host="h0"),)),
    # -- host faults --
    Scenario("cpu_contention_30", "hybrid 32: host h3's CPUs are stolen, its ranks 30 % "
             "slower", HYB32, faults=(F("cpu_contention", 30, 90, 0.3, host="h3"),)),
    Scenario("input_stall_50", "16-rank DP: rank 7's data loader stalls, +50 % step", DP16,
             faults=(F("input_stall", 40, 85, 0.5, rank=7),)),
    Scenario("input_stall_burst", "16-rank DP: rank 10's input stalls 3x for 5 s", DP16,
             faults=(F("input_stall", 60, 65, 2.0, rank=10),)),
    # -- combinations --
    Scenario("thermal_during_checkpoint", "16-rank DP: rank 4 throttles 25 % across a "
             "checkpoint pause", DP16,
             faults=(F("gpu_thermal", 30, 90, 0.25, rank=4), F("checkpoint", 55, 65))),
    Scenario("two_faults", "hybrid 32: rank 13 thermal 30 % and host h0 NIC congestion "
             "at the same time", HYB32,
             faults=(F("gpu_thermal", 30, 90, 0.3, rank=13),
                     F("slow_link", 50, 100, 0.8, host="h0"))),
    Scenario("thermal_two_jobs", "two jobs; job1's rank 3 throttles 40 %, job0 healthy",
             (JobSpec(), JobSpec(job_id="job1", hosts=2, tp=2)),
             faults=(F("gpu_thermal", 30, 90, 0.4, rank=3, job="job1"),)),
    # -- large (benchmarks, demo); not for unit tests --
    Scenario("large_1024", "LARGE 1,024 ranks tp8 pp4 dp32: rank 517 thermal 20 %",
             (JobSpec(hosts=128, tp=8, pp=4, micro_batches=8),), steps=60, large=True,
             faults=(F("gpu_thermal", 20, 50, 0.2, rank=517),)),
    Scenario("large_4096", "LARGE 4,096 ranks tp8 pp8 dp64: host h301 CPU contention 15 % "
             "and a slow link", (JobSpec(hosts=512, tp=8, pp=8, micro_batches=8),), steps=40,
             large=True, faults=(F("cpu_contention", 15, 35, 0.15, host="h301"),
                                 F("slow_link", 20, None, 0.5, rank=1030, peer_rank=1542))),
]

# Long steps (2-30 s), faults from the first step, short stalls: simulator/scenarios_long.py
# The paging policy's cases (transients, the layout, ramps, flaps): simulator/scenarios_policy.py
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (*_ALL, *LONG_STEPS, *POLICY)}

# A slow pipeline point-to-point link whose pair no data-parallel group spans (issue 15;
# models/p2p.py): 64 ranks tp4 pp4 dp4, 2 s steps, each stage on its own two hosts (DP
# groups stay inside a stage); the link rank 22 (h2, stage 1) <-> 38 (h4, stage 2) at 5x
# transfer time from ~step 19 on, the job ~9 % slower.
SCENARIOS["p2p_link_pp"] = Scenario(
    "p2p_link_pp", "64 ranks tp4 pp4, 2 s steps: the pipeline link rank 22 (h2) <-> 38 (h4) "
    "at 5x transfer time from 50 s on (job ~9 % slower; no DP group spans the pair)",
    (JobSpec(hosts=8, tp=4, pp=4, micro_batches=8, step_s=2.0),), steps=60,
    faults=(F("slow_link", 50, None, 4.0, rank=22, peer_rank=38),))
