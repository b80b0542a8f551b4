"""The metric contract: every series inferwatch exposes, with its type and help text.

Names are a contract (dashboards, rules and external checks rely on them); docs/metrics.md's
table is generated from these definitions. Backends map their own families onto the
``BACKEND`` entries; the exporter itself produces the rest.
"""

from __future__ import annotations

from inferwatch.gpu_gauges import GPU_GAUGES
from inferwatch.metrics.definition import PREFIX, C, G, H, Kind, MetricDef, S
from inferwatch.metrics.definition import defs as _defs
from inferwatch.metrics.kv_transfer import KV_TRANSFER
from inferwatch.metrics.router import ROUTER

__all__ = ["PREFIX", "Kind", "MetricDef"]

# Series a backend module can provide (labels: backend, model, [engine], [reason]).
BACKEND: dict[str, MetricDef] = _defs(
    MetricDef("requests_running", G, "Requests in the running batch."),
    MetricDef("requests_waiting", G, "Requests waiting to be scheduled (queue depth)."),
    MetricDef("requests_deferred", G, "Of those, requests held back by other than capacity."),
    MetricDef("kv_cache_usage_ratio", G, "Fraction of the KV cache in use, 0..1."),
    MetricDef("preemptions", C, "Requests preempted (evicted from the KV cache) by the scheduler."),
    MetricDef("prompt_tokens", C, "Prompt (prefill) tokens processed."),
    MetricDef("generation_tokens", C, "Generated (decode) tokens."),
    MetricDef(
        "requests_finished",
        C,
        "Finished requests by reason (stop, length, abort, error; success where the server "
        "does not tell stop from length).",
        ("reason",),
    ),
    MetricDef("prefix_cache_queries", C, "Prompt tokens looked up in the prefix cache."),
    MetricDef("prefix_cache_hits", C, "Prompt tokens found in the prefix cache."),
    MetricDef("engine_steps", C, "Scheduler iterations (engine progress)."),
    MetricDef(
        "scheduler_idle_seconds",
        C,
        "Seconds the backend's scheduler had no running or queued request (its own account).",
    ),
    MetricDef("frontend_cpu_seconds", C, "CPU time of the server's API/tokenizer process."),
    MetricDef("estimated_read_bytes", C, "Backend's estimate of bytes read from GPU memory."),
    MetricDef("estimated_flops", C, "Backend's estimate of floating-point operations executed."),
    # The request latencies, each with the field of a traced request its exemplars show.
    *(
        MetricDef(key, H, text, exemplar=field)
        for key, text, field in (
            ("time_to_first_token_seconds", "Time to first token (TTFT), server side.", "ttft"),
            (
                "inter_token_latency_seconds",
                "Latency between successive output tokens.",
                "per_token",
            ),
            ("request_duration_seconds", "End-to-end request latency, server side.", "e2e"),
            (
                "request_queue_time_seconds",
                "Time a request waited before first scheduled.",
                "queue",
            ),
            (
                "request_prefill_time_seconds",
                "Time from first scheduled to first token.",
                "prefill",
            ),
            ("request_decode_time_seconds", "Time from first token to last token.", "decode"),
        )
    ),
    MetricDef("request_prompt_tokens", H, "Prompt length of finished requests, in tokens."),
    MetricDef("request_generation_tokens", H, "Output length of finished requests, in tokens."),
    MetricDef("engine_step_tokens", H, "Tokens per scheduler step (batch size proxy)."),
    MetricDef(
        "engine_step_seconds",
        H,
        "Duration of one engine step (a forward of the running batch) by kind, prefill or "
        "decode: a decode step gives every running request one token.",
        ("kind",),
    ),
    MetricDef(
        "request_time_per_output_token_seconds",
        H,
        "Time per output token of finished requests (TPOT: decode time over output tokens "
        "after the first), as the server measures it per request.",
    ),
    MetricDef(
        "kv_cache_capacity_tokens",
        G,
        "Tokens the KV cache holds when full (its size in tokens, or blocks x block size), as "
        "the server reports it.",
    ),
    MetricDef(
        "batch_reserved_tokens",
        G,
        "Tokens the running batch has reserved (its requests' prompts and most new tokens): "
        "what a server that admits by a token budget counts against it.",
    ),
    MetricDef(
        "batch_token_budget",
        G,
        "The most tokens the running batch may reserve: a full budget holds new requests in "
        "the queue, as a full KV cache does elsewhere.",
    ),
    MetricDef("lora_adapters_active", G, "LoRA adapters with requests in the engine."),
    MetricDef("lora_adapters_max", G, "The most LoRA adapters one batch holds."),
    MetricDef("spec_decode_draft_tokens", C, "Speculative decoding: draft tokens proposed."),
    MetricDef("spec_decode_accepted_tokens", C, "Speculative decoding: draft tokens accepted."),
    MetricDef(
        "http_requests",
        C,
        "HTTP responses of the server's inference API by status class (2xx, 4xx, 5xx).",
        ("status",),
    ),
    *KV_TRANSFER.values(),
    *ROUTER.values(),
)

