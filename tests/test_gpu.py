"""The NVML path against a fake at the pynvml boundary."""

from __future__ import annotations

import pynvml
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from inferwatch.collect.gpu import GpuSource, GpuUnavailable
from inferwatch.collect.gpu_health import INTERVAL, MAX_EVENTS
from inferwatch.dashboards.triage import triage_panels
from inferwatch.gpu_gauges import GPU_GAUGES, GpuGauge
from inferwatch.method.gpu_faults import GPU_XIDS_NEEDING_ATTENTION
from inferwatch.method.spec import spec_from_config
from inferwatch.model import CollectorStatus, GpuSample, Snapshot
from inferwatch.serve.exposition import render, render_openmetrics

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


GPU_LABELS = {
    "gpu": "0",
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
}


def two_polls(gpu: FakeGpu) -> tuple[GpuSample, CollectorStatus, str]:
    """The second poll (GPM's first interval) of ``gpu``, its status and its page."""
    src, _ = source(gpu)
    src.sample()
    (sample,), status = src.sample()
    page = render(Snapshot("vllm", False, 0.0, None, {"gpu": status}, gpus=(sample,))).decode()
    return sample, status, page


@pytest.mark.parametrize("gauge", GPU_GAUGES, ids=lambda g: g.name)
def test_each_gauge_of_the_table_is_read_scaled_and_served(gauge: GpuGauge) -> None:
    sample, status, page = two_polls(FakeGpu(0, gpm_supported=True))
    assert status.success
    assert sample.gauges[gauge.name] == gauge.scale.apply(gauge.example)
    value = page_value(page, f"inferwatch_{gauge.name}", **GPU_LABELS)
    assert value == gauge.scale.apply(gauge.example)


@pytest.mark.parametrize("gauge", GPU_GAUGES, ids=lambda g: g.name)
def test_a_gauge_the_gpu_cannot_read_is_absent_not_a_failure(gauge: GpuGauge) -> None:
    sample, status, page = two_polls(FakeGpu(0, gpm_supported=True, readings={gauge.name: None}))
    assert status.success
    assert gauge.name not in sample.gauges
    assert f"inferwatch_{gauge.name}{{" not in page
    assert len(sample.gauges) == len(GPU_GAUGES) - 1


@pytest.mark.parametrize("gauge", GPU_GAUGES, ids=lambda g: g.name)
def test_each_gauge_is_plotted_on_its_panel(gauge: GpuGauge) -> None:
    exprs = [
        query.expr
        for _, row in triage_panels(spec_from_config({}))
        for panel in row
        if panel.title == gauge.panel
        for query in panel.queries
    ]
    assert any(f"inferwatch_{gauge.name}{{" in expr for expr in exprs), exprs


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


GPM_GAUGES = {g.name for g in GPU_GAUGES if g.gpm}


def test_gpm_activity_from_two_samples_on_supported_gpus() -> None:
    src, nv = source(FakeGpu(0, gpm_supported=True))
    (first,), _ = src.sample()
    assert not GPM_GAUGES & first.gauges.keys()  # one GPM sample is not an interval yet
    (second,), _ = src.sample()
    assert second.gauges.keys() >= GPM_GAUGES
    assert nv.gpm_gets == 2


def test_gpm_absent_on_older_gpus() -> None:
    src, nv = source(FakeGpu(0, name="NVIDIA A10G", gpm_supported=False))
    src.sample()
    (gpu,), _ = src.sample()
    assert not GPM_GAUGES & gpu.gauges.keys() and nv.gpm_gets == 0


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


# --- communication: PCIe and NVLink -----------------------------------------------------

FI = pynvml  # field IDs and error codes, as NVML numbers them


def polls(src: GpuSource, n: int) -> list:
    out = []
    for _ in range(n):
        samples, status = src.sample()
        assert status.success, status.error
        out.append(samples[0])
    return out


