"""The triage dashboard's "GPU: compute and memory" and "Communication" rows: NVML's panels.

Per GPU: busy share, SM/tensor/DRAM activity and memory held; then clocks and throttling,
power and temperature, and memory bandwidth against the GPU's peak. The communication row
(``communication_panels``): NVLink and PCIe traffic against each link's peak. Every panel
here shows "GPU-only: no NVML data" on machines without a GPU (``GPU_ONLY_PANELS``).
"""

from __future__ import annotations

from inferwatch.dashboards.queries import (
    GPU_ONLY,
    NODE,
    RATE_INTERVAL,
    PanelSpec,
    Query,
    series,
)
from inferwatch.gpu_gauges import GPU_GAUGES
from inferwatch.method.spec import Spec
from inferwatch.method.thresholds import THROTTLE_REASONS
from inferwatch.panels import Panel


def gpu_panels(spec: Spec) -> list[PanelSpec]:
    """The row's panels: what the GPUs do, then what holds them back."""
    return [*_gpu_use(), *_gpu_limits(spec)]


def _gpu_use() -> list[PanelSpec]:
    """GPU row, what the GPUs do: busy share, SM/tensor/DRAM activity, memory held."""
    return [
        PanelSpec(
            Panel.GPU_BUSY_BY_GPU,
            "GPU-only. Share of time a kernel ran, per GPU (NVML duty cycle, integrated from "
            "high-resolution samples). Low while requests run: the GPU waits for work.",
            [
                Query(
                    f"rate({series('gpu_busy_seconds', NODE)}[{RATE_INTERVAL}])",
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            unit="percentunit",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            Panel.GPU_ACTIVITY,
            "GPU-only, Hopper and newer (NVML GPM). Duty cycle says a kernel ran; these say how "
            "much of the GPU worked: SMs busy, tensor cores, and DRAM bandwidth used. Decode is "
            "memory-bound (DRAM high, tensor low); prefill compute-bound (tensor high).",
            gauges(Panel.GPU_ACTIVITY, "percentunit"),
            unit="percentunit",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            Panel.GPU_MEMORY,
            "GPU-only. Memory used and installed per GPU. vLLM reserves most of it for the KV "
            "cache up front (--gpu-memory-utilization), so high use is normal.",
            [
                Query(series("gpu_memory_used_bytes", NODE), "used {{instance}} GPU {{gpu}}"),
                Query(series("gpu_memory_total_bytes", NODE), "total {{instance}} GPU {{gpu}}"),
            ],
            unit="bytes",
            no_value=GPU_ONLY,
        ),
    ]


def _gpu_limits(spec: Spec) -> list[PanelSpec]:
    """GPU row, what holds the GPUs back: clocks and throttling, power and heat, bandwidth."""
    window = spec.timing.window
    throttling = f'{NODE}, reason=~"{THROTTLE_REASONS}|sw_power_cap"'
    throttled = series("gpu_clock_throttled", throttling)
    return [
        PanelSpec(
            Panel.GPU_CLOCKS,
            "GPU-only. SM clock per GPU, and the clock-event reasons holding it down. Thermal or "
            "hardware slowdown makes every kernel slower (InferenceGPUThrottling); a power cap "
            "under full load is normal.",
            [
                *gauges(Panel.GPU_CLOCKS, "hertz"),
                Query(
                    f"{throttled} == 1",
                    "throttled: {{reason}} {{instance}} GPU {{gpu}}",
                    unit="bool_yes_no",
                ),
            ],
            unit="hertz",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            Panel.GPU_POWER,
            "GPU-only. Power draw and core temperature per GPU. A temperature near the slowdown "
            "point with dropping clocks points at cooling.",
            gauges(Panel.GPU_POWER, "watt"),
            unit="watt",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            Panel.MEMORY_BANDWIDTH,
            "GPU-only, and vLLM with --enable-mfu-metrics: vLLM's estimate of bytes read per GPU "
            "over the GPU's peak bandwidth. Near 100 % during decode: the roofline is reached.",
            [
                Query(
                    f"sum without (engine) (rate({series('estimated_read_bytes')}[{window}]))\n"
                    "  / on (instance, job) group_left avg by (instance, job) "
                    f"({series('gpu_memory_bandwidth_peak_bytes_per_second', NODE)})",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            no_value=GPU_ONLY,
        ),
    ]


def gauges(panel: Panel, unit: str) -> list[Query]:
    """The GPU gauges of the table (:mod:`inferwatch.gpu_gauges`) that ``panel`` plots, one
    line per GPU; ``unit``: the panel's."""
    return [
        Query(
            series(gauge.name, NODE),
            f"{gauge.legend} {{{{instance}}}} GPU {{{{gpu}}}}",
            unit=None if gauge.unit == unit else gauge.unit,
        )
        for gauge in GPU_GAUGES
        if gauge.panel is panel
    ]


def communication_panels() -> list[PanelSpec]:
    """The communication row: NVLink (tensor-parallel all-reduce between GPUs) and PCIe
    (host<->GPU transfers: inputs, outputs, KV offload), per GPU, against each link's peak."""
    pcie = series("gpu_pcie_bytes_per_second", NODE)
    pcie_peak = series("gpu_pcie_peak_bytes_per_second", NODE)
    nvlink = f"rate({series('gpu_nvlink_bytes', NODE)}[{RATE_INTERVAL}])"
    nvlink_peak = series("gpu_nvlink_peak_bytes_per_second", NODE)
    per_gpu = "{{direction}} {{instance}} GPU {{gpu}}"
    return [
        PanelSpec(
            Panel.LINK_SHARE,
            "GPU-only. Traffic over each GPU's links as a share of the link's peak, per "
            "direction. NVLink near its peak during decode: tensor-parallel all-reduce is the "
            "limit (fewer GPUs per replica, or a faster interconnect). PCIe near its peak: "
            "host transfers (KV offload, large inputs, a GPU without NVLink doing "
            "tensor-parallel over PCIe).",
            [
                Query(
                    f"{nvlink}\n  / ignoring (direction) group_left {nvlink_peak}",
                    f"NVLink {per_gpu}",
                ),
                Query(
                    f"{pcie}\n  / ignoring (direction) group_left {pcie_peak}", f"PCIe {per_gpu}"
                ),
            ],
            unit="percentunit",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            Panel.NVLINK_THROUGHPUT,
            "GPU-only, GPUs with NVLink. Bytes per second over all of a GPU's NVLink links, per "
            "direction, with the links' peak. Tensor-parallel replicas move activations over "
            "NVLink every layer: the traffic follows the token rate.",
            [
                Query(nvlink, per_gpu),
                Query(nvlink_peak, "peak {{instance}} GPU {{gpu}}"),
            ],
            unit="Bps",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            Panel.PCIE_THROUGHPUT,
            "GPU-only. PCIe bytes per second per GPU (tx: GPU to host, rx: host to GPU), with "
            "the link's peak. A GPU whose link trained below its maximum generation or width "
            "shows a low peak line.",
            [
                Query(pcie, per_gpu),
                Query(pcie_peak, "peak {{instance}} GPU {{gpu}}"),
            ],
            unit="Bps",
            no_value=GPU_ONLY,
        ),
    ]
