"""A fake of the pynvml module: same function names, constants and errors, no GPU needed.

It raises the real ``pynvml.NVMLError`` (so ``exc.value`` and the per-code subclasses
behave as on a real host): NVML_ERROR_UNINITIALIZED before ``nvmlInit``,
NVML_ERROR_NOT_SUPPORTED for the calls a ``FakeGpu`` lists in ``unsupported``,
NVML_ERROR_GPU_IS_LOST for every call on a GPU marked ``lost``, NVML_ERROR_TIMEOUT
from an event set with nothing queued.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
from pynvml import NVMLError

_CONSTANTS = {k: getattr(pynvml, k) for k in dir(pynvml)
              if k.startswith(("NVML_", "nvmlEventType", "nvmlClocks"))}


@dataclass
class FakeGpu:
    """The state one fake GPU reports; tests change it between samples."""

    uuid: str
    sm_clock: int = 1980
    max_sm_clock: int = 1980
    mem_clock: int = 2619
    util: int = 97
    mem_util: int = 40
    power_mw: int = 650_000
    power_limit_mw: int = 700_000
    temp: int = 64
    reasons: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    pcie_tx_kbs: int = 1_000_000
    pcie_rx_kbs: int = 2_000_000
    pcie_replay: int = 0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    nvlinks: int = 18
    nvlink_crc_per_link: int = 0
    mem_used: int = 40 << 30
    mem_total: int = 80 << 30
    unsupported: set[str] = field(default_factory=set)  # pynvml function names
    lost: bool = False


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNVML:
    """Drop-in for the ``pynvml`` module (``GpuSampler(nvml=FakeNVML(gpus))``)."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], event_sets: bool = True) -> None:
        self.__dict__.update(_CONSTANTS)
        self.gpus = gpus
        self.event_sets = event_sets
        self.init_calls = 0
        self.calls = 0
        self._initialized = False
        self._queued: deque[tuple[int, int]] = deque()
        self._registered: set[int] = set()

    # -- test controls ---------------------------------------------------------------------
    def inject_xid(self, index: int, xid: int) -> None:
        """Queue an XID critical error on GPU ``index`` (seen if it registered for events)."""
        if index in self._registered:
            self._queued.append((index, xid))

    # -- plumbing ------------------------------------------------------------------------------
    def _check(self, name: str, handle: _Handle | None = None) -> FakeGpu | None:
        self.calls += 1
        if not self._initialized:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.unsupported:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- the pynvml API used by collectors.gpu ------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        self._initialized = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self._initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetIndex", handle)
        return handle.index

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._check("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetClockInfo(self, h: _Handle, kind: int) -> int:
        g = self._check("nvmlDeviceGetClockInfo", h)
        return g.sm_clock if kind == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetMaxClockInfo(self, h: _Handle, kind: int) -> int:
        g = self._check("nvmlDeviceGetMaxClockInfo", h)
        return g.max_sm_clock if kind == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        g = self._check("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util, memory=g.mem_util)

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return self._check("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetCurrPcieLinkWidth", h).pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie_max_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetMaxPcieLinkWidth", h).pcie_max_width

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        g = self._check("nvmlDeviceGetPcieThroughput", h)
        return g.pcie_tx_kbs if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kbs

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetPcieReplayCounter", h).pcie_replay

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter: int) -> int:
        g = self._check("nvmlDeviceGetTotalEccErrors", h)
        return g.ecc_sbe if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_dbe

    def nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        g = self._check("nvmlDeviceGetNvLinkState", h)
        if link >= g.nvlinks:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h: _Handle, link: int, counter: int) -> int:
        g = self._check("nvmlDeviceGetNvLinkErrorCounter", h)
        if counter == pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT:
            return g.nvlink_crc_per_link
        return 0

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> SimpleNamespace:
        g = self._check("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(used=g.mem_used, total=g.mem_total,
                               free=g.mem_total - g.mem_used)

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        if not self.event_sets:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return object()

    def nvmlDeviceRegisterEvents(self, h: _Handle, event_types: int, event_set: object) -> None:
        self._check("nvmlDeviceRegisterEvents", h)
        self._registered.add(h.index)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._check("nvmlEventSetWait_v2")
        if not self._queued:
            raise NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self._queued.popleft()
        return SimpleNamespace(device=_Handle(index), eventType=pynvml.nvmlEventTypeXidCriticalError,
                               eventData=xid, gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._check("nvmlEventSetFree")
