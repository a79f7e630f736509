"""Host sampler: CPU utilization, iowait, steal, load and available memory from /proc.

CPU percentages are over the interval since the previous sample (the first
sample covers the time since boot), summed over all CPUs and normalized to
0-100. The /proc root and the clock are injected so tests can point it at a
copy and production at the real thing.

>>> HostSampler(host="h0").sample()[0]["kind"]
'host'
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path


class HostSampler:
    """One ``host`` event per ``sample()``; ``proc_root`` is the /proc to read."""

    name = "host"

    def __init__(self, host: str | None = None, proc_root: str = "/proc",
                 clock: Callable[[], float] = time.time) -> None:
        self.host = host or socket.gethostname()
        self.proc = Path(proc_root)
        self.clock = clock
        self._prev_cpu: list[int] | None = None

    def sample(self) -> list[dict]:
        ts = self.clock()
        ev: dict = {"v": 1, "kind": "host", "ts": ts, "host": self.host}
        cpu, procs_running = self._read_stat()
        if cpu is not None:
            prev = self._prev_cpu or [0] * len(cpu)
            d = [max(0, a - b) for a, b in zip(cpu, prev, strict=True)]
            total = sum(d)
            if total > 0:
                # /proc/stat cpu: user nice system idle iowait irq softirq steal (guest is in user)
                idle, iowait, steal = d[3], d[4], d[7] if len(d) > 7 else 0
                ev["cpu_util_pct"] = 100.0 * (total - idle - iowait) / total
                ev["cpu_iowait_pct"] = 100.0 * iowait / total
                ev["cpu_steal_pct"] = 100.0 * steal / total
            self._prev_cpu = cpu
        ev["procs_running"] = procs_running
        ev["load1"] = self._read_load1()
        ev["mem_available_bytes"] = self._read_mem_available()
        return [ev]

    def _read_stat(self) -> tuple[list[int] | None, int | None]:
        cpu: list[int] | None = None
        running: int | None = None
        try:
            with open(self.proc / "stat") as f:
                for line in f:
                    if line.startswith("cpu "):
                        cpu = [int(x) for x in line.split()[1:9]]
                    elif line.startswith("procs_running "):
                        running = int(line.split()[1])
        except (OSError, ValueError):
            return None, None
        return cpu, running

    def _read_load1(self) -> float | None:
        try:
            return float((self.proc / "loadavg").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _read_mem_available(self) -> int | None:
        try:
            with open(self.proc / "meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024  # kB in /proc/meminfo
        except (OSError, ValueError, IndexError):
            return None
        return None
