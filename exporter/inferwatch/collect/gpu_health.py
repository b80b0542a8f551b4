"""A GPU that is failing, not slow, through NVML: memory errors, row remapping, PCIe replays
and XID events.

Opened once per GPU (:class:`Health`), it registers an event set for the critical XID errors;
at most once a second it reads the counters and drains up to :data:`MAX_EVENTS` events. What
a GPU does not support (ECC off, row remapping before Ampere) is absent, never zero; the XIDs
that need attention (:data:`inferwatch.method.gpu_faults.GPU_XIDS_NEEDING_ATTENTION`) show
from 0. Sample of the series it feeds (through :class:`inferwatch.model.GpuHealth`)::

    inferwatch_gpu_ecc_errors_total{gpu="0",...,error="uncorrected",counter="volatile"} 0
    inferwatch_gpu_remapped_rows{gpu="0",...,kind="uncorrectable"} 1
    inferwatch_gpu_row_remap_pending{gpu="0",...} 1
    inferwatch_gpu_row_remap_failed{gpu="0",...} 0
    inferwatch_gpu_pcie_replays_total{gpu="0",...} 12
    inferwatch_gpu_xid_errors_total{gpu="0",...,xid="79"} 1
"""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType, ModuleType
from typing import Any

from inferwatch.collect.nvml_reading import Readings, is_error
from inferwatch.method.gpu_faults import GPU_XIDS_NEEDING_ATTENTION
from inferwatch.model import GpuHealth

MAX_EVENTS = 64  # drained per reading and GPU: a storm of events never holds a poll up
# Seconds between two readings, whatever the poll interval: the counters change rarely, and
# eight NVML calls per GPU at every poll of a 10 Hz sidecar would cost more than the poll.
INTERVAL = 1.0


class Health:
    """One GPU's health readings; ``nvml`` is the ``pynvml`` module (a fake one in tests)."""

    def __init__(self, nvml: ModuleType, handle: Any, index: int) -> None:
        self._nvml = nvml
        self._read = Readings(nvml, index)
        # The XIDs that need attention from 0: a counter that first shows at 1 has no increase.
        self._xids: Counter[int] = Counter(dict.fromkeys(GPU_XIDS_NEEDING_ATTENTION, 0))
        self._events = self._read("XID events", self._register, handle)
        self._last: tuple[float, GpuHealth] | None = None  # (clock, readings)

    def sample(self, handle: Any, now: float) -> GpuHealth:
        """The readings, taken at most every :data:`INTERVAL` seconds (the last ones in
        between). Raises NVMLError only when the GPU is lost."""
        if self._last is not None and now - self._last[0] < INTERVAL:
            return self._last[1]
        health = self._take(handle)
        self._last = (now, health)
        return health

    def _take(self, handle: Any) -> GpuHealth:
        nv, read = self._nvml, self._read
        ecc = {}
        for error, error_type in (
            ("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            for counter, counter_type in (
                ("volatile", nv.NVML_VOLATILE_ECC),
                ("aggregate", nv.NVML_AGGREGATE_ECC),
            ):
                count = read(
                    "ECC error counts", nv.nvmlDeviceGetTotalEccErrors, handle, error_type,
                    counter_type,
                )  # fmt: skip
                if count is not None:
                    ecc[(error, counter)] = float(count)
        rows = read("row remapping", nv.nvmlDeviceGetRemappedRows, handle)
        pages = read("retired pages", nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        replays = read("PCIe replays", nv.nvmlDeviceGetPcieReplayCounter, handle)
        self._drain()
        return GpuHealth(
            ecc_errors_total=MappingProxyType(ecc),
            remapped_rows=MappingProxyType(
                {"correctable": float(rows[0]), "uncorrectable": float(rows[1])} if rows else {}
            ),
            row_remap_pending=float(bool(rows[2])) if rows else None,
            row_remap_failed=float(bool(rows[3])) if rows else None,
            retired_pages_pending=(
                float(pages == nv.NVML_FEATURE_ENABLED) if pages is not None else None
            ),
            pcie_replays_total=float(replays) if replays is not None else None,
            xid_errors_total=MappingProxyType(
                {str(xid): float(n) for xid, n in sorted(self._xids.items())}
                if self._events is not None
                else {}
            ),
        )

    def close(self) -> None:
        if self._events is not None:
            self._read("XID events", self._nvml.nvmlEventSetFree, self._events)
            self._events = None

    def _register(self, handle: Any) -> Any:
        nv = self._nvml
        events = nv.nvmlEventSetCreate()
        try:
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
        except nv.NVMLError:
            nv.nvmlEventSetFree(events)
            raise
        return events

    def _drain(self) -> None:
        """Count the XID events that arrived since the last poll, without waiting."""
        nv = self._nvml
        for _ in range(MAX_EVENTS if self._events is not None else 0):
            try:
                event = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError as exc:
                if is_error(nv, exc, "NVML_ERROR_TIMEOUT"):
                    return  # none left
                if is_error(nv, exc, "NVML_ERROR_GPU_IS_LOST"):
                    raise
                self._read.log_once("XID events", exc.value, str(exc))
                return
            if event.eventType & nv.nvmlEventTypeXidCriticalError:
                self._xids[int(event.eventData)] += 1
