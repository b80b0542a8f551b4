"""The NVML path against a fake at the pynvml boundary."""

from __future__ import annotations

import pynvml
import pytest

from inferwatch.collect.gpu import GpuSource, GpuUnavailable
from inferwatch.model import CollectorStatus, Snapshot
from inferwatch.serve.exposition import render

from conftest import page_value
from fake_nvml import FakeGpu, FakeNvml


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def source(*gpus: FakeGpu, clock: Clock | None = None) -> tuple[GpuSource, FakeNvml]:
    nv = FakeNvml(list(gpus))
    src = GpuSource(nvml=nv, clock=clock or Clock())
    src.start()
    return src, nv


def test_reads_every_gauge_with_base_units() -> None:
    src, _ = source(FakeGpu(0, util=97, throttle_mask=0x20 | 0x4))
    (gpu,), status = src.sample()
    assert status.success
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu.utilization_ratio == 0.97
    assert gpu.memory_used_bytes == 70 * 1024**3
    assert gpu.memory_total_bytes == 80 * 1024**3
    # H100 SXM: 5120-bit bus x 2619 MHz x 2 (DDR) = 3.352 TB/s
    assert gpu.memory_bandwidth_peak_bytes_per_second == 5120 / 8 * 2619e6 * 2
    assert gpu.sm_clock_hertz == 1980e6
    assert gpu.power_watts == 350.0
    assert gpu.temperature_celsius == 61.0
    assert gpu.clock_throttled["sw_thermal_slowdown"] is True
    assert gpu.clock_throttled["sw_power_cap"] is True
    assert gpu.clock_throttled["hw_slowdown"] is False


def test_high_resolution_samples_integrate_into_busy_seconds() -> None:
    clock = Clock()
    gpu = FakeGpu(0, samples=[(1_000_000, 100), (1_166_666, 100)])
    src, _ = source(gpu, clock=clock)
    (first,), _ = src.sample()
    assert first.busy_seconds_total == 0.0  # the first read only sets the starting point
    # Next 0.5 s: three samples of 1/6 s each at 100 %, 50 %, 0 %.
    gpu.samples += [(1_333_333, 100), (1_500_000, 50), (1_666_666, 0)]
    clock.now += 0.5
    (second,), _ = src.sample()
    expected = (1_333_333 - 1_166_666) / 1e6 * 1.0 + (1_500_000 - 1_333_333) / 1e6 * 0.5
    assert second.busy_seconds_total == pytest.approx(expected, abs=1e-9)
    assert second.busy_ratio == pytest.approx(expected / 0.5)
    # No new sample in the driver's buffer: nothing is added, the counter holds.
    clock.now += 0.1
    (third,), _ = src.sample()
    assert third.busy_seconds_total == second.busy_seconds_total
    assert third.busy_ratio == 0.0


def test_without_sample_support_utilization_times_interval_is_integrated() -> None:
    clock = Clock()
    gpu = FakeGpu(0, util=40, samples_supported=False)
    src, _ = source(gpu, clock=clock)
    src.sample()
    clock.now += 2.0
    (sample,), status = src.sample()
    assert status.success
    assert sample.busy_seconds_total == pytest.approx(0.8)


def test_unsupported_readings_are_absent_not_failures() -> None:
    src, _ = source(FakeGpu(0, power_supported=False))
    (gpu,), status = src.sample()
    assert status.success
    assert gpu.power_watts is None


def test_vanished_gpu_drops_its_series_and_reports_failure_then_recovers() -> None:
    gpus = [FakeGpu(0, util=10), FakeGpu(1, util=20)]
    src, _ = source(*gpus)
    gpus[1].fail_with = pynvml.NVML_ERROR_GPU_IS_LOST
    samples, status = src.sample()
    assert [g.index for g in samples] == [0]
    assert not status.success
    assert "GPU 1 (GPU-00000000-0000-0000-0000-000000000001): GPU is lost" in status.error
    gpus[1].fail_with = None  # back (e.g. after a reset): looked up again by UUID
    samples, status = src.sample()
    assert [g.index for g in samples] == [0, 1]
    assert status.success


def test_nvml_error_on_a_call_is_a_collector_failure_not_a_crash() -> None:
    gpu = FakeGpu(0)
    src, _ = source(gpu)
    gpu.fail_with = pynvml.NVML_ERROR_UNKNOWN
    samples, status = src.sample()
    assert samples == ()
    assert not status.success and "Unknown Error" in status.error


def test_no_library_means_unavailable_and_a_failed_collector() -> None:
    src = GpuSource(nvml=FakeNvml([], library_missing=True), clock=Clock())
    with pytest.raises(GpuUnavailable, match="NVML Shared Library Not Found"):
        src.start()
    samples, status = src.sample()
    assert samples == ()
    assert status == CollectorStatus(False, status.duration_seconds, status.error)
    assert "NVML Shared Library Not Found" in status.error
    assert not src.started_once


def test_gpm_activity_from_two_samples_on_supported_gpus() -> None:
    gpu = FakeGpu(0, gpm_supported=True, gpm_values=(62.5, 40.0, 85.0))
    src, nv = source(gpu)
    (first,), _ = src.sample()
    assert first.sm_active_ratio is None  # one GPM sample is not an interval yet
    (second,), _ = src.sample()
    assert (second.sm_active_ratio, second.tensor_active_ratio, second.dram_active_ratio) == (
        0.625,
        0.4,
        0.85,
    )
    assert nv.gpm_gets == 2


def test_gpm_absent_on_older_gpus() -> None:
    src, nv = source(FakeGpu(0, name="NVIDIA A10G", gpm_supported=False))
    src.sample()
    (gpu,), _ = src.sample()
    assert gpu.sm_active_ratio is None and nv.gpm_gets == 0


def test_exposition_of_gpu_series() -> None:
    src, _ = source(FakeGpu(0, util=50, throttle_mask=0x40))
    gpus, status = src.sample()
    snap = Snapshot("vllm", False, 0.0, None, {"gpu": status}, gpus=gpus)
    page = render(snap).decode()
    gpu = {
        "gpu": "0",
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    }
    assert page_value(page, "inferwatch_gpu_utilization_ratio", **gpu) == 0.5
    assert (
        page_value(page, "inferwatch_gpu_memory_bandwidth_peak_bytes_per_second", **gpu)
        == 3.35232e12
    )
    assert (
        page_value(page, "inferwatch_gpu_clock_throttled", reason="hw_thermal_slowdown", **gpu)
        == 1.0
    )
    assert page_value(page, "inferwatch_gpu_clock_throttled", reason="sw_power_cap", **gpu) == 0.0
    assert page_value(page, "inferwatch_gpu_busy_seconds_total", **gpu) == 0.0
    assert page_value(page, "inferwatch_collector_success", collector="gpu") == 1.0


def test_close_shuts_nvml_down() -> None:
    src, nv = source(FakeGpu(0))
    src.close()
    assert nv.shutdown