def test_pcie_throughput_from_the_20ms_sample_is_kb_per_second_times_1024() -> None:
    # nvmlDeviceGetPcieThroughput returns KB/s (nvml.h); 1 KB = 1024 bytes.
    src, nv = source(FakeGpu(0, pcie_kb_per_second=(2_560_000, 512)))
    (gpu,), status = src.sample()
    assert status.success
    assert dict(gpu.pcie_bytes_per_second) == {"tx": 2_560_000 * 1024, "rx": 512 * 1024}
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == 2  # one per direction


def test_gpm_pcie_rate_in_mib_per_second_is_preferred_once_gpm_has_an_interval() -> None:
    gpu = FakeGpu(0, gpm_supported=True, gpm_pcie=(2500.0, 0.5), pcie_kb_per_second=(7, 9))
    src, nv = source(gpu)
    first, second, third = polls(src, 3)
    # First poll: one GPM sample is not an interval yet; NVML's 20 ms sample stands in.
    assert dict(first.pcie_bytes_per_second) == {"tx": 7 * 1024, "rx": 9 * 1024}
    # Then GPM's PCIE_{TX,RX}_PER_SEC, MiB/s (nvml.h), from the same GPM call as SM activity.
    assert dict(second.pcie_bytes_per_second) == {"tx": 2500 * 1024**2, "rx": 0.5 * 1024**2}
    assert dict(third.pcie_bytes_per_second) == dict(second.pcie_bytes_per_second)
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == 2  # the first poll only
    assert nv.gpm_gets == 3


def test_gpm_without_pcie_metrics_falls_back_to_the_20ms_sample() -> None:
    gpu = FakeGpu(0, gpm_supported=True, gpm_pcie_supported=False, pcie_kb_per_second=(3, 4))
    src, _ = source(gpu)
    _, second = polls(src, 2)
    assert dict(second.pcie_bytes_per_second) == {"tx": 3 * 1024, "rx": 4 * 1024}
    assert second.gauges.keys() >= GPM_GAUGES  # the other GPM metrics are unaffected


PCIE_COUNTERS = [197, 198]  # NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES (nvml.h, pynvml)


def test_pcie_counter_field_ids_are_nvmls() -> None:
    assert [FI.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, FI.NVML_FI_DEV_PCIE_COUNT_RX_BYTES] == PCIE_COUNTERS


def test_pcie_counters_give_bytes_delta_over_the_field_timestamps_per_direction() -> None:
    clock = Clock()
    gpu = FakeGpu(0, pcie_bytes=(10_000, 500), pcie_kb_per_second=(7, 9))
    src, nv = source(gpu, clock=clock)
    (first,) = polls(src, 1)
    # First poll: one reading is no interval; NVML's 20 ms sample stands in.
    assert dict(first.pcie_bytes_per_second) == {"tx": 7 * 1024, "rx": 9 * 1024}
    # 2.5 s later by the field values' timestamps (the poll clock says 5 s: not used).
    gpu.pcie_bytes = (10_000 + 5_000_000_000, 500 + 250_000_000)
    gpu.field_time_us += 2_500_000
    clock.now += 5.0
    (second,) = polls(src, 1)
    assert dict(second.pcie_bytes_per_second) == {"tx": 2e9, "rx": 1e8}
    gpu.pcie_bytes = (10_000 + 5_000_000_000, 500 + 250_000_000 + 1_000)
    gpu.field_time_us += 500_000
    (third,) = polls(src, 1)
    assert dict(third.pcie_bytes_per_second) == {"tx": 0.0, "rx": 2_000.0}
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == 2  # the first poll only


