"""The "Inference triage" dashboard: one function per row, in the dashboard's order.

The top row answers "prefill or decode, and which layer?" at a glance; the service level
objectives below it say what users feel (``slo.py``); the rows below follow the method:
latency by phase, scheduler, GPU (``gpu.py``), system, baseline. ``triage_panels`` lists
the rows by title next to the function that builds each.
"""

from __future__ import annotations

from inferwatch.dashboards.gpu import communication_panels, gpu_panels
from inferwatch.dashboards.queries import (
    GPU_ONLY,
    NO_BASELINE,
    NO_SPEC_DECODE,
    NODE,
    RATE_INTERVAL,
    TARGET,
    TOKENS,
    TOKENS_PER_SECOND,
    PanelSpec,
    Query,
    Row,
    distribution,
    limit,
    mean,
    quantile,
    quantiles,
)
from inferwatch.dashboards.slo import slo_panels
from inferwatch.method.panels import Panel as P
from inferwatch.method.spec import Spec

# The latency histograms the triage rows read (their per-instance recording rules).
TTFT_SECONDS = "inferwatch_time_to_first_token_seconds"
ITL_SECONDS = "inferwatch_inter_token_latency_seconds"
DURATION_SECONDS = "inferwatch_request_duration_seconds"
TPOT_SECONDS = "inferwatch_request_time_per_output_token_seconds"
DECODE_FLOOR = f"max(inferwatch_decode_floor_seconds{{{TARGET}}})"
# The alerts of the selected model, and those without one (GPU alerts).
FIRING = 'model=~"$model|"'


def triage_panels(spec: Spec) -> list[Row]:
    """(row title, panels) in order; the first row has no header."""
    return [
        (None, _top_row(spec)),
        ("Service level objectives: what do users feel?", slo_panels(spec)),
        ("Latency by phase: prefill or decode?", _latency_row(spec)),
        ("Scheduler: is continuous batching working?", _scheduler_row(spec)),
        ("GPU: compute and memory", gpu_panels(spec)),
        ("Communication: NVLink and PCIe", communication_panels()),
        ("System: frontend CPU, the client's path, workload", _system_row(spec)),
        ("Baseline: what regressed?", _baseline_row(spec)),
    ]


def _top_row(spec: Spec) -> list[PanelSpec]:
    """The row without a header: the phase, the layer, and the alerts firing now."""
    return [
        *_phase_stats(spec),
        *_layer_stats(spec),
        PanelSpec(
            P.FIRING_ALERTS,
            "inferwatch alerts firing now for the selected model (and those without a model, "
            "such as GPU alerts): one row per alert and pod with its severity, phase and layer. "
            "The alert's name links to its runbook. Empty: nothing fires.",
            [
                Query(
                    f'ALERTS{{alertstate="firing", alertname=~"Inference.*", {FIRING}}}',
                    instant=True,
                    table=True,
                )
            ],
            kind="table",
            width=24,
            height=6,
            no_value="no inferwatch alert firing",
            runbook_column="alertname",
        ),
    ]


def _phase_stats(spec: Spec) -> list[PanelSpec]:
    """Top row, prefill or decode: TTFT p95 against its threshold, ITL p95 against the floor."""
    window, t = spec.timing.window, spec.t
    return [
        PanelSpec(
            P.TTFT_VS_THRESHOLD,
            "Time to first token, p95 over the selected instances. Healthy: under the threshold "
            f"({t('ttft_p95_seconds'):g} s, from the alert rules). High with a normal ITL means "
            "the phase is prefill: look at the TTFT split to tell queueing (capacity, "
            "scheduling) from prefill compute (long prompts, no prefix caching).",
            [Query(quantile(0.95, TTFT_SECONDS, window), "TTFT p95")],
            unit="s",
            kind="stat",
            width=5,
            height=5,
            thresholds=limit(t("ttft_p95_seconds")),
        ),
        PanelSpec(
            P.ITL_VS_FLOOR,
            "Inter-token latency p95 next to the decode floor (model weight bytes / aggregate peak "
            "memory bandwidth, the fastest a decode step can be). Near the floor: decode is "
            "hardware-bound, only quantization or more GPUs help. Far above it with a normal TTFT: "
            "the phase is decode and time is lost to batching, KV reads or kernels.",
            [
                Query(quantile(0.95, ITL_SECONDS, window), "ITL p95"),
                Query(DECODE_FLOOR, "decode floor"),
            ],
            unit="s",
            kind="stat",
            width=5,
            height=5,
            thresholds=limit(t("itl_p95_seconds")),
        ),
    ]


