"""Scenarios the paging policy is judged on (issue 30; ``bench/detect_quality.py --policy``).

Written from the physics of each disturbance, not tuned to a trace. With 1 s steps a slowed
step lasts ``1 + 0.88 x`` to ``1 + x`` seconds (the compute share of a step, ``x`` the slowdown),
so a transient of ``n`` slowed steps is a window of ``n - 0.3`` steps of ``1 + x`` s: the step that
starts after it runs at full speed.

- benign transients of 1-3 steps, of any size: no loud incident;
- a host on a slower GPU SKU from step 0, a pipeline stage heavier by design: the layout,
  recorded, never paged;
- a thermal ramp (the slowdown grows as the GPU heats), a flapping rank (one incident),
  two culprits at once, a rank slow twice (two incidents), a 1.5x rank for 20 steps that
  recovers (resolved within 10 steps, nothing loud after it).
"""

from __future__ import annotations

from failslow.simulator.spec import FaultSpec as F
from failslow.simulator.spec import JobSpec, Scenario

DP16 = (JobSpec(),)
HYB32 = (JobSpec(hosts=4, tp=4, pp=2, micro_batches=4),)
PP64 = (JobSpec(hosts=8, tp=8, pp=4, micro_batches=8),)


def burst(start: float, steps: int, x: float, rank: int, share: float = 1.0) -> F:
    """A transient of ``steps`` slowed steps of one rank, ``x`` slower, at 1 s steps;
    ``share``: the part of a step the rank's compute stretches (less under a pipeline,
    whose bubbles absorb some of it)."""
    return F("transient", start, start + (steps - 0.3) * (1.0 + share * x), x, rank=rank)


POLICY: tuple[Scenario, ...] = (
    Scenario("transients_16", "16-rank DP: single ranks 1.5-3x slower for 1, 2 or 3 steps, "
             "then normal (benign)", DP16,
             faults=(burst(25, 1, 1.0, 3), burst(40, 2, 0.5, 8), burst(55, 3, 2.0, 12),
                     burst(75, 3, 0.5, 1), burst(95, 2, 1.0, 14)), tags=("policy",)),
    Scenario("transients_hybrid_32", "hybrid 32 (tp4 pp2): a rank 2x for 2-3 steps, another "
             "3x for 2 steps, another 1.5x for 1 step (benign)", HYB32,
             faults=(burst(30, 3, 1.0, 9, 0.6), burst(60, 2, 2.0, 22, 0.5),
                     burst(90, 1, 0.5, 5)),
             tags=("policy",)),
    Scenario("slow_sku_16", "16-rank DP: host h1's GPUs are a slower SKU, 12 % from the "
             "first step (the layout, benign)", DP16,
             faults=(F("slow_sku", 0, None, 0.12, host="h1"),), tags=("policy",)),
    Scenario("heavy_stage_64", "64 ranks tp8 pp4: the last stage has 1.5x the layers, from "
             "the first step (the layout, benign)", PP64, steps=90,
             faults=(F("heavy_stage", 0, None, 0.5, stage=3),), tags=("policy",)),
    Scenario("thermal_ramp_16", "16-rank DP: rank 6 heats up, its slowdown ramps to 35 % over "
             "20 s, 30-90 s", DP16,
             faults=(F("gpu_thermal", 30, 90, 0.35, rank=6, ramp_s=20.0),), tags=("policy",)),
    Scenario("flapping_16", "16-rank DP: rank 9 flaps, 40 % slower 4 s of every 8 s, "
             "30-90 s", DP16,
             faults=(F("gpu_thermal", 30, 90, 0.4, rank=9, period_s=8.0),), tags=("policy",)),
    Scenario("two_culprits_32", "hybrid 32: rank 4 power-capped 25 % and rank 27's clock "
             "30 % low at the same time", HYB32,
             faults=(F("gpu_power", 30, 90, 0.25, rank=4),
                     F("gpu_clock", 35, 95, 0.3, rank=27)), tags=("policy",)),
    Scenario("slow_twice_16", "16-rank DP: rank 11's clock 30 % low twice, 30-50 s and "
             "80-100 s", DP16,
             faults=(F("gpu_clock", 30, 50, 0.3, rank=11),
                     F("gpu_clock", 80, 100, 0.3, rank=11)), tags=("policy",)),
    Scenario("recovery_16", "16-rank DP: rank 2 1.5x for 20 steps, then back to normal",
             DP16, faults=(F("gpu_thermal", 30, 60, 0.5, rank=2),), tags=("policy",)),
)