# Series the GPU source provides (labels: gpu, uuid, name).
GPU: dict[str, MetricDef] = _defs(
    MetricDef("gpu_utilization_ratio", G, "NVML: fraction of the last sample period a kernel ran."),
    MetricDef("gpu_busy_seconds", C, "Seconds a kernel ran, integrated from NVML samples."),
    MetricDef("gpu_memory_used_bytes", G, "GPU memory in use."),
    MetricDef("gpu_memory_total_bytes", G, "GPU memory installed."),
    MetricDef(
        "gpu_memory_bandwidth_peak_bytes_per_second",
        G,
        "Peak memory bandwidth: bus width x max memory clock x 2.",
    ),
    *(MetricDef(gauge.name, G, gauge.help) for gauge in GPU_GAUGES),
    MetricDef(
        "gpu_clock_throttled",
        G,
        "1 while clocks are held down for the labelled reason.",
        ("reason",),
    ),
    MetricDef(
        "gpu_pcie_bytes_per_second",
        G,
        "PCIe throughput by direction (tx: GPU to host, rx: host to GPU), averaged over the "
        "poll interval (NVML's PCIe byte counters, else GPM); NVML's 20 ms sample where "
        "neither is available.",
        ("direction",),
    ),
    MetricDef("gpu_pcie_peak_bytes_per_second", G, "PCIe peak per direction: rate x width."),
    MetricDef(
        "gpu_nvlink_bytes",
        C,
        "Bytes over all NVLink links by direction (tx, rx); absent without NVLink.",
        ("direction",),
    ),
    MetricDef(
        "gpu_nvlink_peak_bytes_per_second",
        G,
        "NVLink peak per direction: the sum of the active links' speeds.",
    ),
    # Health: a GPU that is failing, not slow (collect/gpu_health.py).
    MetricDef(
        "gpu_ecc_errors",
        C,
        "ECC errors by error (corrected; uncorrected: the data read was wrong) and counter "
        "(volatile: since the driver loaded; aggregate: lifetime); absent without ECC.",
        ("error", "counter"),
    ),
    MetricDef("gpu_remapped_rows", G, "Memory rows remapped to spares, by error kind.", ("kind",)),
    MetricDef("gpu_row_remap_pending", G, "1 while a row remap waits for a GPU reset."),
    MetricDef("gpu_row_remap_failed", G, "1 once a row remap failed: no spare rows left."),
    MetricDef("gpu_retired_pages_pending", G, "1 while retired pages wait for a GPU reset."),
    MetricDef("gpu_pcie_replays", C, "PCIe link-level retransmissions (a marginal link)."),
    MetricDef(
        "gpu_xid_errors", C, "Critical XID errors by code, since the exporter started.", ("xid",)
    ),
)


