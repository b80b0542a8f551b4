"""The communication layer of one GPU through NVML: PCIe throughput and NVLink counters.

Opened once per GPU (:class:`Links`), it reads the PCIe peak and the NVLink links then; per
poll it makes one batched field-value call for the NVLink and PCIe byte counters and takes
PCIe throughput per direction from the first of: the byte counters' delta over their own
timestamps, GPM's average over the poll interval, NVML's 20 ms sample. Units follow nvml.h
(PCIe counters in bytes, NVLink counters in KiB, link speed in decimal MB/s); a reading that
fails is taken as :mod:`inferwatch.collect.nvml_reading` says. Sample of the series it feeds
(through :class:`inferwatch.model.GpuSample`)::

    inferwatch_gpu_pcie_bytes_per_second{gpu="0",...,direction="rx"} 2.62144e+09
    inferwatch_gpu_pcie_peak_bytes_per_second{gpu="0",...} 6.301538461538461e+10
    inferwatch_gpu_nvlink_bytes_total{gpu="0",...,direction="tx"} 1.099511627776e+12
    inferwatch_gpu_nvlink_peak_bytes_per_second{gpu="0",...} 4.78116e+11
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from inferwatch.collect.nvml_reading import Readings, log

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
# NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197 "PCIe transmit bytes. Value can be wrapped." and
# NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198 "PCIe receive bytes. Value can be wrapped." (nvml.h;
# the same IDs in nvidia-ml-py's pynvml; listed as new field IDs in the NVML release notes).
_PCIE_COUNTER_UNIT = 1.0
# nvmlFieldValue_t.timestamp: "CPU Timestamp of this value in microseconds since 1970"
# (nvml.h); pynvml's c_nvmlFieldValue_t exposes it as ``timestamp``.
_FIELD_TIMESTAMP_UNIT = 1e-6

# nvmlValue_t's member by nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE = 0 ... UNSIGNED_SHORT = 6).
_FIELD_MEMBERS = dict(enumerate(("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")))


@dataclass(frozen=True)
class LinkSample:
    """One poll of a GPU's communication layer; a reading that failed is absent or None."""

    pcie_bytes_per_second: dict[str, float]  # by direction ("tx", "rx")
    pcie_peak_bytes_per_second: float | None
    nvlink_bytes_total: dict[str, float]  # by direction, since the driver loaded
    nvlink_peak_bytes_per_second: float | None


