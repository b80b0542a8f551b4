"""The GPU source: NVML read per poll and per GPU (absent on machines without a GPU).

Each poll reads utilization (the driver's samples integrated into busy seconds), memory,
the table's gauges (:mod:`inferwatch.gpu_gauges`), clock-event reasons, the links
(:mod:`inferwatch.collect.links`) and the GPU's health (:mod:`inferwatch.collect.gpu_health`).
From one :class:`GpuSample` the exporter renders::

    inferwatch_gpu_utilization_ratio{gpu="0",uuid="GPU-8e1...",name="NVIDIA H100 80GB HBM3"} 0.97
    inferwatch_gpu_busy_seconds_total{gpu="0",...} 1234.5
    inferwatch_gpu_clock_throttled{gpu="0",...,reason="sw_thermal_slowdown"} 0.0

A GPU that errors is left out of that poll and the collector reports failure; a reading the
GPU does not support leaves out only its own series.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

from inferwatch.collect.gpu_health import Health
from inferwatch.collect.links import Links
from inferwatch.collect.nvml_reading import is_error
from inferwatch.gpu_gauges import GPU_GAUGES, GpuGauge
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
    links: Links
    health: Health
    last_sample_ts: int = 0  # NVML sample timestamp (us) already integrated
    samples_supported: bool = True
    samples_primed: bool = False
    busy_seconds_total: float = 0.0
    last_poll: float | None = None
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_primed: bool = False
    healthy: bool = True


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
                device.health.close()
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
        gpm_samples: list[Any] = []
        support = self._optional(nv.nvmlGpmQueryDeviceSupport, handle)
        if support is not None and support.isSupportedDevice:
            gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        return _Device(
            index=index,
            uuid=uuid,
            name=name,
            handle=handle,
            memory_total_bytes=float(memory.total) if memory is not None else None,
            bandwidth_peak=bandwidth,
            links=Links(nv, handle, index),
            health=Health(nv, handle, index),
            gpm_samples=gpm_samples,
        )

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
        reasons = self._optional(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        throttled = (
            MappingProxyType({name: bool(reasons & bit) for name, bit in THROTTLE_REASONS.items()})
            if reasons is not None
            else MappingProxyType({})
        )
        gpm = self._gpm(device, h)
        links = device.links.sample(h, gpm)
        gauges = {
            gauge.name: gauge.scale.apply(reading)
            for gauge in GPU_GAUGES
            if (reading := self._reading(gauge, h, gpm)) is not None
        }
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
            gauges=MappingProxyType(gauges),
            clock_throttled=throttled,
            pcie_bytes_per_second=MappingProxyType(links.pcie_bytes_per_second),
            pcie_peak_bytes_per_second=links.pcie_peak_bytes_per_second,
            nvlink_bytes_total=MappingProxyType(links.nvlink_bytes_total),
            nvlink_peak_bytes_per_second=links.nvlink_peak_bytes_per_second,
            health=device.health.sample(h, now),
        )

    def _reading(self, gauge: GpuGauge, h: Any, gpm: Mapping[int, float]) -> float | None:
        """The table's ``gauge`` in NVML's unit: None where this GPU cannot provide it."""
        nv = self.nvml
        if gauge.gpm:
            return gpm.get(getattr(nv, gauge.gpm))
        args = (getattr(nv, name) for name in gauge.args)
        return self._optional(getattr(nv, gauge.query), h, *args)

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
                if is_error(nv, exc, "NVML_ERROR_NOT_FOUND"):
                    return  # no new sample since the last poll
                if not is_error(nv, exc, "NVML_ERROR_NOT_SUPPORTED"):
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
        """GPM metrics over the last poll interval from two GPM samples, by metric ID: the
        table's and PCIe traffic (MiB/s); those the GPU could not compute are left out, all
        of them on the first poll and without GPM."""
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
            *(getattr(nv, gauge.gpm) for gauge in GPU_GAUGES if gauge.gpm),
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

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A reading this GPU may not support: None instead of NOT_SUPPORTED/NO_PERMISSION."""
        nv = self.nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if is_error(nv, exc, "NVML_ERROR_NOT_SUPPORTED") or is_error(
                nv, exc, "NVML_ERROR_NO_PERMISSION"
            ):
                return None
            raise

    def _call_quietly(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except self.nvml.NVMLError as exc:
            log.debug("NVML cleanup: %s", exc)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
