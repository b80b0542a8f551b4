"""The GPU source: NVML sampling per GPU (optional; absent on machines without a GPU).

Per poll and per GPU it reads utilization, the driver's high-resolution utilization samples
(integrated into busy seconds), memory, SM clock, power, temperature, clock-event
(throttle) reasons, GPM SM/tensor/DRAM activity on GPUs that support it (Hopper+), and
the communication layer: PCIe throughput per direction (GPM's average over the poll
interval where supported, else NVML's 20 ms sample) and NVLink byte counters (one batched
field-value call). Static facts (name, UUID, peak memory, PCIe and NVLink bandwidth) are
read once.

Sample of what the exporter renders from one :class:`GpuSample`::

    inferwatch_gpu_utilization_ratio{gpu="0",uuid="GPU-8e1...",name="NVIDIA H100 80GB HBM3"} 0.97
    inferwatch_gpu_busy_seconds_total{gpu="0",...} 1234.5
    inferwatch_gpu_memory_bandwidth_peak_bytes_per_second{gpu="0",...} 3.35232e+12
    inferwatch_gpu_clock_throttled{gpu="0",...,reason="sw_thermal_slowdown"} 0.0
    inferwatch_gpu_pcie_bytes_per_second{gpu="0",...,direction="rx"} 2.62144e+09
    inferwatch_gpu_pcie_peak_bytes_per_second{gpu="0",...} 6.301538461538461e+10
    inferwatch_gpu_nvlink_bytes_total{gpu="0",...,direction="tx"} 1.099511627776e+12
    inferwatch_gpu_nvlink_peak_bytes_per_second{gpu="0",...} 4.78116e+11

A GPU that errors is left out of that poll (its series go) and the collector reports
failure; the exporter keeps serving. A communication reading that fails short of the GPU
being lost leaves only its own series out (logged once per GPU, reading and error).
Without NVML the source reports failure once per poll with the reason, and produces no
series.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

from inferwatch.model import CollectorStatus, GpuSample

log = logging.getLogger(__name__)

# Clock-event reason bits (nvmlClocksEventReason*), exposed as the `reason` label.
THROTTLE_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# How long to wait before trying NVML again after it failed to initialise.
_REINIT_SECONDS = 30.0

# Usable bytes/s per lane and direction by PCIe generation: transfer rate x encoding / 8.
# PCI Express Base Specification: 1.x 2.5 GT/s and 2.x 5 GT/s with 8b/10b; 3.x 8 GT/s,
# 4.0 16 GT/s and 5.0 32 GT/s with 128b/130b; 6.0 64 GT/s PAM4 in 256-byte FLITs carrying
# 242 bytes of TLP/DLLP payload (the rest FEC and CRC).
_PCIE_LANE_BYTES_PER_SECOND: dict[int, float] = {
    1: 2.5e9 * 8 / 10 / 8,  # 250 MB/s
    2: 5.0e9 * 8 / 10 / 8,  # 500 MB/s
    3: 8.0e9 * 128 / 130 / 8,  # ~984.6 MB/s
    4: 16.0e9 * 128 / 130 / 8,  # ~1969 MB/s
    5: 32.0e9 * 128 / 130 / 8,  # ~3938 MB/s
    6: 64.0e9 * 242 / 256 / 8,  # ~7563 MB/s
}
# nvmlDeviceGetPcieThroughput: "throughput in KB/s" over a 20 ms sample (nvml.h). NVML does
# not say which KB; its other data sizes are binary (NVLink counters in KiB, GPM in MiB/s),
# so 1 KB = 1024 bytes here.
_PCIE_THROUGHPUT_UNIT = 1024.0
# NVML_GPM_METRIC_PCIE_{TX,RX}_PER_SEC: "PCIe traffic from/to this GPU in MiB/sec" (nvml.h).
_GPM_PCIE_UNIT = 1024.0 * 1024.0
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}: "NVLink TX/RX Data throughput in KiB", a
# counter; "A scopeId of UINT_MAX returns aggregate value summed up across all links" (nvml.h).
_NVLINK_COUNTER_UNIT = 1024.0
_ALL_LINKS = 0xFFFFFFFF
# NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: "Common NVLink Speed in MBps for active links"
# (nvml.h), per link and direction. Decimal MB: an H100 link reports 26562, its two lanes of
# 106.25 Gb/s signalling / 8 = 26562.5e6 bytes/s.
_NVLINK_SPEED_UNIT = 1e6


class GpuUnavailable(RuntimeError):
    """NVML cannot be used here (no driver, no library, no GPU); str() is the reason."""


def _load_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a dependency, but be clear if it is gone
        raise GpuUnavailable(f"NVML bindings not importable: {exc}") from None
    return pynvml


@dataclass
class _Device:
    """Mutable per-GPU sampling state, private to the source."""

    index: int
    uuid: str
    name: str
    handle: Any
    memory_total_bytes: float | None
    bandwidth_peak: float | None
    last_sample_ts: int = 0  # NVML sample timestamp (us) already integrated
    samples_supported: bool = True
    samples_primed: bool = False
    busy_seconds_total: float = 0.0
    last_poll: float | None = None
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_primed: bool = False
    healthy: bool = True
    pcie_peak: float | None = None
    unsupported: set[str] = field(default_factory=set)  # readings NOT_SUPPORTED: not asked again
    nvlink_scopes: tuple[int, ...] = ()  # scopeIds of the NVLink counters; () = no counters
    nvlink_links: tuple[int, ...] = ()  # links present, for the per-link fallback
    nvlink_peak: float | None = None
    logged: set[tuple[str, int]] = field(default_factory=set)


class GpuSource:
    """NVML sampling; ``nvml`` is the ``pynvml`` module (a fake one in tests)."""

    def __init__(
        self,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._devices: list[_Device] = []
        self._initialised = False
        self._init_error = ""
        self._next_init = 0.0
        self.started_once = False  # False on a machine without GPUs: failures are expected

    @property
    def nvml(self) -> ModuleType:
        if self._nvml is None:
            self._nvml = _load_pynvml()
        return self._nvml

    def start(self) -> None:
        """Initialise NVML and enumerate GPUs; raises GpuUnavailable with the reason."""
        nv = self.nvml
        if self._initialised:
            return
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            devices = [self._open(i) for i in range(count)]
        except nv.NVMLError as exc:
            raise GpuUnavailable(f"NVML unavailable: {exc}") from None
        if not devices:
            raise GpuUnavailable("NVML found no GPU")
        self._devices = devices
        self._initialised = True
        self.started_once = True
        log.info("NVML: %d GPU(s): %s", len(devices), ", ".join(d.name for d in devices))

    def close(self) -> None:
        if self._initialised:
            for device in self._devices:
                for sample in device.gpm_samples:
                    self._call_quietly(self.nvml.nvmlGpmSampleFree, sample)
            self._call_quietly(self.nvml.nvmlShutdown)
            self._initialised = False

    def sample(self) -> tuple[tuple[GpuSample, ...], CollectorStatus]:
        """One poll of every GPU. Never raises: failures are in the returned status."""
        started = time.perf_counter()
        if not self._initialised:
            now = self._clock()
            if now >= self._next_init:
                self._next_init = now + _REINIT_SECONDS
                try:
                    self.start()
                    self._init_error = ""
                except GpuUnavailable as exc:
                    self._init_error = str(exc)
            if not self._initialised:
                return (), CollectorStatus(False, time.perf_counter() - started, self._init_error)
        samples = []
        errors = []
        for device in self._devices:
            try:
                samples.append(self._sample_device(device))
                device.healthy = True
            except self.nvml.NVMLError as exc:
                device.healthy = False
                errors.append(f"GPU {device.index} ({device.uuid}): {exc}")
        error = "; ".join(errors)
        return tuple(samples), CollectorStatus(not errors, time.perf_counter() - started, error)

    # -- internals -----------------------------------------------------------------------

    def _open(self, index: int) -> _Device:
        nv = self.nvml
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        name = _text(nv.nvmlDeviceGetName(handle))
        memory = self._optional(nv.nvmlDeviceGetMemoryInfo, handle)
        bus_width = self._optional(nv.nvmlDeviceGetMemoryBusWidth, handle)
        max_mem_clock = self._optional(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM)
        bandwidth = None
        if bus_width and max_mem_clock:
            # Double data rate: two transfers per memory clock, bus width in bits.
            bandwidth = bus_width / 8 * max_mem_clock * 1e6 * 2
        device = _Device(
            index=index,
            uuid=uuid,
            name=name,
            handle=handle,
            memory_total_bytes=float(memory.total) if memory is not None else None,
            bandwidth_peak=bandwidth,
        )
        support = self._optional(nv.nvmlGpmQueryDeviceSupport, handle)
        if support is not None and support.isSupportedDevice:
            device.gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        self._open_links(device)
        return device

    def _open_links(self, device: _Device) -> None:
        """Static PCIe and NVLink facts: the peaks, and which NVLink links there are."""
        nv = self.nvml
        h = device.handle
        # The max generation and width "possible with this device and system" (nvml.h): the
        # lower of the GPU's and the slot's.
        gen = self._comm(
            device, "PCIe max link generation", nv.nvmlDeviceGetMaxPcieLinkGeneration, h
        )
        width = self._comm(device, "PCIe max link width", nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        lane = _PCIE_LANE_BYTES_PER_SECOND.get(gen) if gen is not None else None
        if lane is not None and width:
            device.pcie_peak = lane * width
        fields = self._comm(
            device,
            "NVLink link count and speed",
            nv.nvmlDeviceGetFieldValues,
            h,
            [nv.NVML_FI_DEV_NVLINK_LINK_COUNT, nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON],
        )
        count, speed = (
            (
                self._field(device, "NVLink link count", fields[0]),
                self._field(device, "NVLink speed", fields[1]),
            )
            if fields is not None
            else (None, None)
        )
        if not count:
            return  # no NVLink (NOT_SUPPORTED or zero links): its series stay absent
        present, active = [], []
        for link in range(min(int(count), nv.NVML_NVLINK_MAX_LINKS)):
            what = f"NVLink {link} state"
            state = self._comm(device, what, nv.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                continue
            present.append(link)
            if state == nv.NVML_FEATURE_ENABLED:
                active.append(link)
        device.nvlink_links = tuple(present)
        device.nvlink_scopes = (_ALL_LINKS,) if present else ()
        if active and speed:
            device.nvlink_peak = speed * _NVLINK_SPEED_UNIT * len(active)

    def _sample_device(self, device: _Device) -> GpuSample:
        nv = self.nvml
        h = device.handle
        if not device.healthy:
            # The handle may be stale after an error; look the GPU up again by UUID.
            h = device.handle = nv.nvmlDeviceGetHandleByUUID(device.uuid)
        now = self._clock()
        util = nv.nvmlDeviceGetUtilizationRates(h)
        utilization = util.gpu / 100.0
        busy_before = device.busy_seconds_total
        self._integrate_busy(device, h, utilization, now)
        busy_ratio = None
        if device.last_poll is not None and now > device.last_poll:
            busy_ratio = min(
                1.0, (device.busy_seconds_total - busy_before) / (now - device.last_poll)
            )
        device.last_poll = now
        memory = nv.nvmlDeviceGetMemoryInfo(h)
        sm_clock = self._optional(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        power_mw = self._optional(nv.nvmlDeviceGetPowerUsage, h)
        temperature = self._optional(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        reasons = self._optional(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        throttled = (
            MappingProxyType({name: bool(reasons & bit) for name, bit in THROTTLE_REASONS.items()})
            if reasons is not None
            else MappingProxyType({})
        )
        gpm = self._gpm(device, h)
        sm_active, tensor_active, dram_active = (
            _percent(gpm.get(metric))
            for metric in (
                nv.NVML_GPM_METRIC_SM_UTIL,
                nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                nv.NVML_GPM_METRIC_DRAM_BW_UTIL,
            )
        )
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            name=device.name,
            utilization_ratio=utilization,
            busy_seconds_total=device.busy_seconds_total,
            busy_ratio=busy_ratio,
            memory_used_bytes=float(memory.used),
            memory_total_bytes=device.memory_total_bytes or float(memory.total),
            memory_bandwidth_peak_bytes_per_second=device.bandwidth_peak,
            sm_clock_hertz=sm_clock * 1e6 if sm_clock is not None else None,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            clock_throttled=throttled,
            sm_active_ratio=sm_active,
            tensor_active_ratio=tensor_active,
            dram_active_ratio=dram_active,
            pcie_bytes_per_second=MappingProxyType(self._pcie(device, h, gpm)),
            pcie_peak_bytes_per_second=device.pcie_peak,
            nvlink_bytes_total=MappingProxyType(self._nvlink(device, h)),
            nvlink_peak_bytes_per_second=device.nvlink_peak,
        )

    def _integrate_busy(self, device: _Device, h: Any, utilization: float, now: float) -> None:
        """Add the seconds a kernel ran since the last poll.

        The driver keeps a ring buffer of utilization samples (one every 1/6 s to 1 s,
        depending on the GPU); each value is the busy percentage of the period ending at its
        timestamp. Where samples are not supported, the coarse utilization times the poll
        interval stands in.
        """
        nv = self.nvml
        if device.samples_supported:
            try:
                _, samples = nv.nvmlDeviceGetSamples(
                    h, nv.NVML_GPU_UTILIZATION_SAMPLES, device.last_sample_ts
                )
            except nv.NVMLError as exc:
                if _is(nv, exc, "NVML_ERROR_NOT_FOUND"):
                    return  # no new sample since the last poll
                if not _is(nv, exc, "NVML_ERROR_NOT_SUPPORTED"):
                    raise
                device.samples_supported = False
            else:
                for s in sorted(samples, key=lambda s: s.timeStamp):
                    if s.timeStamp <= device.last_sample_ts:
                        continue
                    if device.samples_primed:  # the first read only sets the starting point
                        period = (s.timeStamp - device.last_sample_ts) / 1e6
                        device.busy_seconds_total += s.sampleValue.uiVal / 100.0 * period
                    device.last_sample_ts = s.timeStamp
                device.samples_primed = True
                return
        if device.last_poll is not None:
            device.busy_seconds_total += utilization * (now - device.last_poll)

    def _gpm(self, device: _Device, h: Any) -> dict[int, float]:
        """GPM metrics over the last poll interval from two GPM samples, by metric ID: SM,
        tensor and DRAM activity (percent) and PCIe traffic (MiB/s); those the GPU could
        not compute are left out, all of them on the first poll and without GPM."""
        if not device.gpm_samples:
            return {}
        nv = self.nvml
        previous, current = device.gpm_samples
        nv.nvmlGpmSampleGet(h, current)
        device.gpm_samples = [current, previous]
        if not device.gpm_primed:
            device.gpm_primed = True
            return {}
        ids = (
            nv.NVML_GPM_METRIC_SM_UTIL,
            nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
            nv.NVML_GPM_METRIC_DRAM_BW_UTIL,
            nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
            nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        )
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1 = previous
        request.sample2 = current
        for i, metric_id in enumerate(ids):
            request.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(request)
        return {
            metric_id: request.metrics[i].value
            for i, metric_id in enumerate(ids)
            if request.metrics[i].nvmlReturn == nv.NVML_SUCCESS
        }

    def _pcie(self, device: _Device, h: Any, gpm: dict[int, float]) -> dict[str, float]:
        """PCIe bytes/s by direction: GPM's interval average where the GPU computed it (no
        extra call), else NVML's 20 ms sample (one call per direction)."""
        nv = self.nvml
        out: dict[str, float] = {}
        for direction, gpm_id, counter in (
            ("tx", nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC, nv.NVML_PCIE_UTIL_TX_BYTES),
            ("rx", nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC, nv.NVML_PCIE_UTIL_RX_BYTES),
        ):
            if gpm_id in gpm:
                out[direction] = gpm[gpm_id] * _GPM_PCIE_UNIT
            else:
                kb = self._comm(
                    device,
                    f"PCIe {direction} throughput",
                    nv.nvmlDeviceGetPcieThroughput,
                    h,
                    counter,
                )
                if kb is not None:
                    out[direction] = kb * _PCIE_THROUGHPUT_UNIT
        return out

    def _nvlink(self, device: _Device, h: Any) -> dict[str, float]:
        """NVLink bytes by direction since the driver loaded, over all links, in one call.

        The aggregate scope (UINT_MAX) first; a driver that refuses it is asked per link
        (still one call) from then on.
        """
        if not device.nvlink_scopes:
            return {}
        nv = self.nvml
        directions = (
            ("tx", nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
            ("rx", nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
        )
        request = [(fid, scope) for _, fid in directions for scope in device.nvlink_scopes]
        values = self._comm(device, "NVLink throughput", nv.nvmlDeviceGetFieldValues, h, request)
        if values is None:
            return {}
        if device.nvlink_scopes == (_ALL_LINKS,) and all(
            v.nvmlReturn in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT)
            for v in values
        ):
            device.nvlink_scopes = device.nvlink_links
            log.info("GPU %d: NVLink counters per link (no aggregate scope)", device.index)
            return self._nvlink(device, h)
        out: dict[str, float] = {}
        per = len(device.nvlink_scopes)
        for d, (direction, _) in enumerate(directions):
            kib = [
                self._field(device, f"NVLink {direction}", v)
                for v in values[d * per : (d + 1) * per]
            ]
            if all(k is not None for k in kib):
                out[direction] = math.fsum(kib) * _NVLINK_COUNTER_UNIT
        if not out and all(v.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED for v in values):
            device.nvlink_scopes = ()  # not on this GPU: stop asking
        return out

    def _comm(self, device: _Device, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A communication reading: None when it fails (logged once per GPU, reading and
        error), the error raised only when the GPU is lost (the GPU's whole sample goes).
        A reading the GPU does not support is not asked for again."""
        if what in device.unsupported:
            return None
        nv = self.nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if _is(nv, exc, "NVML_ERROR_GPU_IS_LOST"):
                raise
            if _is(nv, exc, "NVML_ERROR_NOT_SUPPORTED"):
                device.unsupported.add(what)
            self._log_once(device, what, exc.value, str(exc))
            return None

    def _field(self, device: _Device, what: str, value: Any) -> float | None:
        """One nvmlFieldValue_t as a number; None (logged once) when it holds an error."""
        nv = self.nvml
        code = value.nvmlReturn
        if code != nv.NVML_SUCCESS:
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                raise nv.NVMLError(code)
            self._log_once(device, what, code, str(nv.NVMLError(code)))
            return None
        member = _FIELD_MEMBERS.get(value.valueType)
        return float(getattr(value.value, member)) if member else None

    def _log_once(self, device: _Device, what: str, code: int, text: str) -> None:
        if (what, code) in device.logged:
            return
        device.logged.add((what, code))
        log.info("GPU %d: %s unavailable (%s); its series are left out", device.index, what, text)

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A reading this GPU may not support: None instead of NOT_SUPPORTED/NO_PERMISSION."""
        nv = self.nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if _is(nv, exc, "NVML_ERROR_NOT_SUPPORTED") or _is(nv, exc, "NVML_ERROR_NO_PERMISSION"):
                return None
            raise

    def _call_quietly(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except self.nvml.NVMLError as exc:
            log.debug("NVML cleanup: %s", exc)


# nvmlValue_t's member by nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE = 0 ... UNSIGNED_SHORT = 6).
_FIELD_MEMBERS = dict(enumerate(("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")))


def _percent(value: float | None) -> float | None:
    return value / 100.0 if value is not None else None


def _is(nv: ModuleType, exc: Exception, code_name: str) -> bool:
    return getattr(exc, "value", None) == getattr(nv, code_name)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