class Links:
    """One GPU's PCIe and NVLink readings; ``nvml`` is the ``pynvml`` module (a fake one in
    tests). Opening reads the static facts from ``handle``; ``index`` names the GPU in logs."""

    def __init__(self, nvml: ModuleType, handle: Any, index: int) -> None:
        self._nvml = nvml
        self._index = index
        self.pcie_peak: float | None = None
        self._comm = Readings(nvml, index)
        self._nvlink_scopes: tuple[int, ...] = ()  # scopeIds of the counters; () = none
        self._nvlink_links: tuple[int, ...] = ()  # links present, for the per-link fallback
        # The PCIe byte counters still asked for, by direction (one NOT_SUPPORTED: dropped).
        self._pcie_counters: tuple[tuple[str, int], ...] = (
            ("tx", nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES),
            ("rx", nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES),
        )
        # The previous counter reading by direction: (bytes, timestamp in us).
        self._pcie_last: dict[str, tuple[float, int]] = {}
        self.nvlink_peak: float | None = None
        self._open(handle)

    def sample(self, handle: Any, gpm: dict[int, float]) -> LinkSample:
        """This poll's readings; ``gpm`` is the GPU's GPM metrics by metric ID (may be empty).
        Raises NVMLError only when the GPU is lost."""
        nvlink, pcie = self._counters(handle)
        return LinkSample(
            pcie_bytes_per_second=self._pcie(handle, gpm, self._pcie_rates(pcie)),
            pcie_peak_bytes_per_second=self.pcie_peak,
            nvlink_bytes_total=self._nvlink(nvlink),
            nvlink_peak_bytes_per_second=self.nvlink_peak,
        )

    # -- internals -----------------------------------------------------------------------

    def _open(self, h: Any) -> None:
        """Static PCIe and NVLink facts: the peaks, and which NVLink links there are."""
        nv = self._nvml
        # The max generation and width "possible with this device and system" (nvml.h): the
        # lower of the GPU's and the slot's.
        gen = self._comm("PCIe max link generation", nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
        width = self._comm("PCIe max link width", nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        lane = _PCIE_LANE_BYTES_PER_SECOND.get(gen) if gen is not None else None
        if lane is not None and width:
            self.pcie_peak = lane * width
        fields = self._comm(
            "NVLink link count and speed",
            nv.nvmlDeviceGetFieldValues,
            h,
            [nv.NVML_FI_DEV_NVLINK_LINK_COUNT, nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON],
        )
        count, speed = (
            (
                self._field("NVLink link count", fields[0]),
                self._field("NVLink speed", fields[1]),
            )
            if fields is not None
            else (None, None)
        )
        if not count:
            return  # no NVLink (NOT_SUPPORTED or zero links): its series stay absent
        present, active = [], []
        for link in range(min(int(count), nv.NVML_NVLINK_MAX_LINKS)):
            state = self._comm(f"NVLink {link} state", nv.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                continue
            present.append(link)
            if state == nv.NVML_FEATURE_ENABLED:
                active.append(link)
        self._nvlink_links = tuple(present)
        self._nvlink_scopes = (_ALL_LINKS,) if present else ()
        if active and speed:
            self.nvlink_peak = speed * _NVLINK_SPEED_UNIT * len(active)

    def _counters(self, h: Any) -> tuple[list[Any] | None, list[Any] | None]:
        """This poll's NVLink and PCIe counter field values, in one batched call: (NVLink
        entries, PCIe entries), each None where not asked or the call failed.

        The NVLink counters' aggregate scope (UINT_MAX) first; a driver that refuses it is
        asked per link (still one call) from then on.
        """
        nv = self._nvml
        nvlink = [
            (fid, scope)
            for fid in (
                nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            )
            for scope in self._nvlink_scopes
        ]
        pcie = [fid for _, fid in self._pcie_counters]
        if not nvlink and not pcie:
            return None, None
        values = self._comm(
            "NVLink and PCIe counters", nv.nvmlDeviceGetFieldValues, h, nvlink + pcie
        )
        if values is None:
            return None, None
        nvlink_values, pcie_values = list(values[: len(nvlink)]), list(values[len(nvlink) :])
        if self._nvlink_scopes == (_ALL_LINKS,) and all(
            v.nvmlReturn in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT)
            for v in nvlink_values
        ):
            self._nvlink_scopes = self._nvlink_links
            log.info("GPU %d: NVLink counters per link (no aggregate scope)", self._index)
            return self._counters(h)
        return (nvlink_values or None), (pcie_values or None)

    def _pcie_rates(self, values: list[Any] | None) -> dict[str, float | None]:
        """PCIe bytes/s by direction from the byte counters: the delta since the previous
        reading over the time between the two readings' timestamps. None for a direction
        whose counter went backwards; a direction absent has no counter rate this poll
        (first reading, failed reading, not supported, no time between readings)."""
        if values is None:
            self._pcie_last.clear()  # no reading this poll: the next one starts over
            return {}
        nv = self._nvml
        out: dict[str, float | None] = {}
        for (direction, fid), value in zip(self._pcie_counters, values, strict=True):
            count = self._field(f"PCIe {direction} byte counter", value)
            if count is None:
                self._pcie_last.pop(direction, None)
                if value.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED:  # for good: not asked again
                    self._pcie_counters = tuple(c for c in self._pcie_counters if c[1] != fid)
                continue
            stamp = int(value.timestamp)
            last = self._pcie_last.get(direction)
            self._pcie_last[direction] = (count, stamp)
            if last is None:
                continue  # the first reading: no interval yet
            seconds = (stamp - last[1]) * _FIELD_TIMESTAMP_UNIT
            if seconds <= 0:
                continue  # the same reading again, or the wall clock stepped back
            if count < last[0]:
                out[direction] = None  # reset or wrapped: no value this poll
                continue
            out[direction] = (count - last[0]) * _PCIE_COUNTER_UNIT / seconds
        return out

    def _pcie(
        self, h: Any, gpm: dict[int, float], counters: dict[str, float | None]
    ) -> dict[str, float]:
        """PCIe bytes/s by direction: the byte counters' rate where there is one this poll
        (a None there leaves the direction out), else GPM's interval average where the GPU
        computed it (no extra call), else NVML's 20 ms sample (one call per direction)."""
        nv = self._nvml
        out: dict[str, float] = {}
        for direction, gpm_id, counter in (
            ("tx", nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC, nv.NVML_PCIE_UTIL_TX_BYTES),
            ("rx", nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC, nv.NVML_PCIE_UTIL_RX_BYTES),
        ):
            if direction in counters:
                rate = counters[direction]
                if rate is not None:
                    out[direction] = rate
            elif gpm_id in gpm:
                out[direction] = gpm[gpm_id] * _GPM_PCIE_UNIT
            else:
                kb = self._comm(
                    f"PCIe {direction} throughput", nv.nvmlDeviceGetPcieThroughput, h, counter
                )
                if kb is not None:
                    out[direction] = kb * _PCIE_THROUGHPUT_UNIT
        return out

    def _nvlink(self, values: list[Any] | None) -> dict[str, float]:
        """NVLink bytes by direction since the driver loaded, over all links, from this
        poll's NVLink entries of the batched call (None: none asked, or the call failed)."""
        if not values or not self._nvlink_scopes:
            return {}
        nv = self._nvml
        out: dict[str, float] = {}
        per = len(self._nvlink_scopes)
        for d, direction in enumerate(("tx", "rx")):
            kib = [self._field(f"NVLink {direction}", v) for v in values[d * per : (d + 1) * per]]
            if all(k is not None for k in kib):
                out[direction] = math.fsum(kib) * _NVLINK_COUNTER_UNIT
        if not out and all(v.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED for v in values):
            self._nvlink_scopes = ()  # not on this GPU: stop asking
        return out

    def _field(self, what: str, value: Any) -> float | None:
        """One nvmlFieldValue_t as a number; None (logged once) when it holds an error."""
        nv = self._nvml
        code = value.nvmlReturn
        if code != nv.NVML_SUCCESS:
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                raise nv.NVMLError(code)
            self._comm.log_once(what, code, str(nv.NVMLError(code)))
            return None
        member = _FIELD_MEMBERS.get(value.valueType)
        return float(getattr(value.value, member)) if member else None
