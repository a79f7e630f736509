"""Device telemetry consistent with the simulated workload: gpu, nic and host samples.

Each host samples every ``interval`` seconds at its own phase (collectors are not
synchronized). A GPU's utilization, power and PCIe traffic follow what its rank
did in its latest step: compute at full power, collectives spinning at lower
power (a rank waiting in NCCL still shows ~100 % util), input waits idle. NIC
counters are cumulative and grow with the rank's inter-host traffic (one NIC per
GPU, rail-optimized); healthy NICs see a trickle of PFC pauses, CNPs and ECN
marks and rare bursts, so only a sustained rise means congestion. Healthy GPUs
briefly hit the software power cap now and then. Faults add their signature on
top (see ``docs/schedules.md``). ``gpu_table`` / ``nic_table`` / ``host_table`` turn a
sampling round into event tables (see ``simulator.jsonl``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from failslow.simulator.emit import nullable
from failslow.simulator.jsonl import Choices, Const, Num, Pick, Table
from failslow.simulator.spec import level

MAX_SM_MHZ = 1980.0
IDLE_SM_MHZ = 345.0
MEM_MHZ = 2619.0
POWER_LIMIT_W = 700.0
PCIE_BPS = 55e9          # gen5 x16 usable bytes/s
R_IDLE, R_SW_POWER, R_SW_THERMAL, R_HW_THERMAL, R_HW_BRAKE = 0x01, 0x04, 0x20, 0x40, 0x80
CORES_LOAD = 128.0  # host cores: load1 under full contention is about this many
_NIC_STATE = Choices(["up", "down"])
_NO_XID = Choices([[]])


@dataclass
class Target:
    """Where one injection lands in the cluster (global indices: gpu/nic = host * G + local)."""

    kind: str
    start_s: float
    end_s: float | None
    intensity: float
    gpus: np.ndarray    # GPUs whose own telemetry changes
    nics: np.ndarray    # NIC ports whose counters change
    hosts: np.ndarray   # hosts whose host samples change
    ramp_s: float = 0.0
    period_s: float = 0.0
    duty: float = 0.5

    def active(self, t_rel: float) -> bool:
        return self.start_s <= t_rel and (self.end_s is None or t_rel < self.end_s)

    def level(self, t_rel: float) -> float:
        return level(self.start_s, self.end_s, self.intensity, self.ramp_s, self.period_s,
                     self.duty, t_rel)


def gpu_uuid(host: str, gpu: int) -> str:
    h = hashlib.blake2b(f"{host}/{gpu}".encode(), digest_size=16).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Telemetry:
    """gpu/nic/host samplers for the whole cluster, fed with each step's activity."""

    def __init__(self, n_hosts: int, gpus_per_host: int, targets: list[Target],
                 rng: np.random.Generator, start_ts: float, interval: float):
        self.H, self.G = n_hosts, gpus_per_host
        n = n_hosts * gpus_per_host
        self.targets, self.rng, self.start_ts, self.interval = targets, rng, start_ts, interval
        self.hosts = [f"h{h}" for h in range(n_hosts)]
        self.host_names = Choices(self.hosts)
        self.nic_names = Choices([f"mlx5_{k}" for k in range(gpus_per_host)])
        self.host_of = np.repeat(np.arange(n_hosts), gpus_per_host)
        self.local = np.tile(np.arange(gpus_per_host), n_hosts)
        self.index = np.arange(n)
        self.uuids = Choices([gpu_uuid(self.hosts[h], g) for h, g in zip(
            self.host_of.tolist(), self.local.tolist(), strict=True)])
        self.phase = rng.uniform(0.0, interval, n_hosts)
        self.round = 0
        # Per-GPU activity of the latest step.
        self.active = np.zeros(n, dtype=bool)
        self.f_compute = np.zeros(n)
        self.f_comm = np.zeros(n)
        self.net_bps = np.zeros(n)
        # The job (index into job_names.values[1:]) and rank on each GPU; -1: idle.
        self.job = np.full(n, -1)
        self.rank = np.full(n, -1)
        self.job_names = Choices([None])
        self.rank_names = nullable(n)
        self.pauses: list[tuple[np.ndarray, float, float]] = []
        self.ambient = rng.normal(30.0, 2.5, n)
        self.temp = self.ambient + 5.0
        self.ecc_sbe = rng.integers(0, 3, n) * (rng.random(n) < 0.2)
        self.ecc_dbe = np.zeros(n, dtype=np.int64)
        self.pcie_replay = rng.integers(0, 20, n)
        self.nic = {name: rng.integers(10**9, 10**13, n) for name in ("tx", "rx")}
        for name in ("pause_tx", "pause_rx", "cnp_sent", "cnp_handled", "ecn", "xmit_wait",
                     "oos", "sym", "rx_err", "drops", "down"):
            self.nic[name] = rng.integers(0, 2000, n) * (name not in ("down", "sym", "rx_err"))

    # -- inputs ---------------------------------------------------------------

    def update(self, gpus: np.ndarray, ranks: np.ndarray, job_id: str, t0, end, compute, comm,
               net_bytes) -> None:
        """Record one step's activity for the GPUs of one job (arrays by rank)."""
        dur = np.maximum(end - t0, 1e-9)
        self.active[gpus] = True
        self.f_compute[gpus] = np.clip(compute / dur, 0.0, 1.0)
        self.f_comm[gpus] = np.clip(comm / dur, 0.0, 1.0)
        self.net_bps[gpus] = net_bytes / dur
        if job_id not in self.job_names.values:
            self.job_names = Choices([*self.job_names.values, job_id])
        self.job[gpus] = self.job_names.values.index(job_id) - 1
        self.rank[gpus] = ranks

    def pause(self, gpus: np.ndarray, begin: float, end: float) -> None:
        """The job on ``gpus`` is stopped (checkpoint write, restart) between begin and end."""
        self.pauses.append((gpus, begin, end))

    def release(self, gpus: np.ndarray) -> None:
        """The job on ``gpus`` ended: they go idle."""
        self.active[gpus] = False
        self.job[gpus] = -1
        self.rank[gpus] = -1

    # -- sampling -------------------------------------------------------------

    def next_round_ts(self) -> float:
        return self.start_ts + self.round * self.interval

    def sample_until(self, ts: float) -> list[Table]:
        """Every sample round whose base time is <= ts: its gpu, nic and host tables."""
        out: list[Table] = []
        while self.next_round_ts() <= ts:
            out.extend(self._round(self.next_round_ts()))
            self.round += 1
        return out

    def _round(self, base: float) -> list[Table]:
        rng, n, dt = self.rng, self.H * self.G, self.interval
        t_rel = base - self.start_ts
        busy = self.active.copy()
        ckpt = np.zeros(n, dtype=bool)
        self.pauses = [p for p in self.pauses if p[2] >= base - dt]
        for gpus, b, e in self.pauses:
            if b <= base < e:
                ckpt[gpus] = True
        busy &= ~ckpt
        fc = np.where(busy, self.f_compute, 0.0)
        fw = np.where(busy, self.f_comm, 0.0)
        net = np.where(busy, self.net_bps, 0.0)

        clock_f = np.ones(n)
        reasons = np.where(self.active | ckpt, 0, R_IDLE)
        blip = busy & (rng.random(n) < 0.03)
        reasons = np.where(blip, R_SW_POWER, reasons)
        clock_f = np.where(blip, rng.uniform(0.93, 0.98, n), clock_f)
        limit = np.full(n, POWER_LIMIT_W)
        hot = np.zeros(n)
        width = np.full(n, 16)
        gen = np.full(n, 5)
        xid: dict[int, list[int]] = {}
        starve = np.ones(n)
        cpu_busy = np.zeros(self.H)
        iowait = np.zeros(self.H)
        cong = np.zeros(n)
        errs = np.zeros(n)
        for tg in self.targets:
            i, g = tg.level(t_rel), tg.gpus
            if i <= 0:
                continue
            if tg.kind in ("gpu_thermal", "gpu_power", "gpu_clock"):
                clock_f[g] = 1.0 / (1.0 + i)
                reasons[g] = 0
            if tg.kind == "gpu_thermal":
                reasons[g] = R_SW_THERMAL | (R_HW_THERMAL if i >= 0.5 else 0)
                hot[g] = 86.0 + 3.0 * min(i, 2.0)
            elif tg.kind == "gpu_power":
                reasons[g] = R_SW_POWER | (R_HW_BRAKE if i >= 1.0 else 0)
                limit[g] = POWER_LIMIT_W / (1.0 + i) ** 0.8
            elif tg.kind == "gpu_errors":
                self.ecc_sbe[g] += rng.poisson(20.0 * i, len(g))
                for x in g[rng.random(len(g)) < 0.3].tolist():
                    xid[x] = [int(rng.choice([94, 63, 48] if i >= 1.0 else [94, 63]))]
                if i >= 1.0:
                    self.ecc_dbe[g] += rng.random(len(g)) < 0.1
            elif tg.kind == "pcie_degraded":
                width[g] = 8 if i < 0.5 else 4
                gen[g] = 5 if i < 1.0 else 3
                self.pcie_replay[g] += rng.poisson(5.0 * (1 + i), len(g))
            elif tg.kind == "cpu_contention":
                starve[np.isin(self.host_of, tg.hosts)] = 1.0 + i
                cpu_busy[tg.hosts] = np.maximum(cpu_busy[tg.hosts], min(1.0, 0.6 + i))
            elif tg.kind == "input_stall":
                iowait[tg.hosts] += 4.0 * min(i, 2.0)
            elif tg.kind == "slow_link":
                cong[tg.nics] = np.maximum(cong[tg.nics], i)
            elif tg.kind == "nic_errors":
                errs[tg.nics] = np.maximum(errs[tg.nics], i)

        # A starved GPU (host CPU contention) idles between kernel launches.
        util_c = fc / starve
        power = (75.0 + util_c * 590.0 * clock_f ** 1.5 + fw * 160.0
                 + rng.normal(0.0, 8.0, n)) * np.where(busy | ckpt, 1.0, 0.0) + np.where(
                     busy | ckpt, 0.0, rng.normal(70.0, 3.0, n))
        capped = power >= limit
        power = np.minimum(power, limit * rng.uniform(0.985, 1.0, n))
        reasons = np.where(capped & busy, reasons | R_SW_POWER, reasons)
        temp_target = self.ambient + 0.06 * power
        temp_target = np.where(hot > 0, np.maximum(temp_target, hot), temp_target)
        self.temp += (temp_target - self.temp) * (1.0 - np.exp(-dt / 20.0))
        sm = np.where(busy, MAX_SM_MHZ * clock_f * (1.0 - np.abs(rng.normal(0, 0.004, n))),
                      IDLE_SM_MHZ)
        sm = np.round(sm / 15.0) * 15.0
        util = np.clip(np.round(100.0 * (util_c + fw) + rng.normal(0, 0.7, n)), 0, 100)
        util = np.where(busy, util, np.where(ckpt, rng.integers(0, 6, n), 0))
        cap_bps = PCIE_BPS * width / 16 * np.where(gen >= 5, 1.0, 0.25)
        tx = np.minimum(net + np.where(ckpt, 18e9, 0.0), cap_bps) * rng.uniform(0.97, 1.03, n)
        rx = np.minimum(net * 1.02 + fc * 2e8, cap_bps) * rng.uniform(0.97, 1.03, n)
        self.ecc_sbe += rng.random(n) < 0.0005  # rare correctable errors on healthy GPUs
        gpu = gpu_table(self, base, sm, util, fc, power, limit, reasons, width, gen, tx, rx, xid)
        down = self._nic_update(net, cong, errs)
        return [gpu, nic_table(self, base, down), host_table(self, base, cpu_busy, iowait, ckpt)]

    def _nic_update(self, net: np.ndarray, cong: np.ndarray, errs: np.ndarray) -> np.ndarray:
        """Advance the cumulative NIC counters by one interval; returns ports seen down."""
        rng, c, n, dt = self.rng, self.nic, len(net), self.interval
        gbps = net / 1e9
        # A congested port (PFC/ECN) moves less and is told to pause; the baseline is a
        # trickle proportional to traffic plus rare incast bursts on healthy ports.
        burst = np.where(rng.random(n) < 0.01, rng.uniform(5.0, 30.0, n), 1.0)
        base = gbps * dt * burst
        flap = (errs > 0) & (rng.random(n) < np.minimum(0.25, 0.05 + 0.1 * errs))
        moved = net * dt * np.where(flap, 0.3, 1.0)
        c["tx"] += (moved * rng.uniform(0.99, 1.01, n)).astype(np.int64)
        c["rx"] += (moved * rng.uniform(0.99, 1.01, n)).astype(np.int64)
        pressure = cong * (50.0 + gbps) * dt
        c["pause_rx"] += rng.poisson(0.5 * base + 300.0 * pressure)
        c["pause_tx"] += rng.poisson(0.2 * base + 60.0 * pressure)
        c["cnp_handled"] += rng.poisson(2.0 * base + 900.0 * pressure)
        c["cnp_sent"] += rng.poisson(1.5 * base + 500.0 * pressure)
        c["ecn"] += rng.poisson(1.5 * base + 500.0 * pressure)
        c["xmit_wait"] += rng.poisson(800.0 * base + 4e5 * pressure)
        noise = errs * (20.0 + gbps) * dt
        c["sym"] += rng.poisson(40.0 * noise)
        c["rx_err"] += rng.poisson(3.0 * noise)
        c["drops"] += rng.poisson(5.0 * noise)
        c["oos"] += rng.poisson(0.02 * base + 60.0 * noise)
        c["down"] += flap
        return flap


