"""A synthetic GPU training cluster with injected fail-slows, emitting CONTRACT.md events.

>>> from simulator import SCENARIOS, simulate
>>> trace = simulate(SCENARIOS["gpu_thermal_30"], seed=0, steps=5)
>>> sorted({e["kind"] for e in trace.events()})
['comm', 'gpu', 'host', 'nic', 'step']
>>> trace = simulate(SCENARIOS["gpu_thermal_30"], seed=0, steps=5, grain="collective")
>>> sorted({e["kind"] for e in trace.events()})
['collective', 'gpu', 'host', 'nic', 'step']
"""

from failslow.simulator.comm import DEFAULT_WINDOW_S, GRAINS
from failslow.simulator.scenarios import SCENARIOS
from failslow.simulator.schedule import load_schedule, parse_schedule
from failslow.simulator.spec import (
    BENIGN_KINDS,
    FAULT_KINDS,
    FaultSpec,
    JobSpec,
    Scenario,
    SimulatorError,
)
from failslow.simulator.trace import DEFAULT_START_TS, Trace, simulate

__all__ = [
    "BENIGN_KINDS",
    "DEFAULT_START_TS",
    "DEFAULT_WINDOW_S",
    "FAULT_KINDS",
    "GRAINS",
    "SCENARIOS",
    "FaultSpec",
    "JobSpec",
    "Scenario",
    "SimulatorError",
    "Trace",
    "load_schedule",
    "parse_schedule",
    "simulate",
]