def _layer_stats(spec: Spec) -> list[PanelSpec]:
    """Top row, which layer: queue, queued-while-idle time, GPU busy and KV-cache use."""
    w, t = spec.w, spec.t
    return [
        PanelSpec(
            P.QUEUE_DEPTH,
            "Requests waiting to be scheduled, now. Healthy: 0 or brief spikes. A queue that "
            "grows while the GPU is busy is a capacity problem; a queue while the GPU idles is a "
            "scheduling or CPU problem (see Queued while idle).",
            [Query(f"sum(inferwatch_requests_waiting{{{TARGET}}})", "waiting")],
            kind="stat",
            width=3,
            height=5,
            thresholds=[(None, "green"), (1, "yellow"), (20, "red")],
        ),
        PanelSpec(
            P.QUEUED_WHILE_IDLE,
            "Seconds in the selected time range during which requests waited while the GPU "
            "(or, without NVML, the engine) sat idle. Healthy: 0. Anything above is the sharpest "
            "symptom of a scheduler or CPU bottleneck: work is queued, the accelerator has "
            "nothing to do.",
            [
                Query(
                    f"sum(increase(inferwatch_queued_while_idle_seconds_total{{{TARGET}}}[$__range]))",
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
        PanelSpec(
            P.GPU_BUSY,
            "GPU-only. Share of time a kernel ran, averaged over the selected instances' GPUs "
            "(integrated from NVML's high-resolution samples). Well below 100 % while requests "
            "run: the GPU is starved (small batches, CPU preprocessing, the scheduler).",
            [Query(f"avg(instance:inferwatch_gpu_busy_seconds:avg_{w}{{{NODE}}})", "busy")],
            unit="percentunit",
            kind="stat",
            width=3,
            height=5,
            no_value=GPU_ONLY,
            thresholds=[
                (None, "red"),
                (t("gpu_busy_low"), "yellow"),
                (t("gpu_busy_high"), "green"),
            ],
        ),
        PanelSpec(
            P.KV_CACHE,
            "Highest KV-cache use among the selected engines. Healthy: below "
            f"{t('kv_usage_high') * 100:g} %. Pinned near 100 % the scheduler cannot admit new "
            "requests and starts preempting running ones (memory layer).",
            [Query(f"max(inferwatch_kv_cache_usage_ratio{{{TARGET}}})", "KV cache")],
            unit="percentunit",
            kind="stat",
            width=4,
            height=5,
            thresholds=[(None, "green"), (t("kv_usage_high"), "red")],
        ),
    ]


def _latency_row(spec: Spec) -> list[PanelSpec]:
    """Latency by phase: prefill or decode?"""
    window, t = spec.timing.window, spec.t
    return [
        PanelSpec(
            P.TTFT,
            "Time to first token quantiles (server side, includes queueing and tokenization). "
            "Healthy: p95 under the dashed threshold. TTFT high with normal inter-token latency "
            "puts the problem in the prefill phase.",
            quantiles(TTFT_SECONDS, window, "TTFT"),
            unit="s",
            width=12,
            thresholds=limit(t("ttft_p95_seconds")),
        ),
        PanelSpec(
            P.ITL,
            "Latency between successive output tokens of a request (one sample per decode step), "
            "with the decode floor. Healthy: p95 flat, under the threshold and within a small "
            "factor of the floor. A p99 far above p50 while prompts are prefilled: prefill "
            "stalls decode (chunk size).",
            [*quantiles(ITL_SECONDS, window, "ITL"), Query(DECODE_FLOOR, "decode floor")],
            unit="s",
            width=12,
            thresholds=limit(t("itl_p95_seconds")),
        ),
        PanelSpec(
            P.E2E,
            "End-to-end request latency on the server (arrival to last token). Grows with output "
            "length, so read it with Request lengths; client-side latency adds network and SSE.",
            quantiles(DURATION_SECONDS, window, "E2E"),
            unit="s",
            width=12,
        ),
        PanelSpec(
            P.TTFT_SPLIT,
            "Mean TTFT split into time waiting to be scheduled (queue) and time from first "
            "scheduled to first token (prefill). Queue dominating: capacity or scheduling, scale "
            "out. Prefill dominating: prompts are long or not cached.",
            [
                Query(mean("inferwatch_request_queue_time_seconds", window), "queue"),
                Query(mean("inferwatch_request_prefill_time_seconds", window), "prefill"),
                Query(mean(TTFT_SECONDS, window), "TTFT (mean)"),
            ],
            unit="s",
            width=12,
        ),
        *_distributions(),
        PanelSpec(
            P.TPOT,
            "Time per output token of each finished request (its decode time over its output "
            "tokens after the first), p50/p95/p99, as the server measures it: the unit many "
            "SLOs are written in. Unlike inter-token latency (one sample per step) every "
            "request counts once. High with a normal TTFT: the decode phase.",
            quantiles(TPOT_SECONDS, RATE_INTERVAL, "TPOT"),
            unit="s",
            width=12,
        ),
        PanelSpec(
            P.SPEC_DECODE,
            "Speculative decoding: the share of draft tokens the target model accepted. "
            "Each rejected draft token is wasted compute, so a low acceptance makes decode "
            "slower than without speculation (a decode-phase cause): try fewer speculative "
            "tokens or a draft model closer to the target.",
            [
                Query(
                    f"sum by (instance) (rate(inferwatch_spec_decode_accepted_tokens_total{{{TARGET}}}[$__rate_interval]))\n"
                    f"  / (sum by (instance) (rate(inferwatch_spec_decode_draft_tokens_total{{{TARGET}}}[$__rate_interval])) > 0)",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            width=12,
            no_value=NO_SPEC_DECODE,
        ),
    ]


def _distributions() -> list[PanelSpec]:
    """Latency row, the heatmaps: every bucket of the three latency histograms over time."""
    return [
        PanelSpec(
            P.TTFT_HEATMAP,
            "How many requests' first token came within each bucket, per interval. A second "
            "band above the main one is a class of requests (long prompts, a cold prefix "
            "cache, queueing) that the quantiles blur into one line.",
            distribution(TTFT_SECONDS),
            unit="s",
            kind="heatmap",
        ),
        PanelSpec(
            P.ITL_HEATMAP,
            "Gaps between successive output tokens per bucket and interval. A tight band is "
            "steady decode; a faint band far above it is decode steps stalled behind prefill "
            "chunks (InferencePrefillStallsDecode) or preemptions.",
            distribution(ITL_SECONDS),
            unit="s",
            kind="heatmap",
        ),
        PanelSpec(
            P.E2E_HEATMAP,
            "End-to-end request latency per bucket and interval. Bands follow output lengths; "
            "a band that moves up without longer outputs is slower serving.",
            distribution(DURATION_SECONDS),
            unit="s",
            kind="heatmap",
        ),
    ]


def _scheduler_row(spec: Spec) -> list[PanelSpec]:
    """Scheduler: is continuous batching working?"""
    w, t = spec.w, spec.t
    window = spec.timing.window
    return [
        PanelSpec(
            P.RUNNING_WAITING,
            "Requests in the running batch and waiting in the queue. Healthy: waiting near 0. "
            "Waiting grows while running sits at its maximum: capacity. Waiting while running is "
            "low: admission is blocked (KV cache, scheduler, CPU).",
            [
                Query(
                    f"sum by (instance) (inferwatch_requests_running{{{TARGET}}})",
                    "running {{instance}}",
                ),
                Query(
                    f"sum by (instance) (inferwatch_requests_waiting{{{TARGET}}})",
                    "waiting {{instance}}",
                ),
            ],
        ),
        PanelSpec(
            P.STEP_TOKENS,
            "Mean tokens per scheduler step (the batch-size proxy: decode tokens plus prefill "
            "chunk) and steps per second. Small steps with a busy queue: the batch is not "
            "filling. Very large steps during inter-token latency spikes: prefill chunks too big.",
            [
                Query(mean("inferwatch_engine_step_tokens", window), "tokens per step"),
                Query(
                    f"sum(rate(inferwatch_engine_steps_total{{{TARGET}}}[{window}]))",
                    "steps/s",
                    unit="suffix: steps/s",
                ),
            ],
            unit=TOKENS,
        ),
        PanelSpec(
            P.PREEMPTIONS,
            "Requests preempted per second (evicted from the KV cache, recomputed later). "
            "Healthy: 0. A steady rate means the KV cache is too small for the batch and "
            "context lengths.",
            [
                Query(
                    f"sum by (instance) (instance:inferwatch_preemptions:{w}{{{TARGET}}})",
                    "{{instance}}",
                )
            ],
            unit="reqps",
        ),
        PanelSpec(
            P.KV_CACHE_BY_ENGINE,
            f"KV-cache use per engine. Healthy: below {t('kv_usage_high') * 100:g} %. Pinned at "
            "100 % with preemptions: the memory layer limits the batch.",
            [
                Query(
                    f"inferwatch_kv_cache_usage_ratio{{{TARGET}}}", "{{instance}} engine {{engine}}"
                )
            ],
            unit="percentunit",
            thresholds=limit(t("kv_usage_high")),
        ),
        PanelSpec(
            P.KV_CAPACITY,
            "How many tokens each engine's KV cache holds when full (blocks x block size, "
            "from the server's cache config), and how many are free now. The capacity bounds "
            "batch x context: when running requests' contexts need more than it, the "
            "scheduler queues or preempts. Plan replicas and --max-num-seqs with it.",
            [
                Query(
                    f"inferwatch_kv_cache_capacity_tokens{{{TARGET}}}",
                    "capacity {{instance}} engine {{engine}}",
                ),
                Query(
                    f"inferwatch_kv_cache_capacity_tokens{{{TARGET}}}\n"
                    f"  * (1 - inferwatch_kv_cache_usage_ratio{{{TARGET}}})",
                    "free {{instance}} engine {{engine}}",
                ),
            ],
            unit=TOKENS,
        ),
        PanelSpec(
            P.QUEUED_WHILE_IDLE_TIME,
            "Share of time requests waited while the GPU/engine idled, per instance. Healthy: 0. "
            "Sustained above "
            f"{t('queued_while_idle_ratio') * 100:g} % fires InferenceQueuedWhileIdle: the "
            "scheduler or the CPU starves the accelerator.",
            [
                Query(
                    f"instance:inferwatch_queued_while_idle_seconds:{w}{{{TARGET}}}",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            thresholds=limit(t("queued_while_idle_ratio")),
        ),
    ]


def _system_row(spec: Spec) -> list[PanelSpec]:
    """System: frontend CPU, the client's path (the canary), workload."""
    w, t, window = spec.w, spec.t, spec.timing.window
    return [
        PanelSpec(
            P.FRONTEND_CPU,
            "CPU cores used by the server's API/tokenizer process. Healthy: well under 1 core. "
            "At ~1 core while the GPU waits, the frontend (tokenization, detokenization, HTTP) is "
            "the bottleneck: more API-server processes, a fast tokenizer.",
            [Query(f"instance:inferwatch_frontend_cpu_seconds:{w}{{{TARGET}}}", "{{instance}}")],
            unit="suffix: cores",
            thresholds=limit(t("frontend_cpu_cores")),
        ),
        PanelSpec(
            P.CLIENT_GAP,
            "Canary-only (serve --canary on). How much later the canary's first token arrives "
            "than the server's own TTFT says, over the rate window: what the network, ingress, "
            "HTTP handling, tokenization and SSE framing add. Healthy: a few ms in one data "
            "centre. The engine is not what is slow when only this one grows.",
            [Query(f"inferwatch_canary_ttft_gap_seconds{{{TARGET}}}", "{{instance}}")],
            unit="s",
            thresholds=limit(t("client_gap_seconds")),
        ),
        PanelSpec(
            P.CANARY_PROBES,
            "Canary-only. The canary's probes per second by result: ok, or why they failed "
            "(timeout, http_error, connect_error, bad_stream). Failures while the server reports "
            "up mean users on the same path fail too.",
            [
                Query(
                    f"sum by (result) (rate(inferwatch_canary_probes_total{{{TARGET}}}[$__rate_interval]))",
                    "{{result}}",
                )
            ],
            unit="reqps",
            stacked=True,
        ),
        PanelSpec(
            P.REQUEST_LENGTHS,
            "Prompt and output length of finished requests, p50/p95/p99 in tokens. Prefill "
            "cost grows about quadratically with prompt length and a long tail of prompts "
            "makes a TTFT tail; compare with the baseline's lengths before blaming the server.",
            [
                *quantiles("inferwatch_request_prompt_tokens", RATE_INTERVAL, "prompt"),
                *quantiles("inferwatch_request_generation_tokens", RATE_INTERVAL, "output"),
            ],
            unit=TOKENS,
        ),
        PanelSpec(
            P.TOKEN_THROUGHPUT,
            "Prompt (prefill) and generated (decode) tokens per second across the selected "
            "instances.",
            [
                Query(f"sum(instance:inferwatch_prompt_tokens:{w}{{{TARGET}}})", "prompt tokens/s"),
                Query(
                    f"sum(instance:inferwatch_generation_tokens:{w}{{{TARGET}}})",
                    "generated tokens/s",
                ),
            ],
            unit=TOKENS_PER_SECOND,
        ),
        PanelSpec(
            P.HTTP_STATUS,
            "Responses of the server's inference API per second by HTTP status class (its "
            "own /metrics and health endpoints left out). 5xx: the server failed the request; "
            "4xx: clients sent what it refused (too long a prompt, a wrong model name), often "
            "a deployment or client change rather than a server problem.",
            [
                Query(
                    f"sum by (status) (rate(inferwatch_http_requests_total{{{TARGET}}}[$__rate_interval]))",
                    "{{status}}",
                )
            ],
            unit="reqps",
            stacked=True,
        ),
        PanelSpec(
            P.FINISHED_BY_REASON,
            "Finished requests per second by reason. stop/length are normal endings; error and "
            "abort (clients disconnecting, often after timeouts) should stay a small share.",
            [
                Query(
                    f"sum by (reason) (rate(inferwatch_requests_finished_total{{{TARGET}}}[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            unit="reqps",
            stacked=True,
        ),
        PanelSpec(
            P.PREFIX_CACHE,
            "Share of prompt tokens found in the prefix cache. Low with long shared system "
            "prompts means caching is off or defeated (a variable part at the start of the "
            "prompt); each hit is prefill compute saved.",
            [
                Query(
                    "sum without (engine) (rate(inferwatch_prefix_cache_hits_total"
                    f"{{{TARGET}}}[{window}]))\n  / (sum without (engine) "
                    f"(rate(inferwatch_prefix_cache_queries_total{{{TARGET}}}[{window}])) > 0)",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
        ),
    ]


def _baseline_row(spec: Spec) -> list[PanelSpec]:
    """Baseline: what regressed?"""
    window, t = spec.timing.window, spec.t
    return [
        PanelSpec(
            P.TTFT_VS_BASELINE,
            "Live TTFT p95 against the baseline's p95 at the nearest measured concurrency (from "
            "`inferwatch baseline`). Above the baseline line by more than "
            f"{t('regression_factor'):g}x: TTFT regressed (InferenceLatencyRegression).",
            [
                Query(quantile(0.95, TTFT_SECONDS, window), "live p95"),
                Query(
                    f'max(inferwatch_baseline_time_to_first_token_seconds{{{TARGET}, percentile="95"}})',
                    "baseline p95",
                ),
            ],
            unit="s",
            width=12,
            no_value=NO_BASELINE,
        ),
        PanelSpec(
            P.ITL_VS_BASELINE,
            "Live inter-token latency p95 against the baseline's at the nearest concurrency. Above "
            f"it by more than {t('regression_factor'):g}x: decode regressed.",
            [
                Query(quantile(0.95, ITL_SECONDS, window), "live p95"),
                Query(
                    f'max(inferwatch_baseline_inter_token_latency_seconds{{{TARGET}, percentile="95"}})',
                    "baseline p95",
                ),
            ],
            unit="s",
            width=12,
            no_value=NO_BASELINE,
        ),
    ]
