"""Grafana dashboards (grafanalib), built from the heuristics spec and the recording rules.

Two dashboards:

- **Inference triage**: the top row answers "prefill or decode, and which layer?" at a
  glance; the service level objectives below it say what users feel (error budget, burn
  rates, SLI); the rows below follow the method (latency by phase, scheduler, GPU, system,
  baseline).
- **Fleet**: per-model and per-instance drill-down across replicas.

Every query reads the contract's series or a recording rule of ``heuristics.py``;
quantiles come from ``sum by (le)`` of per-instance bucket rates, means from rates of
``_sum`` over rates of ``_count``. Panels that need NVML say so in their description and
show "GPU-only: no NVML data" when empty; panels a backend cannot fill show "not provided
by this backend".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from inferwatch.method.heuristics import THROTTLE_REASONS, Spec
from inferwatch.method.panels import Panel as P
from inferwatch.method.slo import BURNS

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Series labels chosen by the variables.
TARGET = 'backend=~"$backend", model=~"$model", instance=~"$instance"'
MODEL = 'backend=~"$backend", model=~"$model"'
NODE = 'instance=~"$instance"'  # GPU series carry no backend/model labels

NOT_PROVIDED = "not provided by this backend"
GPU_ONLY = "GPU-only: no NVML data"
NO_BASELINE = "no baseline: start inferwatch with --baseline"
NO_SLO = "no SLO data: no objectives configured, or no traffic yet"

# The panels that need NVML (empty on machines without a GPU) and a baseline file.
GPU_ONLY_PANELS = {
    P.GPU_BUSY,
    P.GPU_BUSY_BY_GPU,
    P.GPU_ACTIVITY,
    P.GPU_MEMORY,
    P.GPU_CLOCKS,
    P.GPU_POWER,
    P.MEMORY_BANDWIDTH,
    "GPU busy by instance",
}


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass
class PanelSpec:
    """One panel: what it shows and how healthy and unhealthy look in the method's terms."""

    title: str
    description: str
    queries: list[Query]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries, stat, table
    width: int = 8
    height: int = 8
    no_value: str = NOT_PROVIDED
    thresholds: list[tuple[float | None, str]] = field(default_factory=list)  # (from, color)
    stacked: bool = False


