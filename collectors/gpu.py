"""GPU sampler via NVML (pynvml, from the nvidia-ml-py package).

NVML is initialized once, when the sampler is built; device handles and static
properties (UUID, max clocks, max PCIe link, active NVLinks) are read once. Each
``sample()`` returns one ``gpu`` event per GPU with every field NVML exposes on
that GPU. A call that answers NOT_SUPPORTED (or any other NVML error that is not
"GPU is lost") leaves its field null, and is not asked again for that GPU. XID
errors come from an NVML event set (XID critical errors) drained without
blocking at each sample; ``xid`` lists those seen since the previous sample, or
is null where the GPU cannot deliver events.

A GPU that falls off the bus (NVML_ERROR_GPU_IS_LOST) is logged once, counted in
``lost`` and left out of later samples; the other GPUs go on.

Units: clocks MHz, power W (NVML gives mW), PCIe throughput bytes/s (NVML gives
KB/s over a 20 ms window), memory bytes, temperature Celsius.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class _Lost(Exception):
    """The GPU stopped answering (NVML_ERROR_GPU_IS_LOST)."""


class _Gpu:
    __slots__ = ("index", "handle", "uuid", "static", "links", "unsupported")

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.uuid = ""
        self.static: dict[str, Any] = {}
        self.links: list[int] = []
        self.unsupported: set[str] = set()


class GpuSampler:
    """One ``gpu`` event per GPU per ``sample()``.

    nvml: the pynvml module (or a fake with the same API). ranks: local GPU index ->
    (job_id, global rank) where the job mapping is known.
    """

    name = "gpu"

    def __init__(self, nvml: Any = None, host: str | None = None,
                 ranks: dict[int, tuple[str, int]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml: Any = nvml
        self.host = host or socket.gethostname()
        self.ranks = ranks or {}
        self.clock = clock
        self.lost: set[int] = set()
        nvml.nvmlInit()
        self._gpus: list[_Gpu] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                self._gpus.append(self._open(index))
            except (_Lost, nvml.NVMLError) as exc:
                self.lost.add(index)
                log.error("GPU %d on %s cannot be opened (%s): not sampled", index, self.host,
                          exc or "GPU is lost")
        self._events = self._open_event_set()

    # -- set-up --------------------------------------------------------------------------------

    def _open(self, index: int) -> _Gpu:
        n = self.nvml
        gpu = _Gpu(index, n.nvmlDeviceGetHandleByIndex(index))
        uuid = self._call(gpu, "uuid", n.nvmlDeviceGetUUID, gpu.handle)
        gpu.uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid or f"GPU-{index}")
        gpu.static = {
            "max_sm_clock_mhz": self._call(gpu, "max_sm", n.nvmlDeviceGetMaxClockInfo,
                                           gpu.handle, n.NVML_CLOCK_SM),
            "pcie_max_gen": self._call(gpu, "pcie_max_gen", n.nvmlDeviceGetMaxPcieLinkGeneration,
                                       gpu.handle),
            "pcie_max_width": self._call(gpu, "pcie_max_width",
                                         n.nvmlDeviceGetMaxPcieLinkWidth, gpu.handle),
        }
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                if n.nvmlDeviceGetNvLinkState(gpu.handle, link) == n.NVML_FEATURE_ENABLED:
                    gpu.links.append(link)
            except n.NVMLError:
                break  # links are numbered densely: the first that fails ends the list
        return gpu

    def _open_event_set(self) -> Any | None:
        n = self.nvml
        try:
            events = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.info("NVML event sets unavailable (%s): xid stays null", exc)
            return None
        for gpu in self._gpus:
            try:
                n.nvmlDeviceRegisterEvents(gpu.handle, n.nvmlEventTypeXidCriticalError, events)
            except n.NVMLError:
                gpu.unsupported.add("xid")
        return events

    def close(self) -> None:
        """Free the event set and shut NVML down (once, at process end)."""
        n = self.nvml
        if self._events is not None:
            try:
                n.nvmlEventSetFree(self._events)
            except n.NVMLError:
                pass
            self._events = None
        n.nvmlShutdown()

    # -- sampling ------------------------------------------------------------------------------

    def _call(self, gpu: _Gpu, field: str, fn: Callable, *args: Any) -> Any:
        if field in gpu.unsupported:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if exc.value == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise _Lost from None
            gpu.unsupported.add(field)
            return None

    def _drain_xids(self) -> dict[int, list[int]]:
        """XIDs per GPU index that NVML queued since the last call; never blocks."""
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        n = self.nvml
        while True:
            try:
                data = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError:
                return out  # NVML_ERROR_TIMEOUT: nothing more queued
            try:
                index = n.nvmlDeviceGetIndex(data.device)
            except n.NVMLError:
                continue
            out.setdefault(index, []).append(int(data.eventData))

    def sample(self) -> list[dict]:
        ts = self.clock()
        xids = self._drain_xids()
        out = []
        for gpu in self._gpus:
            if gpu.index in self.lost:
                continue
            try:
                out.append(self._sample_one(gpu, ts, xids.get(gpu.index, [])))
            except _Lost:
                self.lost.add(gpu.index)
                log.error("GPU %d (%s) on %s is lost (NVML_ERROR_GPU_IS_LOST): no more "
                          "samples from it", gpu.index, gpu.uuid, self.host)
        return out

    def _sample_one(self, gpu: _Gpu, ts: float, xids: list[int]) -> dict:
        n, h, call = self.nvml, gpu.handle, self._call
        ev: dict = {"v": 1, "kind": "gpu", "ts": ts, "host": self.host, "gpu": gpu.index,
                    "uuid": gpu.uuid, **gpu.static}
        ev["sm_clock_mhz"] = call(gpu, "sm", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
        ev["mem_clock_mhz"] = call(gpu, "mem", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM)
        util = call(gpu, "util", n.nvmlDeviceGetUtilizationRates, h)
        ev["util_pct"] = util.gpu if util is not None else None
        ev["mem_util_pct"] = util.memory if util is not None else None
        power = call(gpu, "power", n.nvmlDeviceGetPowerUsage, h)
        ev["power_w"] = power / 1000.0 if power is not None else None
        limit = call(gpu, "power_limit", n.nvmlDeviceGetEnforcedPowerLimit, h)
        ev["power_limit_w"] = limit / 1000.0 if limit is not None else None
        ev["temp_c"] = call(gpu, "temp", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        ev["clocks_event_reasons"] = call(gpu, "reasons", self._reasons, h)
        ev["pcie_gen"] = call(gpu, "pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        ev["pcie_width"] = call(gpu, "pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth, h)
        tx = call(gpu, "pcie_tx", n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)
        rx = call(gpu, "pcie_rx", n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)
        ev["pcie_tx_bytes_s"] = tx * 1024.0 if tx is not None else None
        ev["pcie_rx_bytes_s"] = rx * 1024.0 if rx is not None else None
        ev["pcie_replay_total"] = call(gpu, "replay", n.nvmlDeviceGetPcieReplayCounter, h)
        ev["ecc_sbe_total"] = call(gpu, "sbe", n.nvmlDeviceGetTotalEccErrors, h,
                                   n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
        ev["ecc_dbe_total"] = call(gpu, "dbe", n.nvmlDeviceGetTotalEccErrors, h,
                                   n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        ev["xid"] = None if "xid" in gpu.unsupported or self._events is None else xids
        ev["nvlink_crc_errors_total"] = call(gpu, "nvlink_crc", self._nvlink_crc, gpu)
        mem = call(gpu, "mem_info", n.nvmlDeviceGetMemoryInfo, h)
        ev["mem_used_bytes"] = int(mem.used) if mem is not None else None
        if gpu.index in self.ranks:
            ev["job_id"], ev["rank"] = self.ranks[gpu.index]
        return ev

    def _reasons(self, handle: Any) -> int:
        n = self.nvml
        # The "clocks event" name replaced "clocks throttle" in NVML 12.x; older drivers
        # only have the old one.
        fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        try:
            return int(fn(handle) if fn else n.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        except n.NVMLError as exc:
            if exc.value != n.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            return int(n.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _nvlink_crc(self, gpu: _Gpu) -> int | None:
        if not gpu.links:
            return None
        n = self.nvml
        return sum(n.nvmlDeviceGetNvLinkErrorCounter(gpu.handle, link, counter)
                   for link in gpu.links
                   for counter in (n.NVML_NVLINK_ERROR_DL_CRC_FLIT, n.NVML_NVLINK_ERROR_DL_CRC_DATA))