def test_pcie_counters_are_preferred_over_gpm_and_gpm_covers_their_first_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing = {fid: FI.NVML_ERROR_UNKNOWN for fid in PCIE_COUNTERS}
    gpu = FakeGpu(
        0,
        gpm_supported=True,
        gpm_pcie=(2500.0, 0.5),
        pcie_kb_per_second=(7, 9),
        pcie_bytes=(0, 0),
        field_errors=dict(failing),
    )
    src, nv = source(gpu)
    with caplog.at_level("INFO", logger="inferwatch.collect.gpu"):
        first, second = polls(src, 2)  # counters failing: as without them
    assert dict(first.pcie_bytes_per_second) == {"tx": 7 * 1024, "rx": 9 * 1024}
    assert dict(second.pcie_bytes_per_second) == {"tx": 2500 * 1024**2, "rx": 0.5 * 1024**2}
    assert sum("PCIe tx byte counter" in r.getMessage() for r in caplog.records) == 1
    gpu.field_errors.clear()  # a transient error: asked again
    (third,) = polls(src, 1)  # the counters' first reading: GPM stands in
    assert dict(third.pcie_bytes_per_second) == dict(second.pcie_bytes_per_second)
    gpu.pcie_bytes = (3_000_000, 1_000)
    gpu.field_time_us += 1_000_000
    (fourth,) = polls(src, 1)
    assert dict(fourth.pcie_bytes_per_second) == {"tx": 3e6, "rx": 1e3}
    # A failed reading drops the previous one: the next poll is a first reading again.
    gpu.field_errors.update(failing)
    polls(src, 1)
    gpu.field_errors.clear()
    gpu.pcie_bytes = (9_000_000, 2_000)
    gpu.field_time_us += 1_000_000
    (sixth,) = polls(src, 1)
    assert dict(sixth.pcie_bytes_per_second) == dict(second.pcie_bytes_per_second)
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == 2  # the first poll only


def test_pcie_counter_going_backwards_gives_no_value_that_poll() -> None:
    gpu = FakeGpu(0, pcie_bytes=(1_000_000, 1_000_000), pcie_kb_per_second=(7, 9))
    src, nv = source(gpu)
    polls(src, 1)
    gpu.pcie_bytes = (400, 3_000_000)  # tx reset (or wrapped)
    gpu.field_time_us += 1_000_000
    (reset,) = polls(src, 1)
    assert dict(reset.pcie_bytes_per_second) == {"rx": 2e6}  # tx: no value, no fallback
    gpu.pcie_bytes = (2_400, 3_000_000)  # from the reset value on
    gpu.field_time_us += 2_000_000
    (after,) = polls(src, 1)
    assert dict(after.pcie_bytes_per_second) == {"tx": 1_000.0, "rx": 0.0}
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == 2  # the first poll only


def test_pcie_counters_without_time_between_readings_fall_back() -> None:
    gpu = FakeGpu(0, pcie_bytes=(1_000, 1_000), pcie_kb_per_second=(7, 9))
    src, _ = source(gpu)
    polls(src, 1)
    (same,) = polls(src, 1)  # the same timestamp again: no interval, the 20 ms sample
    assert dict(same.pcie_bytes_per_second) == {"tx": 7 * 1024, "rx": 9 * 1024}
    gpu.field_time_us -= 1_000_000  # the wall clock stepped back
    (back,) = polls(src, 1)
    assert dict(back.pcie_bytes_per_second) == {"tx": 7 * 1024, "rx": 9 * 1024}


def test_pcie_counters_not_supported_fall_back_and_are_not_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = FakeGpu(0, pcie_bytes=None, pcie_kb_per_second=(3, 4), nvlink_kib={0: (1, 2)})
    src, nv = source(gpu)
    opened = len(nv.field_requests)
    with caplog.at_level("INFO", logger="inferwatch.collect.gpu"):
        first, second, third = polls(src, 3)
    for sample in (first, second, third):
        assert dict(sample.pcie_bytes_per_second) == {"tx": 3 * 1024, "rx": 4 * 1024}
        assert dict(sample.nvlink_bytes_total) == {"tx": 1024, "rx": 2048}
    asked = [[f for f in r if f in PCIE_COUNTERS] for r in nv.field_requests[opened:]]
    assert asked == [PCIE_COUNTERS, [], []]  # the first poll only; still one call per poll
    assert sum("PCIe tx byte counter" in r.getMessage() for r in caplog.records) == 1


