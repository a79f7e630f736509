"""Scenarios with long steps (2, 8 and 30 s), many micro-batches inside each step: a
tensor-parallel all-reduce after every layer (4) of each micro-batch's forward and
backward, pipeline
send/recv per micro-batch, so the ``comm`` windows that close every second inside a
step carry who each group waits for (issue "Seconds, not steps").

Faults begin mid-job or with the job's first step (``start_s=0``: the culprit is slow
from its first op, it has no healthy past); benign stalls are shorter than the
confirmation time (a rank pauses 1.5-2.5 s once, a whole job pauses), and must never
page. Times are seconds since the trace start; the first three steps are warm-up steps,
up to 4x longer (``simulator.physics``), so a 30 s-step job's step 3 starts near 240 s.

Targets vary (rank, stage, replica) and the layouts differ from the short-step library.
"""

from __future__ import annotations

from failslow.simulator.spec import FaultSpec as F
from failslow.simulator.spec import JobSpec, Scenario

# 32 ranks: tp4 pp2 dp4, 8 micro-batches per step
L2 = (JobSpec(hosts=4, tp=4, pp=2, micro_batches=8, step_s=2.0, tp_ops=4),)
L3 = (JobSpec(hosts=4, tp=4, pp=2, micro_batches=8, step_s=3.0, tp_ops=4),)
# 32 ranks: tp8 pp2 dp2, 16 micro-batches
L8 = (JobSpec(hosts=4, tp=8, pp=2, micro_batches=16, step_s=8.0, tp_ops=4),)
# 32 ranks: tp4 pp4 dp2, 16 micro-batches
L8P = (JobSpec(hosts=4, tp=4, pp=4, micro_batches=16, step_s=8.0, tp_ops=4),)
# 32 ranks: tp4 pp2 dp4, 32 micro-batches
L30 = (JobSpec(hosts=4, tp=4, pp=2, micro_batches=32, step_s=30.0, tp_ops=4),)

# warm-up: steps 0-2 last about 4.2x, 2.1x and 1.5x a step
WARM = 7.9


def _at(step_s: float, k: int) -> float:
    """Seconds since the trace start near which step ``k`` (>= 3) begins."""
    return (WARM + k - 3) * step_s


LONG_STEPS = [
    # -- benign --
    Scenario("long8_healthy", "32 ranks tp8 pp2, 8 s steps, healthy", L8, steps=24,
             tags=("long_steps",)),
    Scenario("long30_stalls", "32 ranks tp4 pp2, 30 s steps: single ranks pause 1.5-2.5 s "
             "once inside a step, and the whole job once (benign, shorter than the "
             "confirmation time)", L30, steps=14, tags=("long_steps",),
             faults=(F("gc_spike", _at(30, 4) + 5, intensity=0.05, rank=6),
                     F("gc_spike", _at(30, 6) + 5, intensity=0.08, rank=19),
                     F("gc_spike", _at(30, 8) + 5, intensity=0.06, rank=27),
                     F("gc_spike", _at(30, 10) + 5, intensity=0.05))),
    Scenario("long8_stalls", "32 ranks tp4 pp4, 8 s steps: ranks pause 1.6-2.4 s once, "
             "and a checkpoint (benign)", L8P, steps=30, tags=("long_steps",),
             faults=(F("gc_spike", _at(8, 8) + 2, intensity=0.3, rank=21),
                     F("gc_spike", _at(8, 14) + 2, intensity=0.2, rank=2),
                     F("checkpoint", _at(8, 18) + 1, _at(8, 18) + 9),
                     F("gc_spike", _at(8, 22) + 2, intensity=0.25, rank=30))),
    # -- faults mid-job --
    Scenario("long2_thermal_30", "32 ranks tp4 pp2, 2 s steps: rank 13 throttles 30 % "
             "from step ~24 on", L2, steps=48, tags=("long_steps",),
             faults=(F("gpu_thermal", _at(2, 24), None, 0.3, rank=13),)),
    Scenario("long8_power_25", "32 ranks tp8 pp2, 8 s steps: rank 22 power-capped, 25 %, "
             "for 10 steps", L8, steps=30, tags=("long_steps",),
             faults=(F("gpu_power", _at(8, 14), _at(8, 24), 0.25, rank=22),)),
    Scenario("long8_stage_clock_30", "32 ranks tp4 pp4, 8 s steps: a stage-2 GPU (rank 18) "
             "clock stuck 30 % low; lateness propagates down the pipeline", L8P, steps=28,
             tags=("long_steps",),
             faults=(F("gpu_clock", _at(8, 12), None, 0.3, rank=18),)),
    Scenario("long30_clock_25", "32 ranks tp4 pp2, 30 s steps: rank 5 clock 25 % low for "
             "the last 6 steps", L30, steps=12, tags=("long_steps",),
             faults=(F("gpu_clock", _at(30, 6), None, 0.25, rank=5),)),
    # -- faults from the job's first step --
    Scenario("first1_thermal_40", "16-rank DP, 1 s steps: rank 7 throttles 40 % from the "
             "job's first step (no sub-step evidence: the step rule, from peers)",
             (JobSpec(),), steps=40, tags=("first_step",),
             faults=(F("gpu_thermal", 0, None, 0.4, rank=7),)),
    Scenario("first3_thermal_40", "32 ranks tp4 pp2, 3 s steps: rank 9 throttles 40 % from "
             "the job's first step", L3, steps=30, tags=("long_steps", "first_step"),
             faults=(F("gpu_thermal", 0, None, 0.4, rank=9),)),
    Scenario("first8_errors_30", "32 ranks tp8 pp2, 8 s steps: rank 26 logs ECC errors and "
             "runs 30 % slow from the first step", L8, steps=20,
             tags=("long_steps", "first_step"),
             faults=(F("gpu_errors", 0, None, 0.3, rank=26),)),
    Scenario("first30_power_35", "32 ranks tp4 pp2, 30 s steps: rank 30 power-capped 35 % "
             "from the first step", L30, steps=10, tags=("long_steps", "first_step"),
             faults=(F("gpu_power", 0, None, 0.35, rank=30),)),
]
