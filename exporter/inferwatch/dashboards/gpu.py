"""The "GPU: compute and memory" row of the triage dashboard: the panels that read NVML.

Per GPU: busy share, SM/tensor/DRAM activity and memory held; then clocks and throttling,
power and temperature, and memory bandwidth against the GPU's peak. Every panel here shows
"GPU-only: no NVML data" on machines without a GPU (``GPU_ONLY_PANELS``).
"""

from __future__ import annotations

from inferwatch.dashboards.queries import GPU_ONLY, NODE, TARGET, PanelSpec, Query
from inferwatch.method.panels import Panel as P
from inferwatch.method.spec import Spec
from inferwatch.method.thresholds import THROTTLE_REASONS


def gpu_panels(spec: Spec) -> list[PanelSpec]:
    """The row's panels: what the GPUs do, then what holds them back."""
    return [*_gpu_use(), *_gpu_limits(spec)]


def _gpu_use() -> list[PanelSpec]:
    """GPU row, what the GPUs do: busy share, SM/tensor/DRAM activity, memory held."""
    return [
        PanelSpec(
            P.GPU_BUSY_BY_GPU,
            "GPU-only. Share of time a kernel ran, per GPU (NVML duty cycle, integrated from "
            "high-resolution samples). Low while requests run: the GPU waits for work.",
            [
                Query(
                    f"rate(inferwatch_gpu_busy_seconds_total{{{NODE}}}[$__rate_interval])",
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            unit="percentunit",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            P.GPU_ACTIVITY,
            "GPU-only, Hopper and newer (NVML GPM). Duty cycle says a kernel ran; these say how "
            "much of the GPU worked: SMs busy, tensor cores, and DRAM bandwidth used. Decode is "
            "memory-bound (DRAM high, tensor low); prefill compute-bound (tensor high).",
            [
                Query(
                    f"avg by (instance) (inferwatch_gpu_sm_active_ratio{{{NODE}}})",
                    "SM {{instance}}",
                ),
                Query(
                    f"avg by (instance) (inferwatch_gpu_tensor_active_ratio{{{NODE}}})",
                    "tensor {{instance}}",
                ),
                Query(
                    f"avg by (instance) (inferwatch_gpu_dram_active_ratio{{{NODE}}})",
                    "DRAM {{instance}}",
                ),
            ],
            unit="percentunit",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            P.GPU_MEMORY,
            "GPU-only. Memory used and installed per GPU. vLLM reserves most of it for the KV "
            "cache up front (--gpu-memory-utilization), so high use is normal.",
            [
                Query(
                    f"inferwatch_gpu_memory_used_bytes{{{NODE}}}", "used {{instance}} GPU {{gpu}}"
                ),
                Query(
                    f"inferwatch_gpu_memory_total_bytes{{{NODE}}}", "total {{instance}} GPU {{gpu}}"
                ),
            ],
            unit="bytes",
            no_value=GPU_ONLY,
        ),
    ]


def _gpu_limits(spec: Spec) -> list[PanelSpec]:
    """GPU row, what holds the GPUs back: clocks and throttling, power and heat, bandwidth."""
    w = spec.w
    return [
        PanelSpec(
            P.GPU_CLOCKS,
            "GPU-only. SM clock per GPU, and the clock-event reasons holding it down. Thermal or "
            "hardware slowdown makes every kernel slower (InferenceGPUThrottling); a power cap "
            "under full load is normal.",
            [
                Query(
                    f"inferwatch_gpu_sm_clock_hertz{{{NODE}}}", "SM clock {{instance}} GPU {{gpu}}"
                ),
                Query(
                    f'inferwatch_gpu_clock_throttled{{{NODE}, reason=~"{THROTTLE_REASONS}|sw_power_cap"}} == 1',
                    "throttled: {{reason}} {{instance}} GPU {{gpu}}",
                ),
            ],
            unit="hertz",
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            P.GPU_POWER,
            "GPU-only. Power draw and core temperature per GPU. A temperature near the slowdown "
            "point with dropping clocks points at cooling.",
            [
                Query(f"inferwatch_gpu_power_watts{{{NODE}}}", "W {{instance}} GPU {{gpu}}"),
                Query(
                    f"inferwatch_gpu_temperature_celsius{{{NODE}}}", "°C {{instance}} GPU {{gpu}}"
                ),
            ],
            no_value=GPU_ONLY,
        ),
        PanelSpec(
            P.MEMORY_BANDWIDTH,
            "GPU-only, and vLLM with --enable-mfu-metrics: vLLM's estimate of bytes read per GPU "
            "over the GPU's peak bandwidth. Near 100 % during decode: the roofline is reached.",
            [
                Query(
                    f"instance:inferwatch_estimated_read_bytes:per_peak_bandwidth_{w}{{{TARGET}}}",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            no_value=GPU_ONLY,
        ),
    ]