def gpu_table(tel: Telemetry, base: float, sm, util, fc, power, limit, reasons, width, gen,
              tx, rx, xid: dict[int, list[int]]) -> Table:
    n = len(sm)
    rng = tel.rng
    ts = np.round(base + tel.phase[tel.host_of] + 0.0004 * tel.local, 6)
    mem_util = np.clip(np.round(fc * 38.0 + rng.normal(0, 1.0, n)), 0, 100)
    mem_used = np.where(tel.active, 6.2e10 + tel.local * 1.3e8, 5.1e8).astype(np.int64)
    xids, which = _NO_XID, np.zeros(n, dtype=np.int64)
    if xid:
        xids = Choices([[], *xid.values()])
        which[list(xid)] = np.arange(1, len(xid) + 1)
    return Table([
        ("v", Const(1)), ("kind", Const("gpu")), ("ts", Num(ts, 6)),
        ("host", Pick(tel.host_of, tel.host_names)), ("gpu", Num(tel.local)),
        ("uuid", Pick(tel.index, tel.uuids)), ("sm_clock_mhz", Num(sm, 0)),
        ("max_sm_clock_mhz", Const(1980.0)), ("mem_clock_mhz", Const(2619.0)),
        ("util_pct", Num(util.astype(np.int64))), ("mem_util_pct", Num(mem_util, 0)),
        ("power_w", Num(np.round(power, 1), 1)), ("power_limit_w", Num(np.round(limit, 1), 1)),
        ("temp_c", Num(np.round(tel.temp, 1), 1)),
        ("clocks_event_reasons", Num(reasons.astype(np.int64))), ("pcie_gen", Num(gen)),
        ("pcie_width", Num(width)), ("pcie_max_gen", Const(5)), ("pcie_max_width", Const(16)),
        ("pcie_tx_bytes_s", Num(np.round(tx), 0)), ("pcie_rx_bytes_s", Num(np.round(rx), 0)),
        ("pcie_replay_total", Num(tel.pcie_replay.copy())),
        ("ecc_sbe_total", Num(tel.ecc_sbe.astype(np.int64))),
        ("ecc_dbe_total", Num(tel.ecc_dbe.copy())), ("xid", Pick(which, xids)),
        ("nvlink_crc_errors_total", Const(0)), ("mem_used_bytes", Num(mem_used)),
        ("job_id", Pick(tel.job + 1, tel.job_names)),
        ("rank", Pick(tel.rank + 1, tel.rank_names))], ts)


