"""A fake NVML at the ``pynvml`` boundary (no GPU on the test machines).

It keeps the real module's constants, error classes and ctypes structures, and replaces
only the functions that would call into the driver. Each :class:`FakeGpu` is a handle.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field

import pynvml as real

from inferwatch.gpu_gauges import GPU_GAUGES


def nvml_error(code: int) -> real.NVMLError:
    return real.NVMLError(code)


@dataclass
class FakeGpu:
    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 0  # percent, nvmlDeviceGetUtilizationRates().gpu
    memory_used: int = 70 * 1024**3
    memory_total: int = 80 * 1024**3
    bus_width: int = 5120  # bits
    max_memory_clock: int = 2619  # MHz
    throttle_mask: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)  # (timestamp us, percent)
    samples_supported: bool = True
    gpm_supported: bool = False
    # The table's gauges (inferwatch.gpu_gauges) in NVML's unit, by name, over their
    # examples; None: NOT_SUPPORTED.
    readings: dict[str, float | None] = field(default_factory=dict)
    # Communication, defaults of an H100 SXM5: PCIe Gen5 x16 (NVIDIA H100 datasheet: "PCIe
    # Gen5: 128 GB/s", both directions), 18 NVLink4 links at 26562 MBps each (`nvidia-smi
    # nvlink --status` on an H100 80GB HBM3 prints "Link 0: 26.562 GB/s" ... "Link 17").
    pcie_max_generation: int = 5
    pcie_max_width: int = 16
    pcie_kb_per_second: tuple[int, int] = (0, 0)  # (tx, rx) nvmlDeviceGetPcieThroughput, KB/s
    pcie_throughput_supported: bool = True
    gpm_pcie: tuple[float, float] = (0.0, 0.0)  # (tx, rx) GPM PCIE_{TX,RX}_PER_SEC, MiB/s
    gpm_pcie_supported: bool = True
    nvlink_links: int = 18  # NVML_FI_DEV_NVLINK_LINK_COUNT; 0: no NVLink (fields NOT_SUPPORTED)
    nvlink_inactive: frozenset[int] = frozenset()  # links nvmlDeviceGetNvLinkState reports down
    nvlink_speed_mbps: int = 26562  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
    nvlink_kib: dict[int, tuple[int, int]] = field(default_factory=dict)  # link: (tx, rx) KiB
    nvlink_aggregate_scope: bool = True  # the driver sums the links for scopeId UINT_MAX
    # NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES (197, 198), bytes; None: NOT_SUPPORTED (the
    # default, as on drivers before the fields existed). Lower them to mimic a reset.
    pcie_bytes: tuple[int, int] | None = None
    # Health, defaults of a healthy H100: ECC on, row remapping (Ampere+), no page retirement
    # (NOT_SUPPORTED after Volta), XID events. ``ecc`` by (nvmlMemoryErrorType_t,
    # nvmlEccCounterType_t); ``remapped_rows`` as nvmlDeviceGetRemappedRows returns it
    # (correctable, uncorrectable, pending, failure); ``xid_events`` waiting to be read.
    ecc_supported: bool = True
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # None: NOT_SUPPORTED
    retired_pages_pending: int | None = None  # nvmlEnableState_t; None: NOT_SUPPORTED
    pcie_replays: int = 0
    events_supported: bool = True
    xid_events: list[int] = field(default_factory=list)
    field_time_us: int = 1_700_000_000_000_000  # nvmlFieldValue_t.timestamp, us since 1970
    field_errors: dict[int, int] = field(default_factory=dict)  # fieldId: per-entry nvmlReturn
    call_errors: dict[str, int] = field(default_factory=dict)  # function name: error it raises
    fail_with: int | None = None  # every call on this GPU raises this NVML error code

    def __post_init__(self) -> None:
        self.readings = {g.name: g.example for g in GPU_GAUGES} | self.readings

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-0000-0000-0000-00000000000{self.index}"

    def check(self, function: str = "") -> None:
        if self.fail_with is not None:
            raise nvml_error(self.fail_with)
        if function in self.call_errors:
            raise nvml_error(self.call_errors[function])


class FakeNvml(types.ModuleType):
    """Drop-in for the ``pynvml`` module; ``library_missing`` mimics a machine with no driver."""

    def __init__(self, gpus: list[FakeGpu], library_missing: bool = False) -> None:
        super().__init__("pynvml")
        for name in dir(real):
            value = getattr(real, name)
            if not callable(value) or isinstance(value, type):
                setattr(self, name, value)  # constants, NVMLError classes, ctypes structs
        self.gpus = gpus
        self.library_missing = library_missing
        self.calls: list[str] = []
        self.shutdown = False
        self.gpm_gets = 0
        self.field_requests: list[list] = []  # nvmlDeviceGetFieldValues' requests, in order
        self.freed_event_sets = 0
        for query in {g.query for g in GPU_GAUGES if g.query}:
            setattr(self, query, functools.partial(self._gauge_query, query))

    def _gpu(self, handle: FakeGpu, function: str = "") -> FakeGpu:
        if function:
            self.calls.append(function)  # asked, whether or not it fails
        handle.check(function)
        return handle

    def _gauge_query(self, query: str, h: FakeGpu, *args: int) -> float:
        """A query of the gauge table: the GPU's reading of the row it serves."""
        g = self._gpu(h, query)
        for gauge in GPU_GAUGES:
            if (gauge.query, tuple(getattr(real, a) for a in gauge.args)) == (query, args):
                reading = g.readings[gauge.name]
                if reading is None:
                    raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
                return reading
        raise AssertionError(f"{query}{args} reads no gauge of the table")

    def nvmlInit(self) -> None:
        if self.library_missing:
            raise nvml_error(real.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self._gpu(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return self._gpu(gpu)
        raise nvml_error(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._gpu(h).uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return self._gpu(h).name.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> types.SimpleNamespace:
        g = self._gpu(h)
        return types.SimpleNamespace(
            total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used
        )

    def nvmlDeviceGetMemoryBusWidth(self, h: FakeGpu) -> int:
        return self._gpu(h).bus_width

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, clock_type: int) -> int:
        assert clock_type == real.NVML_CLOCK_MEM
        return self._gpu(h).max_memory_clock

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=self._gpu(h).util, memory=0)

    def nvmlDeviceGetSamples(self, h: FakeGpu, sampling_type: int, last_ts: int) -> tuple:
        g = self._gpu(h)
        assert sampling_type == real.NVML_GPU_UTILIZATION_SAMPLES
        if not g.samples_supported:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        newer = [(ts, v) for ts, v in g.samples if ts > last_ts]
        if not newer:
            raise nvml_error(real.NVML_ERROR_NOT_FOUND)
        out = []
        for ts, value in newer:
            sample = real.c_nvmlSample_t()
            sample.timeStamp = ts
            sample.sampleValue.uiVal = value
            out.append(sample)
        return real.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return self._gpu(h).throttle_mask

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu):
        support = real.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(self._gpu(h).gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> object:
        return real.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, sample: object) -> None:
        pass

    def nvmlGpmSampleGet(self, h: FakeGpu, sample: object) -> object:
        self._gpu(h)
        self.gpm_gets += 1
        self._gpm_source = h
        return sample

    def nvmlGpmMetricsGet(self, request):
        gpu = self._gpm_source
        by_id = {
            getattr(real, g.gpm): reading
            for g in GPU_GAUGES
            if g.gpm and (reading := gpu.readings[g.name]) is not None
        }
        if gpu.gpm_pcie_supported:
            by_id[real.NVML_GPM_METRIC_PCIE_TX_PER_SEC] = gpu.gpm_pcie[0]
            by_id[real.NVML_GPM_METRIC_PCIE_RX_PER_SEC] = gpu.gpm_pcie[1]
        assert request.version == real.NVML_GPM_METRICS_GET_VERSION
        for i in range(request.numMetrics):
            metric_id = request.metrics[i].metricId
            if metric_id in by_id:
                request.metrics[i].value = by_id[metric_id]
                request.metrics[i].nvmlReturn = real.NVML_SUCCESS
            else:
                request.metrics[i].nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return request

    # -- health --------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter_type: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        if not g.ecc_supported:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return g.ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        g = self._gpu(h, "nvmlDeviceGetRemappedRows")
        if g.remapped_rows is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return g.remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        g = self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus")
        if g.retired_pages_pending is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return g.retired_pages_pending

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeGpu) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlEventSetCreate(self) -> list[FakeGpu]:
        return []  # the GPUs registered to it

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types_: int, event_set: list) -> None:
        g = self._gpu(h, "nvmlDeviceRegisterEvents")
        if not g.events_supported:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        assert types_ == real.nvmlEventTypeXidCriticalError
        event_set.append(g)

    def nvmlEventSetWait_v2(self, event_set: list, timeout_ms: int) -> real.c_nvmlEventData_t:
        """The oldest waiting XID of the set's GPUs; NVML_ERROR_TIMEOUT when none waits."""
        self.calls.append("nvmlEventSetWait_v2")
        for g in event_set:
            g.check("nvmlEventSetWait_v2")
            if g.xid_events:
                data = real.c_nvmlEventData_t()
                data.eventType = real.nvmlEventTypeXidCriticalError
                data.eventData = g.xid_events.pop(0)
                return data
        raise nvml_error(real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: list) -> None:
        self.freed_event_sets += 1

    # -- communication -----------------------------------------------------------------

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeGpu) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_max_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeGpu) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").pcie_max_width

    def nvmlDeviceGetPcieThroughput(self, h: FakeGpu, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetPcieThroughput")
        if not g.pcie_throughput_supported:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return {
            real.NVML_PCIE_UTIL_TX_BYTES: g.pcie_kb_per_second[0],
            real.NVML_PCIE_UTIL_RX_BYTES: g.pcie_kb_per_second[1],
        }[counter]

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if not g.nvlink_links:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < g.nvlink_links:
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        return (
            real.NVML_FEATURE_DISABLED if link in g.nvlink_inactive else real.NVML_FEATURE_ENABLED
        )

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, field_ids: list) -> object:
        """As pynvml: each entry a fieldId or a (fieldId, scopeId) pair (scopeId 0 if bare);
        errors per entry in nvmlReturn, as NVML reports them."""
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        self.field_requests.append(list(field_ids))
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        pcie = (real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
        for value, requested in zip(values, field_ids, strict=True):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            value.fieldId, value.scopeId = fid, scope
            value.nvmlReturn = real.NVML_SUCCESS
            value.timestamp = g.field_time_us
            throughput = (
                real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            )
            if fid in g.field_errors:
                value.nvmlReturn = g.field_errors[fid]
            elif fid in pcie:
                if g.pcie_bytes is None:
                    value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                else:
                    value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                    value.value.ullVal = g.pcie_bytes[pcie.index(fid)]
            elif not g.nvlink_links:
                value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
            elif fid == real.NVML_FI_DEV_NVLINK_LINK_COUNT:
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = g.nvlink_links
            elif fid == real.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = g.nvlink_speed_mbps
            elif fid in throughput:
                direction = throughput.index(fid)
                if scope == 0xFFFFFFFF and g.nvlink_aggregate_scope:
                    links = range(g.nvlink_links)
                elif scope < g.nvlink_links:
                    links = range(scope, scope + 1)
                else:
                    value.nvmlReturn = real.NVML_ERROR_INVALID_ARGUMENT
                    continue
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = sum(g.nvlink_kib.get(i, (0, 0))[direction] for i in links)
            else:
                value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return values