# Signals derived by the poller (labels: backend, model).
DERIVED: dict[str, MetricDef] = _defs(
    MetricDef(
        "queued_while_idle",
        G,
        "1 while requests wait and the GPU (or, without NVML, the engine) is idle.",
    ),
    MetricDef(
        "queued_while_idle_seconds",
        C,
        "Seconds requests waited while the GPU/engine was idle, integrated at poll resolution.",
    ),
    MetricDef(
        "decode_floor_seconds",
        G,
        "Hardware floor of per-token decode latency: model weight bytes / peak memory bandwidth.",
    ),
)

# Latency quantiles over the rules' rate window, computed by the poller from its polls: what
# the alerts judge one pod by (labels: backend, model, quantile; the engines pooled). Summaries
# of quantiles alone: the window's count and sum are not counters.
WINDOW_QUANTILES = ("0.5", "0.95", "0.99")
LATENCY_WINDOW: dict[str, MetricDef] = _defs(
    MetricDef(
        "time_to_first_token_window_seconds",
        S,
        "TTFT quantiles over the rate window (the rules' 5m): histogram_quantile of the "
        "window's increase, from the exporter's polls; NaN without a first token in it.",
    ),
    MetricDef(
        "inter_token_latency_window_seconds",
        S,
        "Inter-token latency quantiles over the rate window, as the TTFT ones.",
    ),
)

# Values from the baseline file (``serve --baseline``), for the cell comparable to the
# current load (labels: backend, model, concurrency, prompt_tokens, output_tokens, percentile).
BASELINE: dict[str, MetricDef] = _defs(
    MetricDef(
        "baseline_time_to_first_token_seconds",
        G,
        "Baseline TTFT (client side) at the measured concurrency nearest the load over the rate window.",
    ),
    MetricDef(
        "baseline_inter_token_latency_seconds",
        G,
        "Baseline inter-token latency at the measured concurrency nearest the load over the rate window.",
    ),
    MetricDef(
        "baseline_request_duration_seconds",
        G,
        "Baseline end-to-end latency at the measured concurrency nearest the load over the rate window.",
    ),
)

# The baseline file's capacity (``inferwatch baseline --search on``), at the measured
# prompt/output shape nearest the live requests (labels: backend, model, prompt_tokens,
# output_tokens: the measured shape's).
CAPACITY: dict[str, MetricDef] = _defs(
    MetricDef(
        "baseline_capacity_requests_per_second",
        G,
        "Requests/s one replica carries with goodput at its target (the baseline's load "
        "search), scaled from the measured output length to the live one over the rate window.",
    ),
    MetricDef(
        "baseline_step_requests_per_second",
        G,
        "Requests/s the server finished at each rate the load search offered (label rate), "
        "at the measured shape: the x axis of the latency-vs-load curve, as measured.",
        ("rate",),
    ),
    MetricDef(
        "baseline_step_goodput_ratio",
        G,
        "Share of the requests that met every objective jointly at each offered rate.",
        ("rate",),
    ),
    MetricDef(
        "baseline_step_latency_seconds",
        G,
        "Latency p95 (client side) at each offered rate, by latency (ttft, itl, e2e).",
        ("rate", "latency"),
    ),
)

# The canary (``serve --canary on``): small streamed requests of its own, timed client side
# (labels: backend, model). Only while the canary is on. A probe's result is one of these.
CANARY_RESULTS = ("ok", "http_error", "timeout", "connect_error", "bad_stream")
# The canary's bucket bounds (seconds). TTFT: a short prompt on an idle GPU answers in tens
# of ms, a queued or CPU-bound one in seconds; up to the longest sensible timeout.
# Inter-token gaps: ~5-50 ms decode steps on a GPU, up to the stalls (a preemption, a long
# prefill batched in) worth seeing. End to end: TTFT plus a few dozen tokens.
CANARY_TTFT_BOUNDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CANARY_ITL_BOUNDS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CANARY_E2E_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CANARY: dict[str, MetricDef] = _defs(
    MetricDef(
        "canary_time_to_first_token_seconds",
        H,
        "Time to first token of the canary's successful probes, client side.",
    ),
    MetricDef(
        "canary_inter_token_latency_seconds",
        H,
        "Gaps between successive tokens of the canary's successful probes, client side.",
    ),
    MetricDef(
        "canary_request_duration_seconds",
        H,
        "End-to-end latency of the canary's successful probes, client side.",
    ),
    MetricDef(
        "canary_probes",
        C,
        f"Canary probes by result ({', '.join(CANARY_RESULTS)}).",
        ("result",),
    ),
    MetricDef(
        "canary_ttft_gap_seconds",
        G,
        "The canary's median TTFT minus the server's own median TTFT (from its histogram) over "
        "the same recent window; absent unless both saw a first token in it.",
    ),
)