def nic_table(tel: Telemetry, base: float, down: np.ndarray) -> Table:
    c = tel.nic
    ts = np.round(base + tel.phase[tel.host_of] + 0.0002, 6)
    tx, rx = c["tx"].copy(), c["rx"].copy()
    fields: list = [
        ("v", Const(1)), ("kind", Const("nic")), ("ts", Num(ts, 6)),
        ("host", Pick(tel.host_of, tel.host_names)), ("nic", Pick(tel.local, tel.nic_names)),
        ("port", Const(1)), ("tx_bytes_total", Num(tx)), ("rx_bytes_total", Num(rx)),
        ("state", Pick(down.astype(np.int64), _NIC_STATE)), ("speed_gbps", Const(400.0)),
        ("tx_packets_total", Num(tx >> 12)), ("rx_packets_total", Num(rx >> 12))]
    fields += [(name, Const(0) if key is None else Num(c[key].astype(np.int64))) for name, key in (
        ("rx_errors_total", "rx_err"), ("tx_errors_total", None), ("rx_drops_total", "drops"),
        ("tx_pause_total", "pause_tx"), ("rx_pause_total", "pause_rx"),
        ("cnp_sent_total", "cnp_sent"), ("cnp_handled_total", "cnp_handled"),
        ("ecn_marked_total", "ecn"), ("out_of_sequence_total", "oos"),
        ("link_downed_total", "down"), ("symbol_errors_total", "sym"),
        ("xmit_wait_total", "xmit_wait"))]
    return Table(fields, ts)