def test_pcie_counters_ride_the_nvlink_field_value_call_one_per_poll_per_gpu() -> None:
    gpus = [FakeGpu(0, pcie_bytes=(0, 0)), FakeGpu(1, nvlink_links=0, pcie_bytes=(0, 0))]
    src, nv = source(*gpus)
    opened = len(nv.field_requests)
    for _ in range(3):
        for gpu in gpus:
            gpu.field_time_us += 1_000_000
        samples, status = src.sample()
        assert status.success
    assert [dict(g.pcie_bytes_per_second) for g in samples] == [{"tx": 0.0, "rx": 0.0}] * 2
    requests = nv.field_requests[opened:]
    assert len(requests) == 6  # 3 polls x 2 GPUs
    nvlink = [
        (FI.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
        (FI.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
    ]
    for with_nvlink, without in zip(requests[::2], requests[1::2], strict=True):
        assert with_nvlink == nvlink + PCIE_COUNTERS
        assert without == PCIE_COUNTERS  # no NVLink: the call carries only the PCIe counters
    # Only the first poll took the 20 ms sample (2 GPUs x 2 directions).
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == 4


@pytest.mark.parametrize(
    ("generation", "width", "expected"),
    [
        (1, 16, 16 * 250e6),  # 2.5 GT/s, 8b/10b
        (2, 8, 8 * 500e6),  # 5 GT/s, 8b/10b
        (3, 16, 16 * 8e9 * 128 / 130 / 8),  # ~15.75 GB/s
        (4, 16, 16 * 16e9 * 128 / 130 / 8),  # ~31.5 GB/s
        (5, 16, 16 * 32e9 * 128 / 130 / 8),  # ~63.0 GB/s: H100's "128 GB/s" both ways
        (6, 16, 16 * 64e9 * 242 / 256 / 8),  # 121 GB/s: FLIT, 242 of 256 bytes payload
    ],
)
def test_pcie_peak_is_lane_rate_times_width(generation: int, width: int, expected: float) -> None:
    src, _ = source(FakeGpu(0, pcie_max_generation=generation, pcie_max_width=width))
    (gpu,), _ = src.sample()
    assert gpu.pcie_peak_bytes_per_second == pytest.approx(expected, rel=1e-12)


def test_pcie_peak_of_h100_sxm_in_megabytes() -> None:
    src, nv = source(FakeGpu(0))
    (gpu,), _ = src.sample()
    assert gpu.pcie_peak_bytes_per_second == pytest.approx(63.015e9, rel=1e-4)
    src.sample()
    assert nv.calls.count("nvmlDeviceGetMaxPcieLinkGeneration") == 1  # static: read once


def test_pcie_peak_absent_for_an_unknown_generation_or_unsupported_query() -> None:
    gpus = [
        FakeGpu(0, pcie_max_generation=7),
        FakeGpu(1, call_errors={"nvmlDeviceGetMaxPcieLinkWidth": FI.NVML_ERROR_NOT_SUPPORTED}),
    ]
    src, _ = source(*gpus)
    samples, status = src.sample()
    assert status.success
    assert [g.pcie_peak_bytes_per_second for g in samples] == [None, None]


def test_nvlink_counters_sum_all_links_in_bytes_with_one_call_per_poll() -> None:
    gpu = FakeGpu(0, nvlink_kib={0: (1000, 10), 17: (3, 5)})
    src, nv = source(gpu)
    opened = nv.calls.count("nvmlDeviceGetFieldValues")
    first, second = polls(src, 2)
    # THROUGHPUT_DATA_{TX,RX} are KiB counters (nvml.h): x 1024.
    assert dict(first.nvlink_bytes_total) == {"tx": 1003 * 1024, "rx": 15 * 1024}
    gpu.nvlink_kib[5] = (1, 0)
    assert dict(polls(src, 1)[0].nvlink_bytes_total) == {"tx": 1004 * 1024, "rx": 15 * 1024}
    assert second.nvlink_bytes_total == first.nvlink_bytes_total
    assert nv.calls.count("nvmlDeviceGetFieldValues") - opened == 3


def test_nvlink_counters_per_link_where_the_aggregate_scope_is_refused() -> None:
    gpu = FakeGpu(0, nvlink_aggregate_scope=False, nvlink_kib={2: (7, 1), 9: (1, 2)})
    src, nv = source(gpu)
    first, second = polls(src, 2)
    assert dict(first.nvlink_bytes_total) == {"tx": 8 * 1024, "rx": 3 * 1024}
    assert second.nvlink_bytes_total == first.nvlink_bytes_total
    before = nv.calls.count("nvmlDeviceGetFieldValues")
    polls(src, 1)
    assert nv.calls.count("nvmlDeviceGetFieldValues") - before == 1  # still one batched call


def test_nvlink_peak_is_speed_times_active_links() -> None:
    # NVLINK_SPEED_MBPS_COMMON in MBps per link and direction, MB = 1e6 bytes.
    src, _ = source(FakeGpu(0), FakeGpu(1, nvlink_inactive=frozenset({3, 17})))
    full, degraded = src.sample()[0]
    assert full.nvlink_peak_bytes_per_second == 18 * 26562e6  # ~478 GB/s (H100: 450 + overhead)
    assert degraded.nvlink_peak_bytes_per_second == 16 * 26562e6


def test_without_nvlink_its_series_are_absent_and_not_asked_each_poll() -> None:
    src, nv = source(FakeGpu(0, name="NVIDIA A10G", nvlink_links=0, pcie_max_generation=4))
    opened = nv.calls.count("nvmlDeviceGetFieldValues")
    (gpu,), status = src.sample()
    src.sample()
    assert status.success
    assert gpu.nvlink_bytes_total == {} and gpu.nvlink_peak_bytes_per_second is None
    assert gpu.pcie_peak_bytes_per_second == pytest.approx(16 * 16e9 * 128 / 130 / 8)
    # The first poll's call carries only the PCIe counters; NOT_SUPPORTED here: no more calls.
    assert nv.field_requests[-1] == [FI.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 198]
    assert nv.calls.count("nvmlDeviceGetFieldValues") == opened + 1
    page = render(Snapshot("vllm", False, 0.0, None, {"gpu": status}, gpus=(gpu,))).decode()
    assert "inferwatch_gpu_nvlink" not in page
    assert 'inferwatch_gpu_pcie_bytes_per_second{gpu="0"' in page


def test_nvlink_counter_not_supported_leaves_only_that_series_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unsupported = {
        FI.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: FI.NVML_ERROR_NOT_SUPPORTED,
        FI.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: FI.NVML_ERROR_NOT_SUPPORTED,
    }
    src, nv = source(FakeGpu(0, util=40, field_errors=unsupported, pcie_kb_per_second=(1, 2)))
    opened = nv.calls.count("nvmlDeviceGetFieldValues")
    with caplog.at_level("INFO", logger="inferwatch.collect.gpu"):
        first, second = polls(src, 2)
    assert first.nvlink_bytes_total == {}
    assert first.nvlink_peak_bytes_per_second == 18 * 26562e6
    assert first.utilization_ratio == 0.4 and first.pcie_bytes_per_second["rx"] == 2048
    # NOT_SUPPORTED is for good: asked on the first poll (aggregate, then per link) only.
    assert nv.calls.count("nvmlDeviceGetFieldValues") - opened == 2
    assert second.nvlink_bytes_total == {}
    assert sum("NVLink tx unavailable" in r.getMessage() for r in caplog.records) == 1


def test_one_direction_failing_keeps_the_other() -> None:
    errors = {FI.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: FI.NVML_ERROR_UNKNOWN}
    src, _ = source(FakeGpu(0, field_errors=errors, nvlink_kib={0: (5, 6)}))
    (gpu,), status = src.sample()
    assert status.success
    assert dict(gpu.nvlink_bytes_total) == {"rx": 6 * 1024}


def test_pcie_throughput_errors_leave_it_out_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = FakeGpu(0, util=30, call_errors={"nvmlDeviceGetPcieThroughput": FI.NVML_ERROR_UNKNOWN})
    src, nv = source(gpu)
    with caplog.at_level("INFO", logger="inferwatch.collect.gpu"):
        first, second = polls(src, 2)
    assert first.pcie_bytes_per_second == {} and second.pcie_bytes_per_second == {}
    assert first.utilization_ratio == 0.3 and first.nvlink_peak_bytes_per_second is not None
    assert first.pcie_peak_bytes_per_second is not None
    assert sum("PCIe tx throughput" in r.getMessage() for r in caplog.records) == 1
    gpu.call_errors.clear()  # a transient error: asked again, and back
    assert polls(src, 1)[0].pcie_bytes_per_second == {"tx": 0.0, "rx": 0.0}
    gpu.call_errors["nvmlDeviceGetPcieThroughput"] = FI.NVML_ERROR_NOT_SUPPORTED
    polls(src, 1)
    asked = nv.calls.count("nvmlDeviceGetPcieThroughput")
    assert polls(src, 1)[0].pcie_bytes_per_second == {}
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == asked  # not supported: not asked


@pytest.mark.parametrize(
    "lose",
    [
        {"call_errors": {"nvmlDeviceGetFieldValues": FI.NVML_ERROR_GPU_IS_LOST}},
        {"call_errors": {"nvmlDeviceGetPcieThroughput": FI.NVML_ERROR_GPU_IS_LOST}},
        {"field_errors": {FI.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: FI.NVML_ERROR_GPU_IS_LOST}},
        {"field_errors": {FI.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: FI.NVML_ERROR_GPU_IS_LOST}},
    ],
    ids=["field-values-call", "pcie-throughput", "field-value-entry", "pcie-counter-entry"],
)
def test_gpu_lost_in_a_communication_reading_drops_that_gpu_then_recovers(lose: dict) -> None:
    gpus = [FakeGpu(0, util=10), FakeGpu(1, util=20)]
    src, _ = source(*gpus)
    for attr, value in lose.items():
        setattr(gpus[1], attr, value)
    samples, status = src.sample()
    assert [g.index for g in samples] == [0]
    assert samples[0].nvlink_bytes_total and samples[0].pcie_bytes_per_second
    assert not status.success and "GPU 1" in status.error and "GPU is lost" in status.error
    gpus[1].call_errors, gpus[1].field_errors = {}, {}
    samples, status = src.sample()
    assert [g.index for g in samples] == [0, 1] and status.success
    assert samples[1].nvlink_bytes_total == {"tx": 0.0, "rx": 0.0}


def test_exposition_of_communication_series_text_and_openmetrics() -> None:
    gpu = FakeGpu(0, pcie_kb_per_second=(1000, 250), nvlink_kib={1: (4096, 1024)})
    src, _ = source(gpu)
    gpus, status = src.sample()
    snap = Snapshot("vllm", False, 0.0, None, {"gpu": status}, gpus=gpus)
    page = render(snap).decode()
    labels = {"gpu": "0", "uuid": gpu.uuid, "name": gpu.name}
    pcie = "inferwatch_gpu_pcie_bytes_per_second"
    assert page_value(page, pcie, direction="tx", **labels) == 1000 * 1024
    assert page_value(page, pcie, direction="rx", **labels) == 250 * 1024
    nvlink = "inferwatch_gpu_nvlink_bytes_total"
    assert page_value(page, nvlink, direction="tx", **labels) == 4096 * 1024
    assert page_value(page, nvlink, direction="rx", **labels) == 1024 * 1024
    assert page.count("# TYPE inferwatch_gpu_nvlink_bytes_total counter\n") == 1
    assert page_value(page, "inferwatch_gpu_nvlink_peak_bytes_per_second", **labels) == 4.78116e11
    peak = page_value(page, "inferwatch_gpu_pcie_peak_bytes_per_second", **labels)
    assert peak == pytest.approx(63.015e9, rel=1e-4)
    om = render_openmetrics(snap).decode()
    families = {f.name: f for f in parse_openmetrics(om)}  # raises on invalid OpenMetrics
    assert families["inferwatch_gpu_nvlink_bytes"].type == "counter"
    assert {s.labels["direction"] for s in families["inferwatch_gpu_nvlink_bytes"].samples} == {
        "tx",
        "rx",
    }


# --- health: a GPU that is failing, not slow ---------------------------------------------

ECC = {
    (FI.NVML_MEMORY_ERROR_TYPE_CORRECTED, FI.NVML_VOLATILE_ECC): 12,
    (FI.NVML_MEMORY_ERROR_TYPE_CORRECTED, FI.NVML_AGGREGATE_ECC): 340,
    (FI.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, FI.NVML_VOLATILE_ECC): 1,
    (FI.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, FI.NVML_AGGREGATE_ECC): 2,
}


def readings(src: GpuSource, clock: Clock, n: int) -> list:
    """``n`` polls a health reading apart."""
    out = []
    for _ in range(n):
        out += polls(src, 1)
        clock.now += INTERVAL
    return out


def test_health_reads_ecc_row_remapping_replays_and_xids_on_a_failing_gpu() -> None:
    gpu = FakeGpu(0, ecc=ECC, remapped_rows=(3, 1, 1, 0), pcie_replays=17, xid_events=[79, 13, 79])
    clock = Clock()
    src, nv = source(gpu, clock=clock)
    (first,) = readings(src, clock, 1)
    health = first.health
    assert health.ecc_errors_total == {
        ("corrected", "volatile"): 12.0,
        ("corrected", "aggregate"): 340.0,
        ("uncorrected", "volatile"): 1.0,
        ("uncorrected", "aggregate"): 2.0,
    }
    assert health.remapped_rows == {"correctable": 3.0, "uncorrectable": 1.0}
    assert (health.row_remap_pending, health.row_remap_failed) == (1.0, 0.0)
    assert health.retired_pages_pending is None  # an H100: no page retirement (Ampere+)
    assert health.pcie_replays_total == 17.0
    # Those needing attention from 0, the rest as they come; counted from the start.
    attention = {str(x): 0.0 for x in GPU_XIDS_NEEDING_ATTENTION}
    assert health.xid_errors_total == attention | {"79": 2.0, "13": 1.0}
    gpu.xid_events.append(48)
    assert readings(src, clock, 1)[0].health.xid_errors_total == attention | {
        "79": 2.0,
        "13": 1.0,
        "48": 1.0,
    }
    # At most one reading a second, whatever the poll interval: polls in between reuse it.
    asked = nv.calls.count("nvmlDeviceGetPcieReplayCounter")
    clock.now -= INTERVAL / 2
    gpu.pcie_replays = 18
    assert polls(src, 1)[0].health.pcie_replays_total == 17.0
    assert nv.calls.count("nvmlDeviceGetPcieReplayCounter") == asked
    clock.now += INTERVAL / 2
    assert polls(src, 1)[0].health.pcie_replays_total == 18.0


def test_a_storm_of_xids_is_drained_a_bounded_number_per_poll() -> None:
    gpu = FakeGpu(0, xid_events=[13] * (MAX_EVENTS + 5))
    clock = Clock()
    src, _ = source(gpu, clock=clock)
    first, second = readings(src, clock, 2)
    assert first.health.xid_errors_total["13"] == MAX_EVENTS
    assert second.health.xid_errors_total["13"] == MAX_EVENTS + 5


def test_a_gpu_without_ecc_or_events_has_those_series_absent_not_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A V100 without ECC: NOT_SUPPORTED for ECC, row remapping and events; page retirement.
    gpu = FakeGpu(
        0, ecc_supported=False, remapped_rows=None, retired_pages_pending=1, events_supported=False
    )
    clock = Clock()
    with caplog.at_level("INFO", logger="inferwatch.collect.gpu"):
        src, nv = source(gpu, clock=clock)  # the event set is registered as the GPU opens
        first, second = readings(src, clock, 2)
    for sample in (first, second):
        health = sample.health
        assert health.ecc_errors_total == {} and health.remapped_rows == {}
        assert health.row_remap_pending is None and health.xid_errors_total == {}
        assert health.retired_pages_pending == 1.0 and health.pcie_replays_total == 0.0
    assert nv.calls.count("nvmlDeviceGetTotalEccErrors") == 1  # not supported: not asked again
    logged = [r.getMessage() for r in caplog.records]
    assert sum("ECC error counts unavailable" in m for m in logged) == 1
    assert sum("XID events unavailable" in m for m in logged) == 1


def test_a_failing_health_reading_leaves_only_its_series_and_a_lost_gpu_drops_it() -> None:
    gpus = [FakeGpu(0, call_errors={"nvmlDeviceGetPcieReplayCounter": FI.NVML_ERROR_UNKNOWN})]
    gpus.append(FakeGpu(1))
    clock = Clock()
    src, nv = source(*gpus, clock=clock)
    samples, status = src.sample()
    assert status.success and samples[0].health.pcie_replays_total is None
    assert samples[0].health.row_remap_pending == 0.0 and samples[0].utilization_ratio == 0.0
    gpus[1].call_errors["nvmlEventSetWait_v2"] = FI.NVML_ERROR_GPU_IS_LOST
    clock.now += INTERVAL
    samples, status = src.sample()
    assert [g.index for g in samples] == [0] and "GPU 1" in status.error
    src.close()
    assert nv.freed_event_sets == 2


def test_exposition_of_health_series() -> None:
    gpu = FakeGpu(0, ecc=ECC, remapped_rows=(3, 1, 1, 0), pcie_replays=17, xid_events=[79])
    src, _ = source(gpu)
    gpus, status = src.sample()
    snap = Snapshot("vllm", False, 0.0, None, {"gpu": status}, gpus=gpus)
    page = render(snap).decode()
    labels = {"gpu": "0", "uuid": gpu.uuid, "name": gpu.name}
    ecc = "inferwatch_gpu_ecc_errors_total"
    assert page_value(page, ecc, error="uncorrected", counter="volatile", **labels) == 1.0
    assert page_value(page, ecc, error="corrected", counter="aggregate", **labels) == 340.0
    assert page_value(page, "inferwatch_gpu_remapped_rows", kind="correctable", **labels) == 3.0
    assert page_value(page, "inferwatch_gpu_row_remap_pending", **labels) == 1.0
    assert page_value(page, "inferwatch_gpu_row_remap_failed", **labels) == 0.0
    assert page_value(page, "inferwatch_gpu_pcie_replays_total", **labels) == 17.0
    assert page_value(page, "inferwatch_gpu_xid_errors_total", xid="79", **labels) == 1.0
    assert page_value(page, "inferwatch_gpu_xid_errors_total", xid="48", **labels) == 0.0
    assert "inferwatch_gpu_retired_pages_pending" not in page
    om = render_openmetrics(snap).decode()
    families = {f.name: f for f in parse_openmetrics(om)}
    assert families["inferwatch_gpu_xid_errors"].type == "counter"
    assert families["inferwatch_gpu_ecc_errors"].type == "counter"