# Evidence captures (``serve --capture-dir``). Only while captures are on.
CAPTURE_RESULTS = ("ok", "partial", "failed", "busy", "too_soon")
CAPTURE: dict[str, MetricDef] = _defs(
    MetricDef(
        "captures",
        C,
        "Evidence capture triggers by trigger (a cause alert, or manual) and result "
        f"({', '.join(CAPTURE_RESULTS)}).",
        ("trigger", "result"),
    ),
    MetricDef(
        "last_capture_timestamp_seconds",
        G,
        "When the last evidence capture was complete (Unix time); absent before the first.",
    ),
)

# The CPU under the server (``serve --server-cpu``, collect/server_cpu.py): each where
# this sidecar can read it.
SERVER_CPU: dict[str, MetricDef] = _defs(
    MetricDef("server_cpu_seconds", C, "CPU time of the server's threads (its process tree)."),
    MetricDef(
        "server_cpu_wait_seconds",
        C,
        "Time the server's threads were runnable but waited for a CPU (run-queue wait), summed.",
    ),
    MetricDef("server_threads", G, "Threads of the server's process tree."),
    MetricDef(
        "node_cpu_pressure_seconds",
        C,
        "Time at least one task of the node waited for a CPU (PSI cpu 'some').",
    ),
    MetricDef(
        "server_cpu_throttled_seconds", C, "Time the server's cgroup was throttled (CPU limit)."
    ),
    MetricDef(
        "server_cpu_throttled_periods",
        C,
        "Enforcement periods in which the server's cgroup was throttled.",
    ),
)

# A server's part in a disaggregated deployment (``inferwatch_backend_info``'s ``role``): it
# runs prefills and sends their KV, it receives KV and decodes, or it runs both phases (a
# server that says nothing of it has no role label).
ROLES = ("prefill", "decode", "both")

# Why the exporter leaves a backend series out and counts it.
SERIES_DROPPED_REASONS = ("label_bytes",)

# The exporter's view of itself.
SELF: dict[str, MetricDef] = _defs(
    MetricDef("backend_up", G, "1 if the last scrape of the backend succeeded."),
    MetricDef("backend_scrape_duration_seconds", G, "Duration of the last backend scrape."),
    MetricDef(
        "backend_info",
        G,
        "Backend identity; labels carry backend, version, model, the server's origin "
        "(server: scheme://host:port, never its credentials) and its role in a "
        "disaggregated deployment (prefill, decode, both; absent where unknown).",
        ("version", "server", "role"),
    ),
    MetricDef(
        "backend_series_dropped",
        C,
        "Backend series left out of the polls, by reason (label_bytes: a label set longer "
        "than --backend-max-label-bytes).",
        ("reason",),
    ),
    MetricDef("collector_success", G, "1 if the collector's last run succeeded.", ("collector",)),
    MetricDef(
        "collector_duration_seconds", G, "Duration of the collector's last run.", ("collector",)
    ),
    MetricDef(
        "build_info", G, "inferwatch build; the version label carries the release.", ("version",)
    ),
)

ALL: dict[str, MetricDef] = {
    **BACKEND,
    **GPU,
    **DERIVED,
    **LATENCY_WINDOW,
    **BASELINE,
    **CAPACITY,
    **CANARY,
    **CAPTURE,
    **SERVER_CPU,
    **SELF,
}