def host_table(tel: Telemetry, base: float, cpu_busy, iowait, ckpt) -> Table:
    rng, H = tel.rng, tel.H
    ckpt_host = ckpt.reshape(H, tel.G).any(axis=1)
    running = tel.active.reshape(H, tel.G).sum(axis=1)
    base_util = 3.0 + 2.6 * running + rng.normal(0, 1.5, H) + 15.0 * ckpt_host
    util = np.clip(np.maximum(base_util, 100.0 * cpu_busy + rng.normal(0, 1.0, H)), 0, 100)
    wait = np.clip(0.4 + iowait + 6.0 * ckpt_host + rng.gamma(2.0, 0.2, H), 0, 100)
    load = np.maximum(0.0, util / 100.0 * CORES_LOAD + rng.normal(0, 1.0, H))
    load = np.where(cpu_busy > 0, CORES_LOAD * (1.0 + cpu_busy), load)
    procs = np.maximum(1, np.round(load * 0.8)).astype(np.int64)
    mem = (1.9e12 - running * 2.4e10 + rng.normal(0, 2e9, H)).astype(np.int64)
    ts = np.round(base + tel.phase + 0.0001, 6)
    return Table([
        ("v", Const(1)), ("kind", Const("host")), ("ts", Num(ts, 6)),
        ("host", Pick(np.arange(H), tel.host_names)),
        ("cpu_util_pct", Num(np.round(util, 1), 1)), ("cpu_iowait_pct", Num(np.round(wait, 2), 2)),
        ("cpu_steal_pct", Const(0.0)), ("load1", Num(np.round(load, 2), 2)),
        ("mem_available_bytes", Num(mem)), ("procs_running", Num(procs))], ts)