def _quantiles(bucket_rule: str, label: str, selector: str = TARGET) -> list[Query]:
    return [
        Query(
            f"histogram_quantile({q}, sum by (le) ({bucket_rule}{{{selector}}}))",
            f"{label} p{round(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


def _mean(metric: str, w: str, selector: str = TARGET) -> str:
    """Mean of a histogram across the selected instances: rate of sum over rate of count."""
    return (
        f"sum(instance:{metric}_sum:{w}{{{selector}}})\n"
        f"  / (sum(instance:{metric}_count:{w}{{{selector}}}) > 0)"
    )


def _limit(value: float) -> list[tuple[float | None, str]]:
    return [(None, "green"), (value, "red")]


def _slo_series(spec: Spec, suffix: str) -> str:
    """Every objective's recorded series ``<level>:inferwatch_slo_<kind><suffix>`` at once.

    A name regex, so that the panels show whichever objectives the config has.
    """
    level = spec.slos.scope
    selector = MODEL if level == "model" else TARGET
    return f'{{__name__=~"{level}:inferwatch_slo_[a-z0-9]+{suffix}", {selector}}}'


def slo_panels(spec: Spec) -> list[PanelSpec]:
    """Error budget, burn rates and SLI of every objective (``slos:`` in the config)."""
    slos = spec.slos
    who = "{{model}}" if slos.scope == "model" else "{{model}} {{instance}}"
    kinds = ", ".join(dict.fromkeys(o.kind for g in slos.groups for o in g.objectives))
    # The burn-rate alerts' long windows (each with its threshold) and the shortest one.
    windows = ["5m", *dict.fromkeys(b.long for b in BURNS)]
    factors = sorted({(float(f"{b.factor(slos.window):.4g}"), b.severity) for b in BURNS})
    said = ", ".join(f"{b.factor(slos.window):.3g}x over {b.long}" for b in BURNS)
    per = "model" if slos.scope == "model" else "instance"
    return [
        PanelSpec(
            P.SLO_BUDGET,
            f"Share of each objective's {slos.window} error budget still left, per objective "
            f"({kinds or 'none configured'}) and {per}. 100 %: no bad events yet; 0 %: the "
            "budget is spent; below 0 the objective is missed.",
            [Query(_slo_series(spec, ":error_budget_remaining"), f"{{{{slo}}}} {who}")],
            unit="percentunit",
            kind="stat",
            width=6,
            no_value=NO_SLO,
            thresholds=[(None, "red"), (0, "yellow"), (0.25, "green")],
        ),
        PanelSpec(
            P.SLO_BURN,
            "How fast each objective spends its budget: bad-event share over the window "
            "divided by the budget (1x spends it exactly over "
            f"{slos.window}). The dashed lines are the burn-rate alerts' thresholds ({said}); "
            "an alert also needs its short window (a twelfth of the long one) above the line.",
            [
                Query(_slo_series(spec, f":burnrate{window}"), f"{{{{slo}}}} {window} {who}")
                for window in windows
            ],
            width=10,
            no_value=NO_SLO,
            thresholds=[(None, "green")]
            + [(f, "red" if sev == "critical" else "orange") for f, sev in factors],
        ),
        PanelSpec(
            P.SLO_SLI,
            "The SLI: share of good events over the last 5 minutes (requests or tokens within "
            "the latency bound, requests finished without a server error), next to the "
            "objective's target. Below the target line, the budget burns.",
            [
                Query(
                    f"1 - {_slo_series(spec, '_bad_events:rate5m')}\n"
                    f"  / ({_slo_series(spec, '_events:rate5m')} > 0)",
                    f"{{{{slo}}}} SLI {who}",
                ),
                Query(_slo_series(spec, ":objective"), f"{{{{slo}}}} objective {who}"),
            ],
            unit="percentunit",
            width=8,
            no_value=NO_SLO,
        ),
    ]


def triage_panels(spec: Spec) -> list[tuple[str | None, list[PanelSpec]]]:
    """(row title, panels) in order; the first row has no header."""
    w = spec.w
    t = spec.t
    ttft_b = f"instance:inferwatch_time_to_first_token_seconds_bucket:{w}"
    itl_b = f"instance:inferwatch_inter_token_latency_seconds_bucket:{w}"
    e2e_b = f"instance:inferwatch_request_duration_seconds_bucket:{w}"
    floor = f"max(inferwatch_decode_floor_seconds{{{TARGET}}})"
    top = [
        PanelSpec(
            P.TTFT_VS_THRESHOLD,
            "Time to first token, p95 over the selected instances. Healthy: under the threshold "
            f"({t('ttft_p95_seconds'):g} s, from the alert rules). High with a normal ITL means "
            "the phase is prefill: look at the TTFT split to tell queueing (capacity, "
            "scheduling) from prefill compute (long prompts, no prefix caching).",
            [Query(f"histogram_quantile(0.95, sum by (le) ({ttft_b}{{{TARGET}}}))", "TTFT p95")],
            unit="s",
            kind="stat",
            width=4,
            height=5,
            thresholds=_limit(t("ttft_p95_seconds")),
        ),
        PanelSpec(
            P.ITL_VS_FLOOR,
            "Inter-token latency p95 next to the decode floor (model weight bytes / aggregate peak "
            "memory bandwidth, the fastest a decode step can be). Near the floor: decode is "
            "hardware-bound, only quantization or more GPUs help. Far above it with a normal TTFT: "
            "the phase is decode and time is lost to batching, KV reads or kernels.",
            [
                Query(f"histogram_quantile(0.95, sum by (le) ({itl_b}{{{TARGET}}}))", "ITL p95"),
                Query(floor, "decode floor"),
            ],
            unit="s",
            kind="stat",
            width=4,
            height=5,
            thresholds=_limit(t("itl_p95_seconds")),
        ),
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
            width=3,
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
            width=3,
            height=5,
            thresholds=[(None, "green"), (t("kv_usage_high"), "red")],
        ),
        PanelSpec(
            P.FIRING_ALERTS,
            "inferwatch alerts firing now for the selected model (and those without a model, "
            "such as GPU alerts). Each alert names the phase and layer and links its runbook.",
            [
                Query(
                    'count(ALERTS{alertstate="firing", alertname=~"Inference.*", model=~"$model|"})'
                    " or vector(0)",
                    "firing",
                    instant=True,
                )
            ],
            kind="stat",
            width=4,
            height=5,
            thresholds=[(None, "green"), (1, "red")],
        ),
    ]
    latency = [
        PanelSpec(
            P.TTFT,
            "Time to first token quantiles (server side, includes queueing and tokenization). "
            "Healthy: p95 under the dashed threshold. TTFT high with normal inter-token latency "
            "puts the problem in the prefill phase.",
            _quantiles(ttft_b, "TTFT"),
            unit="s",
            width=12,
            thresholds=_limit(t("ttft_p95_seconds")),
        ),
        PanelSpec(
            P.ITL,
            "Latency between successive output tokens of a request (one sample per decode step), "
            "with the decode floor. Healthy: p95 flat, under the threshold and within a small "
            "factor of the floor. A p99 far above p50 while prompts are prefilled: prefill "
            "stalls decode (chunk size).",
            [*_quantiles(itl_b, "ITL"), Query(floor, "decode floor")],
            unit="s",
            width=12,
            thresholds=_limit(t("itl_p95_seconds")),
        ),
        PanelSpec(
            P.E2E,
            "End-to-end request latency on the server (arrival to last token). Grows with output "
            "length, so read it with Request lengths; client-side latency adds network and SSE.",
            _quantiles(e2e_b, "E2E"),
            unit="s",
            width=12,
        ),
        PanelSpec(
            P.TTFT_SPLIT,
            "Mean TTFT split into time waiting to be scheduled (queue) and time from first "
            "scheduled to first token (prefill). Queue dominating: capacity or scheduling, scale "
            "out. Prefill dominating: prompts are long or not cached.",
            [
                Query(_mean("inferwatch_request_queue_time_seconds", w), "queue"),
                Query(_mean("inferwatch_request_prefill_time_seconds", w), "prefill"),
                Query(_mean("inferwatch_time_to_first_token_seconds", w), "TTFT (mean)"),
            ],
            unit="s",
            width=12,
        ),
    ]
    scheduler = [
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
                Query(_mean("inferwatch_engine_step_tokens", w), "tokens per step"),
                Query(f"sum(instance:inferwatch_engine_steps:{w}{{{TARGET}}})", "steps/s"),
            ],
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
            thresholds=_limit(t("kv_usage_high")),
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
            thresholds=_limit(t("queued_while_idle_ratio")),
        ),
    ]
    gpu = [
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
    system = [
        PanelSpec(
            P.FRONTEND_CPU,
            "CPU cores used by the server's API/tokenizer process. Healthy: well under 1 core. "
            "At ~1 core while the GPU waits, the frontend (tokenization, detokenization, HTTP) is "
            "the bottleneck: more API-server processes, a fast tokenizer.",
            [Query(f"instance:inferwatch_frontend_cpu_seconds:{w}{{{TARGET}}}", "{{instance}}")],
            thresholds=_limit(t("frontend_cpu_cores")),
        ),
        PanelSpec(
            P.REQUEST_LENGTHS,
            "Mean prompt and output length of finished requests. Prefill cost grows about "
            "quadratically with prompt length; compare with the baseline's lengths before "
            "blaming the server.",
            [
                Query(_mean("inferwatch_request_prompt_tokens", w), "prompt tokens"),
                Query(_mean("inferwatch_request_generation_tokens", w), "output tokens"),
            ],
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
            [Query(f"instance:inferwatch_prefix_cache_hits:ratio_{w}{{{TARGET}}}", "{{instance}}")],
            unit="percentunit",
        ),
    ]
    baseline = [
        PanelSpec(
            P.TTFT_VS_BASELINE,
            "Live TTFT p95 against the baseline's p95 at the nearest measured concurrency (from "
            "`inferwatch baseline`). Above the baseline line by more than "
            f"{t('regression_factor'):g}x: TTFT regressed (InferenceLatencyRegression).",
            [
                Query(f"histogram_quantile(0.95, sum by (le) ({ttft_b}{{{TARGET}}}))", "live p95"),
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
                Query(f"histogram_quantile(0.95, sum by (le) ({itl_b}{{{TARGET}}}))", "live p95"),
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
    return [
        (None, top),
        ("Service level objectives: what do users feel?", slo_panels(spec)),
        ("Latency by phase: prefill or decode?", latency),
        ("Scheduler: is continuous batching working?", scheduler),
        ("GPU: compute and memory", gpu),
        ("System: frontend CPU and workload", system),
        ("Baseline: what regressed?", baseline),
    ]


def fleet_panels(spec: Spec) -> list[tuple[str | None, list[PanelSpec]]]:
    w = spec.w
    q95 = 'quantile="0.95"'
    # A model across its replicas: the labels the model: rules keep (namespace, backend,
    # model and the config's fleet_labels).
    by = f"by ({', '.join(spec.fleet_labels)})"
    per_model = [
        PanelSpec(
            "Models",
            "One row per model across its replicas: traffic, TTFT and ITL p95, the share of "
            "requests ending in a server error and the share clients aborted. Sort by a column "
            "to find the model in trouble.",
            [
                Query(
                    f"sum {by} (model:inferwatch_requests_finished:{w}{{{MODEL}}})",
                    "req/s",
                    True,
                    True,
                ),
                Query(
                    f"max {by} (model:inferwatch_time_to_first_token_seconds:quantile_{w}{{{MODEL}, {q95}}})",
                    "TTFT p95",
                    True,
                    True,
                ),
                Query(
                    f"max {by} (model:inferwatch_inter_token_latency_seconds:quantile_{w}{{{MODEL}, {q95}}})",
                    "ITL p95",
                    True,
                    True,
                ),
                Query(
                    f"max {by} (model:inferwatch_requests_finished:error_ratio_{w}{{{MODEL}}})",
                    "server error share",
                    True,
                    True,
                ),
                Query(
                    f"max {by} (model:inferwatch_requests_finished:abort_ratio_{w}{{{MODEL}}})",
                    "abort share",
                    True,
                    True,
                ),
                Query(
                    f"count {by} (inferwatch_backend_info{{{MODEL}}})",
                    "instances",
                    True,
                    True,
                ),
            ],
            kind="table",
            width=24,
            height=7,
        ),
        PanelSpec(
            "TTFT p95 by model",
            "Time to first token p95 per model across replicas. Compare with its threshold "
            f"({spec.t('ttft_p95_seconds'):g} s).",
            [
                Query(
                    f"model:inferwatch_time_to_first_token_seconds:quantile_{w}{{{MODEL}, {q95}}}",
                    "{{model}}",
                )
            ],
            unit="s",
            width=8,
            thresholds=_limit(spec.t("ttft_p95_seconds")),
        ),
        PanelSpec(
            "ITL p95 by model",
            "Inter-token latency p95 per model across replicas. Compare with its threshold "
            f"({spec.t('itl_p95_seconds'):g} s).",
            [
                Query(
                    f"model:inferwatch_inter_token_latency_seconds:quantile_{w}{{{MODEL}, {q95}}}",
                    "{{model}}",
                )
            ],
            unit="s",
            width=8,
            thresholds=_limit(spec.t("itl_p95_seconds")),
        ),
        PanelSpec(
            "Server errors and aborts by model",
            "Share of finished requests that ended in a server error (the server's fault, "
            f"InferenceRequestErrors above {spec.t('error_ratio') * 100:g} %) and share that "
            "clients aborted (cancelled or timed out, often because the server was slow).",
            [
                Query(
                    f"model:inferwatch_requests_finished:error_ratio_{w}{{{MODEL}}}",
                    "errors {{model}}",
                ),
                Query(
                    f"model:inferwatch_requests_finished:abort_ratio_{w}{{{MODEL}}}",
                    "aborts {{model}}",
                ),
            ],
            unit="percentunit",
            width=8,
            thresholds=_limit(spec.t("error_ratio")),
        ),
    ]
    per_instance = [
        PanelSpec(
            "Backend up by instance",
            "1 when the sidecar can read its server's /metrics. A 0 is InferenceBackendDown.",
            [Query(f'inferwatch_backend_up{{backend=~"$backend", {NODE}}}', "{{instance}}")],
            width=8,
        ),
        PanelSpec(
            "TTFT p95 by instance",
            "One replica far above the others points at a local cause (hardware, a bad node, "
            "its own configuration); all of them high points at load or the workload.",
            [
                Query(
                    f"instance:inferwatch_time_to_first_token_seconds:quantile_{w}{{{TARGET}, {q95}}}",
                    "{{instance}}",
                )
            ],
            unit="s",
            width=8,
        ),
        PanelSpec(
            "ITL p95 by instance",
            "Per-replica inter-token latency p95: a slow replica on an otherwise healthy fleet "
            "has a local decode problem (GPU, throttling, batch).",
            [
                Query(
                    f"instance:inferwatch_inter_token_latency_seconds:quantile_{w}{{{TARGET}, {q95}}}",
                    "{{instance}}",
                )
            ],
            unit="s",
            width=8,
        ),
        PanelSpec(
            "Queue depth by instance",
            "Waiting requests per replica. Uneven queues across replicas mean the load "
            "balancer is not spreading work.",
            [Query(f"sum by (instance) (inferwatch_requests_waiting{{{TARGET}}})", "{{instance}}")],
            width=8,
        ),
        PanelSpec(
            "KV cache by instance",
            "Highest KV-cache use per replica. One replica pinned at 100 % while the others have "
            "room: its requests are longer, or the balancer sends it more.",
            [
                Query(
                    f"max by (instance) (inferwatch_kv_cache_usage_ratio{{{TARGET}}})",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            width=8,
        ),
        PanelSpec(
            "GPU busy by instance",
            "GPU-only. Mean GPU busy share per replica; an idle replica with a queue is "
            "queued-while-idle.",
            [Query(f"instance:inferwatch_gpu_busy_seconds:avg_{w}{{{NODE}}}", "{{instance}}")],
            unit="percentunit",
            width=8,
            no_value=GPU_ONLY,
        ),
    ]
    return [(None, per_model), ("Instances", per_instance)]


def _variables() -> g.Templating:
    def query(name: str, label: str, q: str) -> g.Template:
        return g.Template(
            name=name,
            label=label,
            query={"query": q, "refId": name},
            dataSource=DATASOURCE,
            includeAll=True,
            multi=True,
            allValue=".*",
            default="$__all",
            refresh=2,  # on time-range change: new replicas appear
        )

    return g.Templating(
        list=[
            g.Template(
                name="datasource",
                label="Data source",
                query="prometheus",
                type="datasource",
                default="Prometheus",
            ),
            query("backend", "Backend", "label_values(inferwatch_backend_info, backend)"),
            query(
                "model",
                "Model",
                'label_values(inferwatch_backend_info{backend=~"$backend"}, model)',
            ),
            query(
                "instance",
                "Instance",
                'label_values(inferwatch_backend_up{backend=~"$backend"}, instance)',
            ),
        ]
    )


def _annotations() -> g.Annotations:
    """Firing alerts drawn on every time series panel."""
    return g.Annotations(
        list=[
            {
                "name": "Firing alerts",
                "datasource": DATASOURCE,
                "enable": True,
                "iconColor": "red",
                "expr": 'ALERTS{alertstate="firing", alertname=~"Inference.*", model=~"$model|"}',
                "titleFormat": "{{alertname}}",
                "textFormat": "{{instance}} {{model}} ({{severity}})",
                "tagKeys": "severity,phase,layer",
                "useValueForTime": False,
                "step": "60s",
            }
        ]
    )


def _panel(spec: PanelSpec, pid: int, pos: dict) -> g.Panel:
    targets = [
        g.Target(
            expr=q.expr,
            legendFormat=q.legend,
            refId=chr(ord("A") + i),
            instant=q.instant or q.table,
            format="table" if q.table else "time_series",
            datasource=DATASOURCE,
        )
        for i, q in enumerate(spec.queries)
    ]
    steps = [{"color": color, "value": value} for value, color in spec.thresholds] or [
        {"color": "green", "value": None}
    ]
    common = {
        "title": spec.title,
        "description": spec.description,
        "dataSource": DATASOURCE,
        "targets": targets,
        "id": pid,
        "gridPos": g.GridPos(**pos),
        "thresholds": steps,
    }
    no_value = {"fieldConfig": {"defaults": {"noValue": spec.no_value}}}
    if spec.kind == "stat":
        return g.Stat(
            **common,
            format=spec.unit,
            noValue=spec.no_value,
            reduceCalc="lastNotNull",
            graphMode="area",
        )
    if spec.kind == "table":
        merge = {"transformations": [{"id": "merge", "options": {}}]}
        return g.Table(**common, unit=spec.unit, extraJson={**no_value, **merge})
    return g.TimeSeries(
        **common,
        unit=spec.unit,
        extraJson=no_value,
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "max"],
        thresholdsStyleMode="dashed" if spec.thresholds else "off",
        stacking={"mode": "normal", "group": "A"} if spec.stacked else {},
        fillOpacity=20 if spec.stacked else 0,
        tooltipMode="multi",
    )


def _layout(rows: list[tuple[str | None, list[PanelSpec]]]) -> list[g.Panel]:
    """Left-to-right, top-to-bottom placement on Grafana's 24-column grid."""
    out: list[g.Panel] = []
    pid, y = 1, 0
    for title, panels in rows:
        if title is not None:
            out.append(g.RowPanel(title=title, id=pid, gridPos=g.GridPos(h=1, w=24, x=0, y=y)))
            pid, y = pid + 1, y + 1
        x, row_height = 0, 0
        for spec in panels:
            if x + spec.width > 24:
                x, y = 0, y + row_height
                row_height = 0
            out.append(_panel(spec, pid, {"h": spec.height, "w": spec.width, "x": x, "y": y}))
            pid, x, row_height = pid + 1, x + spec.width, max(row_height, spec.height)
        y += row_height
    return out


def _dashboard(uid: str, title: str, description: str, rows) -> dict[str, Any]:
    board = g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["inferwatch", "llm-inference"],
        panels=_layout(rows),
        templating=_variables(),
        annotations=_annotations(),
        timezone="browser",
        refresh="30s",
        time=g.Time("now-1h", "now"),
        graphTooltip=1,  # shared crosshair
        schemaVersion=39,
    )
    # A dict through grafanalib's own encoder, so the JSON is what Grafana imports.
    return json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))


def dashboards(spec: Spec) -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON model."""
    return {
        "inferwatch-triage.json": _dashboard(
            "inferwatch-triage",
            "Inference triage",
            "Is it prefill or decode, and which layer: compute, memory, scheduling or system? "
            "Generated by inferwatch from its heuristics spec.",
            triage_panels(spec),
        ),
        "inferwatch-fleet.json": _dashboard(
            "inferwatch-fleet",
            "Inference fleet",
            "Per-model and per-instance drill-down across replicas. Generated by inferwatch.",
            fleet_panels(spec),
        ),
    }
