"""The triage dashboard's top row, without a header: prefill or decode, and which layer?

Stats for the phase (TTFT p95 against its threshold, ITL p95 against the decode floor) and
the layer (queue, queued-while-idle time, GPU busy, KV-cache use), then the alerts firing
now, each linked to its runbook.
"""

from __future__ import annotations

from inferwatch.dashboards.queries import (
    DECODE_FLOOR,
    FIRING_ALERTS,
    GPU_ONLY,
    NODE,
    PanelSpec,
    Query,
    limit,
    quantile,
    series,
)
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel


def top_row_panels(spec: Spec) -> list[PanelSpec]:
    """The phase, the layer, and the alerts firing now."""
    return [*_phase_stats(spec), *_queue_stats(), *_resource_stats(spec), _firing_alerts()]


def _phase_stats(spec: Spec) -> list[PanelSpec]:
    """Prefill or decode: TTFT p95 against its threshold, ITL p95 against the floor."""
    window, threshold = spec.timing.window, spec.threshold
    return [
        PanelSpec(
            Panel.TTFT_VS_THRESHOLD,
            "Time to first token, p95 over the selected instances. Healthy: under the threshold "
            f"({threshold('ttft_p95_seconds'):g} s, from the alert rules). High with a normal "
            "ITL means the phase is prefill: look at the TTFT split to tell queueing (capacity, "
            "scheduling) from prefill compute (long prompts, no prefix caching).",
            [Query(quantile(0.95, "time_to_first_token_seconds", window), "TTFT p95")],
            unit="s",
            kind="stat",
            width=5,
            height=5,
            thresholds=limit(threshold("ttft_p95_seconds")),
        ),
        PanelSpec(
            Panel.ITL_VS_FLOOR,
            "Inter-token latency p95 next to the decode floor (model weight bytes / aggregate peak "
            "memory bandwidth, the fastest a decode step can be). Near the floor: decode is "
            "hardware-bound, only quantization or more GPUs help. Far above it with a normal TTFT: "
            "the phase is decode and time is lost to batching, KV reads or kernels.",
            [
                Query(quantile(0.95, "inter_token_latency_seconds", window), "ITL p95"),
                Query(DECODE_FLOOR, "decode floor"),
            ],
            unit="s",
            kind="stat",
            width=5,
            height=5,
            thresholds=limit(threshold("itl_p95_seconds")),
        ),
    ]


def _queue_stats() -> list[PanelSpec]:
    """Which layer, the queue: its depth now, and the time it waited on an idle GPU."""
    return [
        PanelSpec(
            Panel.QUEUE_DEPTH,
            "Requests waiting to be scheduled, now. Healthy: 0 or brief spikes. A queue that "
            "grows while the GPU is busy is a capacity problem; a queue while the GPU idles is a "
            "scheduling or CPU problem (see Queued while idle).",
            [Query(f"sum({series('requests_waiting')})", "waiting")],
            kind="stat",
            width=3,
            height=5,
            thresholds=[(None, "green"), (1, "yellow"), (20, "red")],
        ),
        PanelSpec(
            Panel.QUEUED_WHILE_IDLE,
            "Seconds in the selected time range during which requests waited while the GPU "
            "(or, without NVML, the engine) sat idle. Healthy: 0. Anything above is the sharpest "
            "symptom of a scheduler or CPU bottleneck: work is queued, the accelerator has "
            "nothing to do.",
            [
                Query(
                    f"sum(increase({series('queued_while_idle_seconds')}[$__range]))",
                    "queued while idle",
                    instant=True,
                )
            ],
            unit="s",
            kind="stat",
            width=4,
            height=5,
            thresholds=[(None, "green"), (1, "red")],
        ),
    ]


def _resource_stats(spec: Spec) -> list[PanelSpec]:
    """Which layer, the resources: GPU busy share and KV-cache use."""
    rate, threshold = spec.rate_name, spec.threshold
    return [
        PanelSpec(
            Panel.GPU_BUSY,
            "GPU-only. Share of time a kernel ran, averaged over the selected instances' GPUs "
            "(integrated from NVML's high-resolution samples). Well below 100 % while requests "
            "run: the GPU is starved (small batches, CPU preprocessing, the scheduler).",
            [Query(f"avg(instance:inferwatch_gpu_busy_seconds:avg_{rate}{{{NODE}}})", "busy")],
            unit="percentunit",
            kind="stat",
            width=3,
            height=5,
            no_value=GPU_ONLY,
            thresholds=[
                (None, "red"),
                (threshold("gpu_busy_low"), "yellow"),
                (threshold("gpu_busy_high"), "green"),
            ],
        ),
        PanelSpec(
            Panel.KV_CACHE,
            "Highest KV-cache use among the selected engines. Healthy: below "
            f"{threshold('kv_usage_high') * 100:g} %. Pinned near 100 % the scheduler cannot "
            "admit new requests and starts preempting running ones (memory layer).",
            [Query(f"max({series('kv_cache_usage_ratio')})", "KV cache")],
            unit="percentunit",
            kind="stat",
            width=4,
            height=5,
            thresholds=[(None, "green"), (threshold("kv_usage_high"), "red")],
        ),
    ]


def _firing_alerts() -> PanelSpec:
    """A table of the alerts firing now, one row per alert and pod."""
    return PanelSpec(
        Panel.FIRING_ALERTS,
        "inferwatch alerts firing now for the selected model (and those without a model, "
        "such as GPU alerts): one row per alert and pod with its severity, phase and layer. "
        "The alert's name links to its runbook. Empty: nothing fires.",
        [Query(FIRING_ALERTS, instant=True, table=True)],
        kind="table",
        width=24,
        height=6,
        no_value="no inferwatch alert firing",
        runbook_column="alertname",
    )
