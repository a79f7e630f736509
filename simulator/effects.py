"""How active injections change the physics of a job at one moment.

Each fault-library kind slows one thing: a GPU-side fault multiplies the target
rank's compute time by (1 + intensity); ``pcie_degraded`` splits its cost
between host-to-device input copies (``data_s``) and compute; ``input_stall``
adds ``intensity * step_s`` of input wait; ``cpu_contention`` slows every rank of
a host (kernel launches and input workers both starve); link faults multiply the
time of transfers that cross the faulty NIC or rank pair (NVLink traffic inside a
host is untouched). Benign ``eval``/``long_seq`` slow the whole job's compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from failslow.simulator.spec import FaultSpec
from failslow.simulator.topology import Layout

GPU_SLOW = ("gpu_thermal", "gpu_power", "gpu_clock", "gpu_errors")


def host_index(name: str) -> int:
    """``"h12"`` -> 12 (the simulator names hosts h0, h1, ...)."""
    return int(name[1:])


@dataclass
class Effects:
    """Multipliers for one job at one moment; arrays are per rank (world,)."""

    compute_mult: np.ndarray
    data_extra_s: np.ndarray
    data_mult: np.ndarray
    nic_mult: np.ndarray
    pairs: list[tuple[int, int, float]]


def physics_effects(faults: list[FaultSpec], lay: Layout, gpus_per_host: int, t_rel: float,
                    step_s: float) -> Effects:
    """The effects of every injection active at ``t_rel`` (seconds since trace start)."""
    w = lay.world
    eff = Effects(np.ones(w), np.zeros(w), np.ones(w), np.ones(w), [])
    for f in faults:
        if not f.active(t_rel):
            continue
        slow = 1.0 + f.level(t_rel)
        k = f.kind
        if k in GPU_SLOW or k == "transient":
            eff.compute_mult[f.rank] *= slow
        elif k == "slow_sku":
            assert f.host is not None  # FaultSpec.check
            eff.compute_mult[lay.host_index == host_index(f.host)] *= slow
        elif k == "heavy_stage":
            eff.compute_mult[lay.pp_rank == f.stage] *= slow
        elif k == "pcie_degraded":
            eff.compute_mult[f.rank] *= 1.0 + (slow - 1.0) / 2
            eff.data_extra_s[f.rank] += (slow - 1.0) / 2 * step_s
        elif k == "input_stall":
            eff.data_extra_s[f.rank] += (slow - 1.0) * step_s
        elif k == "cpu_contention":
            assert f.host is not None  # FaultSpec.check
            on = lay.host_index == host_index(f.host)
            eff.compute_mult[on] *= slow
            eff.data_mult[on] *= slow
        elif k in ("slow_link", "nic_errors"):
            if f.host is None:
                assert f.rank is not None and f.peer_rank is not None  # FaultSpec.check
                eff.pairs.append((f.rank, f.peer_rank, slow))
            else:
                on = lay.host_index == host_index(f.host)
                if f.nic is not None:
                    on &= (lay.gpu % gpus_per_host) == f.nic
                eff.nic_mult[on] = np.maximum(eff.nic_mult[on], slow)
        elif k in ("eval", "long_seq"):
            eff.compute_mult *= slow
    return eff


def pair_mult(eff: Effects, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Time multiplier of transfers between ranks a[i] and b[i] over NICs."""
    m = np.maximum(eff.nic_mult[a], eff.nic_mult[b])
    for x, y, slow in eff.pairs:
        hit = ((a == x) & (b == y)) | ((a == y) & (b == x))
        m = np.where(hit, np.maximum(m, slow), m)
    return m


def group_mult(eff: Effects, members: np.ndarray) -> np.ndarray:
    """Time multiplier of collectives over groups; ``members`` is (..., n, ...) with the
    member axis at 1: a ring collective runs at the pace of its slowest link."""
    m = eff.nic_mult[members].max(axis=1)
    for x, y, slow in eff.pairs:
        hit = (members == x).any(axis=1) & (members == y).any(axis=1)
        m = np.where(hit, np.maximum(m, slow), m)
    return m
