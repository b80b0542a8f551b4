"""Writes the promtool unit tests in this folder from readable workload scenarios.

Each scenario describes what a few replicas of a model serve (request rate, where TTFT,
queue time and inter-token latency fall in vLLM's own histogram buckets, KV use, GPU busy
time...). They are turned into realistic input series: cumulative histogram buckets and
counters growing at the stated rates, gauges that move. The expected alerts, with their
labels and annotations, are written by hand next to each scenario: the numbers in them
follow from the stated distributions (histogram_quantile interpolates linearly inside a
bucket: all observations in (2.5, 5] give p95 = 2.5 + 0.95 * 2.5 = 4.875 s).

    .venv/bin/python alerts/tests/scenarios.py    # (make generate runs it)
    promtool test rules alerts/tests/*.yaml
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from inferwatch.method.quantile import histogram_quantile
from inferwatch.metrics import WINDOW_QUANTILES

HERE = Path(__file__).parent
STEP = 30  # seconds between samples, the test's scrape interval
SAMPLES = 40  # 20 minutes of data
EVAL = "15m"  # every alert's `for` has elapsed by then

# vLLM 0.32's default bucket bounds.
TTFT_LE = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_LE = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_LE = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKENS_LE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
STEP_TOKENS_LE = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

CANARY_RESULTS = ("ok", "http_error", "timeout", "connect_error", "bad_stream")
CANARY_OK = {"ok": 1 / 15}  # a probe every 15 s, all answered
MODEL = "llama-3-8b"
RUNBOOKS = "https://github.com/inferwatch/inferwatch/blob/main/alerts/runbooks/"
A, B, C = "10.0.0.1:10177", "10.0.0.2:10177", "10.0.0.3:10177"


@dataclass(frozen=True)
class Dist:
    """Observations: ``{bucket upper bound: share}`` and their mean."""

    shares: dict[float, float]
    mean: float


@dataclass(frozen=True)
class Replica:
    """What one instance serves; the defaults are a healthy replica."""

    instance: str
    requests_per_s: float = 2.0
    error_share: float = 0.0
    ttft: Dist = Dist({0.5: 1.0}, 0.4)  # p95 487.5 ms
    queue: Dist = Dist({0.3: 1.0}, 0.02)
    itl: Dist = Dist({0.05: 1.0}, 0.035)  # p95 48.75 ms
    prompt_tokens: Dist = Dist({1000: 1.0}, 800)
    step_tokens: Dist = Dist({64: 1.0}, 48)
    steps_per_s: float = 40.0
    generation_tokens_per_request: float = 200
    prefix_hit_share: float = 0.25
    running: tuple[float, ...] = (8, 10, 12, 11, 9)
    waiting: tuple[float, ...] = (0, 1, 0, 2, 0)
    kv_usage: tuple[float, ...] = (0.42, 0.55, 0.61, 0.48)
    preemptions_per_s: float = 0.0
    queued_while_idle_share: float = 0.0
    frontend_cpu_cores: float = 0.3
    decode_floor: float | None = 0.0048  # 16 GB of weights / 3.35 TB/s
    gpu_busy: tuple[float, ...] | None = (0.85, 0.85)  # one share per GPU; None: no NVML
    gpu_collector: str = "1x40"
    throttled: dict[str, str] = field(default_factory=dict)  # {reason: values} on GPU 0
    # GPU 0's busier direction as a share of its link's peak (the other direction and GPU 1
    # carry a tenth of the peak); None: no such link.
    nvlink_share: float | None = 0.3
    pcie_share: float = 0.05
    backend_up: str = "1x40"
    scrape_duration: str = "0.004x40"
    gpu_memory_total: str = "85899345920x40"  # '_' where the GPU's series are gone
    baseline: tuple[float, float] | None = None  # TTFT p95, ITL p95 at concurrency 8
    canary_gap: str | None = None  # the canary's TTFT gap (None: canary off)
    canary_probes: dict[str, float] | None = None  # probes/s by result (None: canary off)


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _counter(per_second: float) -> str:
    return f"0+{per_second * STEP:g}x{SAMPLES}"


def _gauge(values: tuple[float, ...]) -> str:
    return " ".join(f"{values[i % len(values)]:g}" for i in range(SAMPLES + 1))


def _histogram(metric: str, target: dict, bounds: tuple, rate: float, dist: Dist) -> list[dict]:
    series = []
    for le in (*bounds, "+Inf"):
        share = 1.0 if le == "+Inf" else sum(s for ub, s in dist.shares.items() if ub <= le)
        series.append(
            {
                "series": f"{metric}_bucket" + _labels(**target, le=str(le)),
                "values": _counter(rate * share),
            }
        )
    series.append(
        {"series": f"{metric}_sum" + _labels(**target), "values": _counter(rate * dist.mean)}
    )
    series.append({"series": f"{metric}_count" + _labels(**target), "values": _counter(rate)})
    return series


def _window(metric: str, labels: dict, bounds: tuple, dist: Dist) -> list[dict]:
    """The exporter's quantiles of a histogram over the rate window (collect/window.py):
    those of the distribution, from the second sample on, as a rate has them."""
    cumulative = [(le, sum(s for ub, s in dist.shares.items() if ub <= le)) for le in bounds]
    buckets = [*cumulative, ("+Inf", 1.0)]
    return [
        {
            "series": metric + _labels(**labels, quantile=q),
            "values": f"_ {histogram_quantile(float(q), buckets):g}+0x{SAMPLES - 1}",
        }
        for q in WINDOW_QUANTILES
    ]


def input_series(r: Replica) -> list[dict]:
    """Every series inferwatch would expose for one replica."""
    target = {"instance": r.instance, "job": "inferwatch"}
    backend = {**target, "backend": "vllm", "model": MODEL}
    engine = {**backend, "engine": "0"}
    rate = r.requests_per_s
    out = [
        {"series": "up" + _labels(**target), "values": "1x40"},
        {
            "series": "inferwatch_backend_up" + _labels(**target, backend="vllm"),
            "values": r.backend_up,
        },
        {
            "series": "inferwatch_backend_scrape_duration_seconds"
            + _labels(**target, backend="vllm"),
            "values": r.scrape_duration,
        },
        {
            "series": "inferwatch_collector_success" + _labels(**target, collector="gpu"),
            "values": r.gpu_collector,
        },
        {"series": "inferwatch_requests_running" + _labels(**engine), "values": _gauge(r.running)},
        {"series": "inferwatch_requests_waiting" + _labels(**engine), "values": _gauge(r.waiting)},
        {
            "series": "inferwatch_kv_cache_usage_ratio" + _labels(**engine),
            "values": _gauge(r.kv_usage),
        },
        {
            "series": "inferwatch_preemptions_total" + _labels(**engine),
            "values": _counter(r.preemptions_per_s),
        },
        {
            "series": "inferwatch_engine_steps_total" + _labels(**engine),
            "values": _counter(r.steps_per_s),
        },
        {
            "series": "inferwatch_prompt_tokens_total" + _labels(**engine),
            "values": _counter(rate * r.prompt_tokens.mean),
        },
        {
            "series": "inferwatch_generation_tokens_total" + _labels(**engine),
            "values": _counter(rate * r.generation_tokens_per_request),
        },
        {
            "series": "inferwatch_prefix_cache_queries_total" + _labels(**engine),
            "values": _counter(rate * r.prompt_tokens.mean),
        },
        {
            "series": "inferwatch_prefix_cache_hits_total" + _labels(**engine),
            "values": _counter(rate * r.prompt_tokens.mean * r.prefix_hit_share),
        },
        {
            "series": "inferwatch_requests_finished_total" + _labels(**engine, reason="stop"),
            "values": _counter(rate * (1 - r.error_share)),
        },
        {
            "series": "inferwatch_requests_finished_total" + _labels(**engine, reason="error"),
            "values": _counter(rate * r.error_share),
        },
        {
            "series": "inferwatch_queued_while_idle_seconds_total" + _labels(**backend),
            "values": _counter(r.queued_while_idle_share),
        },
        {
            "series": "inferwatch_frontend_cpu_seconds_total" + _labels(**backend),
            "values": _counter(r.frontend_cpu_cores),
        },
    ]
    out += _histogram("inferwatch_time_to_first_token_seconds", engine, TTFT_LE, rate, r.ttft)
    out += _histogram("inferwatch_request_queue_time_seconds", engine, LATENCY_LE, rate, r.queue)
    tokens_per_s = rate * r.generation_tokens_per_request
    out += _histogram("inferwatch_inter_token_latency_seconds", engine, ITL_LE, tokens_per_s, r.itl)
    out += _window("inferwatch_time_to_first_token_window_seconds", backend, TTFT_LE, r.ttft)
    out += _window("inferwatch_inter_token_latency_window_seconds", backend, ITL_LE, r.itl)
    out += _histogram("inferwatch_request_prompt_tokens", engine, TOKENS_LE, rate, r.prompt_tokens)
    out += _histogram(
        "inferwatch_engine_step_tokens", engine, STEP_TOKENS_LE, r.steps_per_s, r.step_tokens
    )
    if r.decode_floor is not None:
        out.append(
            {
                "series": "inferwatch_decode_floor_seconds" + _labels(**backend),
                "values": f"{r.decode_floor:g}x40",
            }
        )
    if r.baseline is not None:
        for metric, value in zip(
            ("time_to_first_token", "inter_token_latency"), r.baseline, strict=True
        ):
            out.append(
                {
                    "series": f"inferwatch_baseline_{metric}_seconds"
                    + _labels(
                        **backend,
                        percentile="95",
                        concurrency="8",
                        prompt_tokens="800",
                        output_tokens="200",
                    ),
                    "values": f"{value:g}x40",
                }
            )
    if r.canary_gap is not None:
        out.append(
            {
                "series": "inferwatch_canary_ttft_gap_seconds" + _labels(**backend),
                "values": r.canary_gap,
            }
        )
    for result in CANARY_RESULTS if r.canary_probes is not None else ():
        out.append(
            {
                "series": "inferwatch_canary_probes_total" + _labels(**backend, result=result),
                "values": _counter(r.canary_probes.get(result, 0.0)),
            }
        )
    for gpu, busy in enumerate(r.gpu_busy or ()):
        labels = {
            **target,
            "gpu": str(gpu),
            "uuid": f"GPU-{r.instance[5]}{gpu}",
            "name": "NVIDIA H100 80GB HBM3",
        }
        out.append(
            {
                "series": "inferwatch_gpu_busy_seconds_total" + _labels(**labels),
                "values": _counter(busy),
            }
        )
        out.append(
            {
                "series": "inferwatch_gpu_memory_total_bytes" + _labels(**labels),
                "values": r.gpu_memory_total,
            }
        )
        for reason in ("sw_power_cap", "hw_thermal_slowdown"):
            values = r.throttled.get(reason, "0x40") if gpu == 0 else "0x40"
            out.append(
                {
                    "series": "inferwatch_gpu_clock_throttled" + _labels(**labels, reason=reason),
                    "values": values,
                }
            )
        out += _links(r, gpu, labels)
    return out


# An H100 SXM's links per direction: 18 NVLink links at 26.562 GB/s; PCIe 5.0 x16.
NVLINK_PEAK = 18 * 26.562e9
PCIE_PEAK = 16 * 32e9 * 128 / 130 / 8


def _links(r: Replica, gpu: int, labels: dict) -> list[dict]:
    """The GPU's NVLink counters and PCIe gauges by direction, with their peaks."""
    out = [
        {
            "series": "inferwatch_gpu_pcie_peak_bytes_per_second" + _labels(**labels),
            "values": _gauge((PCIE_PEAK,)),
        }
    ]
    for direction in ("tx", "rx"):
        share = r.pcie_share if gpu == 0 and direction == "tx" else 0.1 * r.pcie_share
        out.append(
            {
                "series": "inferwatch_gpu_pcie_bytes_per_second"
                + _labels(**labels, direction=direction),
                "values": _gauge((share * PCIE_PEAK,)),
            }
        )
    if r.nvlink_share is None:
        return out
    out.append(
        {
            "series": "inferwatch_gpu_nvlink_peak_bytes_per_second" + _labels(**labels),
            "values": _gauge((NVLINK_PEAK,)),
        }
    )
    for direction in ("tx", "rx"):
        share = r.nvlink_share if gpu == 0 and direction == "rx" else 0.1
        out.append(
            {
                "series": "inferwatch_gpu_nvlink_bytes_total"
                + _labels(**labels, direction=direction),
                "values": _counter(share * NVLINK_PEAK),
            }
        )
    return out


def _expected(alertname: str, labels: dict, description: str, summary: str) -> dict:
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{RUNBOOKS}{alertname}.md",
        },
    }


def instance_alert(
    alertname: str,
    instance: str,
    severity: str,
    phase: str,
    layer: str,
    description: str,
    summary: str,
    **extra: str,
) -> dict:
    labels = {
        "severity": severity,
        "phase": phase,
        "layer": layer,
        "instance": instance,
        "job": "inferwatch",
    }
    if "no_model" not in extra:
        labels |= {"backend": "vllm", "model": MODEL}
    extra.pop("no_model", None)
    labels |= extra
    return _expected(alertname, labels, description, summary)


def backend_down(instance: str, took: str) -> dict:
    """InferenceBackendDown for ``instance``, its last scrape attempt having taken ``took``."""
    return instance_alert(
        "InferenceBackendDown",
        instance,
        "critical",
        "any",
        "availability",
        f"inferwatch on {instance} has not been able to read the vllm server's /metrics (or the "
        f"sidecar itself is down) for 1m; its last scrape attempt took {took} (the sidecar's log "
        "names the cause). Latency alerts of this pod are inhibited meanwhile.",
        f"Inference backend on {instance} cannot be scraped",
        no_model="",
        backend="vllm",
    )


def model_alert(
    alertname: str, severity: str, phase: str, layer: str, description: str, summary: str
) -> dict:
    """An alert of the fleet rules: labelled by model, not by instance."""
    labels = {"severity": severity, "phase": phase, "layer": layer}
    return _expected(alertname, labels | {"backend": "vllm", "model": MODEL}, description, summary)


# Fleet TTFT p95 7.375 s with 4.5 s of a 6 s mean queued (two overloaded replicas, or one
# stalled one).
# ITL: 98 % in (25, 50] ms, 2 % in (0.75, 1] s -> p99 875 ms, p50 37.76 ms (23.2x), while
# 3.2k prompt tokens/s are prefilled in 2k-token steps: decode's long tail next to prefill.
PREFILL_TAIL = {
    "itl": Dist({0.05: 0.98, 1.0: 0.02}, 0.0513),
    "prompt_tokens": Dist({5000: 1.0}, 1600),
    "step_tokens": Dist({2048: 1.0}, 2048),
}

FLEET_QUEUEING = model_alert(
    "InferenceQueueingDelay",
    "warning",
    "prefill",
    "scheduling",
    f"TTFT p95 of {MODEL} across replicas is 7.375s (threshold 2s) and requests spend 75% of "
    "their mean TTFT waiting to be scheduled: the fleet lacks capacity.",
    f"{MODEL}: time to first token is dominated by queueing",
)


def kv_pressure_on_a(kv_percent: int) -> dict:
    """InferenceKVCachePressure on replica A, preempting 0.1 requests/s, KV use now
    ``kv_percent`` % (the wave of KV values at 15m, sample 30)."""
    return instance_alert(
        "InferenceKVCachePressure",
        A,
        "warning",
        "decode",
        "memory",
        f"KV-cache use now {kv_percent}% (threshold 90 % averaged over 5m) and the scheduler "
        "preempted 0.1 requests/s (threshold 0.02/s). Preempted requests lose their "
        "KV cache and are recomputed later.",
        f"KV cache under pressure on {A} ({MODEL})",
    )


def queued_while_idle_on_a(idle_percent: int, waiting: int) -> dict:
    """InferenceQueuedWhileIdle on replica A, idle ``idle_percent`` % of the window."""
    return instance_alert(
        "InferenceQueuedWhileIdle",
        A,
        "warning",
        "any",
        "scheduling",
        f"Requests for {MODEL} waited while the GPU (or, without NVML, the engine) sat idle "
        f"{idle_percent}% of the last 5m (threshold 10 %); queue depth now {waiting}. The "
        "scheduler or the CPU is not feeding the accelerator.",
        f"Requests wait while the accelerator idles on {A}",
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    replicas: tuple[Replica, ...]
    fires: dict[str, list[dict]]  # alert name -> expected alerts (labels + annotations)
    silent: tuple[str, ...] = ()  # alerts that must not fire (near misses, cross-checks)
    eval_time: str = EVAL


def test_group(s: Scenario) -> dict:
    series = [item for r in s.replicas for item in input_series(r)]
    checks = [
        {"eval_time": s.eval_time, "alertname": name, "exp_alerts": alerts}
        for name, alerts in s.fires.items()
    ]
    checks += [{"eval_time": s.eval_time, "alertname": name} for name in s.silent]
    firing = sorted(s.fires)
    return {
        "name": s.name,
        "interval": f"{STEP}s",
        "input_series": series,
        "alert_rule_test": checks,
        "promql_expr_test": [
            {
                # Nothing but the expected cause alerts fires (pending ones are not counted;
                # the SLO alerts these errors and latencies burn are judged in slos-*.yaml).
                "expr": 'count by (alertname) (ALERTS{alertstate="firing",layer!="slo"})',
                "eval_time": s.eval_time,
                "exp_samples": [
                    {"labels": f'{{alertname="{a}"}}', "value": len(s.fires[a])} for a in firing
                ],
            }
        ],
    }


def link_alert(instance: str, share: str) -> dict:
    """InferenceInterconnectSaturated on GPU 0 of ``instance`` at ``share`` of the peak."""
    return instance_alert(
        "InferenceInterconnectSaturated",
        instance,
        "warning",
        "any",
        "communication",
        f"GPU 0 (NVIDIA H100 80GB HBM3) moved {share} of its NVLink (or, without NVLink "
        "traffic that high, PCIe) peak over the last 5m (threshold 80 %): the link, not "
        "compute or memory, sets the pace: tensor-parallel all-reduce between GPUs, or host "
        "transfers.",
        f"GPU 0 on {instance}: a link runs near its peak",
        no_model="",
        gpu="0",
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{instance[5]}0",
    )


def healthy(instance: str, **changes: object) -> Replica:
    return dataclasses.replace(Replica(instance), **changes)


# ---------------------------------------------------------------------------------------
# The scenarios. Thresholds are the shipped defaults (see alerts/runbooks/*.md).

PHASE = [
    Scenario(
        "healthy fleet: nothing fires",
        (healthy(A), healthy(B)),
        fires={},
        silent=(
            "InferenceBackendDown",
            "InferenceQueuedWhileIdle",
            "InferenceQueueingDelay",
            "InferencePrefillBottleneck",
            "InferenceDecodeBottleneck",
            "InferenceDecodeAtHardwareFloor",
            "InferenceKVCachePressure",
            "InferencePrefillStallsDecode",
            "InferenceGPUUnderutilized",
            "InferenceFrontendCPUSaturated",
            "InferenceRequestErrors",
            "InferenceLatencyRegression",
            "InferenceGPUThrottling",
            "InferenceExporterGPUMissing",
            "InferenceClientGap",
            "InferenceCanaryFailing",
        ),
    ),
    Scenario(
        # TTFT in (2.5, 5] s -> p95 4.875 s; queue 0.1 s of a 3.5 s mean TTFT; ITL normal.
        "prefill-bound: long prompts on both replicas",
        tuple(
            healthy(
                i,
                ttft=Dist({5.0: 1.0}, 3.5),
                queue=Dist({0.3: 1.0}, 0.1),
                prompt_tokens=Dist({5000: 1.0}, 3000),
                prefix_hit_share=0.05,
            )
            for i in (A, B)
        ),
        fires={
            "InferencePrefillBottleneck": [
                instance_alert(
                    "InferencePrefillBottleneck",
                    i,
                    "warning",
                    "prefill",
                    "compute",
                    "TTFT p95 is 4.875s (threshold 2s) while queueing takes only 100ms and "
                    "inter-token latency p95 is a normal 48.75ms. Prompts take long to compute: "
                    "mean prompt 3k tokens, prefix-cache hit ratio 5%.",
                    f"Prefill is the bottleneck on {i} ({MODEL})",
                )
                for i in (A, B)
            ]
        },
        # The method's cross-checks: not decode, not a capacity problem.
        silent=(
            "InferenceDecodeBottleneck",
            "InferenceQueueingDelay",
            "InferencePrefillStallsDecode",
        ),
    ),
    Scenario(
        # Near miss: 90 % of TTFT in (0.75, 1], 10 % in (1, 2.5] -> p95 = 1 + 0.5 * 1.5 = 1.75 s.
        "prefill near miss: TTFT p95 below threshold",
        (healthy(A, ttft=Dist({1.0: 0.9, 2.5: 0.1}, 1.0), queue=Dist({0.3: 1.0}, 0.1)),),
        fires={},
        silent=("InferencePrefillBottleneck", "InferenceQueueingDelay"),
    ),
    Scenario(
        # TTFT in (5, 7.5] -> p95 7.375 s, 4.5 s of a 6 s mean spent queued: capacity.
        "pure overload: queueing, not prefill",
        tuple(
            healthy(
                i,
                ttft=Dist({7.5: 1.0}, 6.0),
                queue=Dist({5.0: 1.0}, 4.5),
                itl=Dist({0.075: 1.0}, 0.06),
                running=(16,),
                waiting=(28, 31, 35, 30),
            )
            for i in (A, B)
        ),
        fires={"InferenceQueueingDelay": [FLEET_QUEUEING]},
        silent=(
            "InferencePrefillBottleneck",
            "InferenceDecodeBottleneck",
            "InferenceQueuedWhileIdle",
        ),
    ),
    Scenario(
        # ITL in (0.15, 0.2] -> p95 197.5 ms, mean 170 ms = 35.4x the 4.8 ms floor; TTFT normal.
        # Replica C decodes as slowly but its floor is 100 ms (a huge model): within 3x of the
        # floor, so not a decode *inefficiency* (near miss).
        "decode-bound: far above the hardware floor",
        (
            healthy(A, itl=Dist({0.2: 1.0}, 0.17), step_tokens=Dist({256: 1.0}, 256)),
            healthy(
                C, itl=Dist({0.2: 1.0}, 0.17), step_tokens=Dist({256: 1.0}, 256), decode_floor=0.1
            ),
        ),
        fires={
            "InferenceDecodeBottleneck": [
                instance_alert(
                    "InferenceDecodeBottleneck",
                    A,
                    "warning",
                    "decode",
                    "memory",
                    "Inter-token latency p95 is 197.5ms (threshold 0.1s) while TTFT p95 is a normal "
                    "487.5ms; mean ITL over the hardware floor is 35.4x (n/a: floor unknown), with "
                    "256 tokens per engine step. Decode is slower than the memory bandwidth allows.",
                    f"Decode is the bottleneck on {A} ({MODEL})",
                )
            ]
        },
        silent=(
            "InferencePrefillBottleneck",
            "InferenceQueueingDelay",
            "InferenceDecodeAtHardwareFloor",
        ),
    ),
    Scenario(
        # Mean ITL 6 ms against a 4.8 ms floor: 1.25x, hardware-bound (info only).
        "decode at the hardware floor",
        (healthy(A, itl=Dist({0.01: 1.0}, 0.006)), healthy(B, itl=Dist({0.01: 1.0}, 0.009))),
        fires={
            "InferenceDecodeAtHardwareFloor": [
                instance_alert(
                    "InferenceDecodeAtHardwareFloor",
                    A,
                    "info",
                    "decode",
                    "memory",
                    f"Mean inter-token latency of {MODEL} is 1.25x the floor of 4.8ms (weight bytes / "
                    "peak memory bandwidth). Decode is hardware-bound: only a smaller or quantized "
                    "model, or more GPUs, make it faster.",
                    f"Decode on {A} runs at the memory-bandwidth floor",
                )
            ]
        },
        # B runs at 1.875x the floor: neither at the floor nor a bottleneck (ITL p95 9.5 ms).
        silent=("InferenceDecodeBottleneck",),
    ),
]

SCHEDULING = [
    Scenario(
        # The engine stalls half of the time with requests queued on A; its TTFT is queue
        # time. Prometheus fires both alerts; Alertmanager's inhibition keeps only the first
        # (tested against a real Alertmanager in tests/test_alertmanager.py).
        "stall: queued while idle (and the queueing it causes)",
        (
            healthy(
                A,
                queued_while_idle_share=0.5,
                waiting=(12,),
                running=(0,),
                ttft=Dist({7.5: 1.0}, 6.0),
                queue=Dist({5.0: 1.0}, 4.5),
                gpu_busy=(0.04, 0.04),
            ),
        ),
        fires={
            "InferenceQueuedWhileIdle": [queued_while_idle_on_a(50, 12)],
            "InferenceQueueingDelay": [FLEET_QUEUEING],
        },
        silent=("InferenceGPUUnderutilized", "InferencePrefillBottleneck"),
    ),
    Scenario(
        # A stalled engine core does not take requests in, so vLLM's queue timer has not
        # started: after the stall TTFT is high (p95 4.875 s) with only 0.1 s queued, which
        # looks prefill-bound. Streams cut by the stall show a long token gap (ITL p99 23.2x
        # its median) while the backlog is prefilled, which looks like prefill stalling
        # decode. Requests waited while the engine idled 30 % of the window: the stall, not
        # prefill compute.
        "stall hidden from the queue timer",
        (
            healthy(
                A,
                queued_while_idle_share=0.3,
                ttft=Dist({5.0: 1.0}, 3.5),
                queue=Dist({0.3: 1.0}, 0.1),
                itl=Dist({0.05: 0.98, 1.0: 0.02}, 0.0513),
                prompt_tokens=Dist({5000: 1.0}, 1600),
            ),
        ),
        fires={"InferenceQueuedWhileIdle": [queued_while_idle_on_a(30, 0)]},
        silent=("InferencePrefillBottleneck", "InferencePrefillStallsDecode"),
    ),
    Scenario(
        # Near miss: 3 s of stalls every minute is 5 %: a hiccup, under the 10 % threshold.
        "stall near miss: brief hiccups",
        (healthy(A, queued_while_idle_share=0.05),),
        fires={},
        silent=("InferenceQueuedWhileIdle",),
    ),
    Scenario(
        # ITL: 98 % in (25, 50] ms, 2 % in (0.75, 1] s -> p99 875 ms, p50 37.76 ms (23.2x)
        # while A prefills 3.2k prompt tokens/s in 2k-token steps. B has the same tail but
        # no prompt tokens flowing (near miss: another cause).
        "prefill stalls decode",
        (
            healthy(
                A,
                **PREFILL_TAIL,
            ),
            healthy(B, itl=Dist({0.05: 0.98, 1.0: 0.02}, 0.0513), prompt_tokens=Dist({1: 1.0}, 0)),
        ),
        fires={
            "InferencePrefillStallsDecode": [
                instance_alert(
                    "InferencePrefillStallsDecode",
                    A,
                    "warning",
                    "decode",
                    "scheduling",
                    "Inter-token latency p99 is 23.2x its median (875ms vs 37.76ms) while prompts "
                    "are prefilled at 3.2k tokens/s with 2.048k tokens per engine step: decode "
                    "steps wait behind prefill chunks.",
                    f"Prefill stalls decode on {A} ({MODEL})",
                )
            ]
        },
        # ITL p95 (49.2 ms) stays normal: the median request is not slowed.
        silent=("InferenceDecodeBottleneck",),
    ),
]

MEMORY = [
    Scenario(
        # Overload: requests wait 4.5 s of a 6 s TTFT, and every engine step admits new
        # prompts, so decode has the same long tail as in "prefill stalls decode". The tail is
        # the queue's (capacity), not the prefill chunk size's.
        "overload: admissions stall decode",
        (
            healthy(
                A,
                ttft=Dist({7.5: 1.0}, 6.0),
                queue=Dist({5.0: 1.0}, 4.5),
                **PREFILL_TAIL,
            ),
        ),
        fires={"InferenceQueueingDelay": [FLEET_QUEUEING]},
        silent=("InferencePrefillStallsDecode",),
    ),
    Scenario(
        # Preempted requests are prefilled again: the same tail, the memory layer's cause.
        # (At 15m, sample 30, the wave of 4 KV values shows index 2: 61 %.)
        "KV pressure: recomputation stalls decode",
        (
            healthy(
                A,
                preemptions_per_s=0.1,
                **PREFILL_TAIL,
            ),
        ),
        fires={"InferenceKVCachePressure": [kv_pressure_on_a(61)]},
        silent=("InferencePrefillStallsDecode",),
    ),
    Scenario(
        # TTFT looks prefill-bound (p95 4.875 s, 0.1 s queued) but the scheduler preempts 0.1
        # requests/s: the first tokens are late because evicted requests wait again for KV
        # space, which the queue time does not count. Memory, not prefill compute.
        "KV pressure masquerading as slow prefill",
        (
            healthy(
                A,
                ttft=Dist({5.0: 1.0}, 3.5),
                queue=Dist({0.3: 1.0}, 0.1),
                preemptions_per_s=0.1,
                kv_usage=(0.93, 0.95, 0.96),
            ),
        ),
        fires={"InferenceKVCachePressure": [kv_pressure_on_a(93)]},
        silent=("InferencePrefillBottleneck",),
    ),
    Scenario(
        # KV use ~97 % for the whole window and 0.1 preemptions/s on A; B at 85 % without
        # preemptions (near miss).
        "KV-cache pressure",
        (
            healthy(A, kv_usage=(0.96, 0.98, 0.99, 0.97), preemptions_per_s=0.1),
            healthy(B, kv_usage=(0.83, 0.87, 0.85)),
        ),
        fires={"InferenceKVCachePressure": [kv_pressure_on_a(99)]},
    ),
]

SYSTEM = [
    Scenario(
        # GPUs busy 10 % with ~10 requests running on A; B's GPUs busy 50 % (near miss).
        "GPU underutilized while requests run",
        (healthy(A, gpu_busy=(0.1, 0.1)), healthy(B, gpu_busy=(0.5, 0.5))),
        fires={
            "InferenceGPUUnderutilized": [
                instance_alert(
                    "InferenceGPUUnderutilized",
                    A,
                    "warning",
                    "any",
                    "compute",
                    "The GPUs were busy 10% of the time over 5m (threshold 30 %) while requests "
                    "were running: batches are too small or the CPU side (tokenization, "
                    "scheduling, output processing) cannot keep the GPU fed.",
                    f"GPUs on {A} mostly idle while requests run",
                    no_model="",
                )
            ]
        },
    ),
    Scenario(
        # The frontend burns 0.98 cores on A (no NVML there); on B as much, but its GPUs are
        # 95 % busy: the GPU is not waiting (near miss).
        "frontend CPU saturated",
        (
            healthy(A, frontend_cpu_cores=0.98, gpu_busy=None, gpu_collector="0x40"),
            healthy(B, frontend_cpu_cores=0.98, gpu_busy=(0.95, 0.95)),
        ),
        fires={
            "InferenceFrontendCPUSaturated": [
                instance_alert(
                    "InferenceFrontendCPUSaturated",
                    A,
                    "warning",
                    "any",
                    "system",
                    "The server's frontend process used 0.98 CPU cores over 5m (threshold 0.9) "
                    "while the GPU was not busy: tokenization, detokenization and HTTP handling "
                    "in one Python process are the bottleneck.",
                    f"API server / tokenizer CPU saturated on {A}",
                )
            ]
        },
        silent=("InferenceExporterGPUMissing",),  # A never had a GPU: nothing went missing
    ),
]

SYSTEM.append(
    Scenario(
        # The canary's first tokens come 250 ms after the server's own TTFT on A; B's path adds
        # 40 ms (near miss).
        "client path adds to the first token",
        (
            healthy(A, canary_gap="0.25x40", canary_probes=CANARY_OK),
            healthy(B, canary_gap="0.04x40", canary_probes=CANARY_OK),
        ),
        fires={
            "InferenceClientGap": [
                instance_alert(
                    "InferenceClientGap",
                    A,
                    "warning",
                    "any",
                    "system",
                    f"The canary's first tokens from {MODEL} arrive 250ms later than the "
                    "server's own TTFT says (medians over the last 5m; threshold 0.1s; the server's "
                    "mean TTFT 400ms). The time is spent between the client and the engine: the "
                    "network, an ingress or gateway, the API server's HTTP handling and "
                    "tokenization, or SSE framing.",
                    f"The path to {A} adds 250ms to the first token",
                )
            ]
        },
        silent=("InferenceCanaryFailing",),
    )
)

AVAILABILITY = [
    Scenario(
        # A's backend stops answering at 5m; B misses a single scrape (near miss).
        "backend down",
        (
            healthy(A, backend_up="1x10 0x30", scrape_duration="0.004x10 2x30"),
            healthy(B, backend_up="1x10 0 1x29"),
        ),
        fires={"InferenceBackendDown": [backend_down(A, "2s")]},
    ),
    Scenario(
        # 10 % of A's and B's requests end in error (2/s each); C fails 2 % (near miss, but C
        # is part of the same model: 8.67 % across the fleet still fires).
        "request errors across replicas",
        (healthy(A, error_share=0.1), healthy(B, error_share=0.1), healthy(C, error_share=0.02)),
        fires={
            "InferenceRequestErrors": [
                model_alert(
                    "InferenceRequestErrors",
                    "warning",  # with SLOs paging (the default) a cause alert is a ticket
                    "any",
                    "availability",
                    f"7.333% of the requests of {MODEL} finished with a server error over 5m "
                    "(threshold 5 %; client aborts are not counted), out of 6 requests/s.",
                    f"{MODEL}: 7.333% of requests fail",
                )
            ]
        },
    ),
    Scenario(
        "request errors near miss: 2 % fail",
        (healthy(A, error_share=0.02), healthy(B, error_share=0.02)),
        fires={},
        silent=("InferenceRequestErrors",),
    ),
    Scenario(
        # A's GPU 0 receives 90 % of its NVLink peak (tensor-parallel all-reduce); B's GPU 0
        # sends 75 % of its PCIe peak: a near miss, silent.
        "interconnect: NVLink near its peak",
        (healthy(A, nvlink_share=0.9), healthy(B, pcie_share=0.75)),
        fires={"InferenceInterconnectSaturated": [link_alert(A, "90%")]},
    ),
    Scenario(
        "interconnect near miss: NVLink and PCIe at 75 %",
        (healthy(A, nvlink_share=0.75), healthy(B, nvlink_share=None, pcie_share=0.75)),
        fires={},
        silent=("InferenceInterconnectSaturated",),
    ),
    Scenario(
        # No NVLink on A: tensor parallel over PCIe at 85 % of its peak.
        "interconnect: PCIe near its peak",
        (healthy(A, nvlink_share=None, pcie_share=0.85), healthy(B)),
        fires={"InferenceInterconnectSaturated": [link_alert(A, "85%")]},
    ),
    Scenario(
        # GPU 0 of A thermally throttled all along; B's GPU 0 power-capped (normal, silent).
        "GPU throttling",
        (
            healthy(A, throttled={"hw_thermal_slowdown": "1x40"}),
            healthy(B, throttled={"sw_power_cap": "1x40"}),
        ),
        fires={
            "InferenceGPUThrottling": [
                instance_alert(
                    "InferenceGPUThrottling",
                    A,
                    "warning",
                    "any",
                    "compute",
                    "GPU 0 (NVIDIA H100 80GB HBM3) had its clocks held down for hw_thermal_slowdown "
                    "100% of the last 5m: every kernel runs slower until cooling or power delivery "
                    "is fixed.",
                    f"GPU 0 on {A} is throttled (hw_thermal_slowdown)",
                    no_model="",
                    gpu="0",
                    name="NVIDIA H100 80GB HBM3",
                    uuid="GPU-00",
                    reason="hw_thermal_slowdown",
                )
            ]
        },
    ),
    Scenario(
        # NVML on A worked, then fails from 5m on; C never had a GPU (CPU-only): silent.
        "exporter lost its GPUs",
        (
            healthy(
                A,
                gpu_collector="1x10 0x30",
                gpu_busy=(0.85,),
                gpu_memory_total="85899345920x10 _x30",
            ),
            healthy(C, gpu_collector="0x40", gpu_busy=None),
        ),
        fires={
            "InferenceExporterGPUMissing": [
                instance_alert(
                    "InferenceExporterGPUMissing",
                    A,
                    "warning",
                    "any",
                    "availability",
                    f"NVML collection on {A} worked within the last 6h (GPUs seen: 1) and now fails: "
                    "a GPU vanished (fell off the bus, Xid error) or the driver/NVML became "
                    "unavailable. GPU series and the GPU-based idle signal are missing meanwhile.",
                    f"inferwatch on {A} lost its GPUs",
                    no_model="",
                    collector="gpu",
                )
            ]
        },
    ),
]

AVAILABILITY.append(
    Scenario(
        # A's canary: a probe every 12 s, 40 % answered, 40 % time out, 20 % get an HTTP error
        # (60 % failing, 10 timeouts and 5 errors in 5 m) while the server reports up. B: one
        # timeout in 11 probes (near miss). C's server is down: its canary failing is no news.
        "canary failing while the server reports up",
        (
            healthy(A, canary_probes={"ok": 1 / 30, "timeout": 1 / 30, "http_error": 1 / 60}),
            healthy(B, canary_probes={"ok": 1 / 15, "timeout": 1 / 150}),
            healthy(C, backend_up="0x40", canary_probes={"connect_error": 1 / 15}),
        ),
        fires={
            "InferenceCanaryFailing": [
                instance_alert(
                    "InferenceCanaryFailing",
                    A,
                    "critical",
                    "any",
                    "availability",
                    f"60% of the canary's probes of {MODEL} failed over the last 5m (threshold "
                    "25 %) while the server's /metrics answers: 10 timed out, 5 got an HTTP "
                    "error, 0 could not connect. Users on the same path (ingress, gateway, "
                    "authentication, the API server) fail too; the sidecar's log names each kind "
                    "of failure.",
                    f"The canary's requests to {A} fail while the server reports up",
                )
            ],
            "InferenceBackendDown": [backend_down(C, "4ms")],
        },
        silent=("InferenceClientGap",),
    )
)

BASELINE = [
    Scenario(
        # Baseline at concurrency 8: TTFT p95 300 ms, ITL p95 40 ms. Live TTFT p95 487.5 ms is
        # 1.625x (fires; printed with 3 digits, half to even); live ITL p95 48.75 ms is 1.22x. B's baseline TTFT 400 ms
        # makes its 487.5 ms only 1.22x (near miss).
        "latency regression against the baseline",
        (healthy(A, baseline=(0.3, 0.04)), healthy(B, baseline=(0.4, 0.04))),
        fires={
            "InferenceLatencyRegression": [
                instance_alert(
                    "InferenceLatencyRegression",
                    A,
                    "warning",
                    "any",
                    "baseline",
                    f"Live p95 latency of {MODEL} is 1.62x the baseline at comparable load "
                    "(concurrency 8; threshold 1.5x): TTFT p95 487.5ms vs 300ms, inter-token "
                    "latency p95 48.75ms vs 40ms.",
                    f"Latency on {A} regressed against the baseline",
                )
            ]
        },
        eval_time="19m",  # its `for` is 15m
    ),
]

FILES = {
    "phase.yaml": PHASE,
    "scheduling.yaml": SCHEDULING,
    "memory.yaml": MEMORY,
    "system.yaml": SYSTEM,
    "availability.yaml": AVAILABILITY,
    "baseline.yaml": BASELINE,
}

# ---------------------------------------------------------------------------------------
# SLOs: the example config's objectives, burning fast, slowly, for a blip; minutes to days.

SLO_CONFIG = HERE.parent / "slos.example.yaml"
SLO_RULES = "rules/slos-example.yaml"  # the example config's rules, written beside the tests
SLO_MODEL, SLO_LARGE = "llama-3-8b", "llama-3-70b"  # 0.5 s and 2.5 s TTFT objectives


@dataclass(frozen=True)
class Phase:
    """A stretch of traffic: its length, request rate and which shares miss or end badly."""

    minutes: int
    requests_per_s: float = 2.0
    slow_share: float = 0.0  # first token after 2.5-5 s instead of 0.25-0.5 s
    medium_share: float = 0.0  # first token after 0.5-2.5 s
    error_share: float = 0.0
    abort_share: float = 0.0


def _piecewise(step: int, phases: tuple[Phase, ...], per_request) -> str:
    """A counter's promtool values growing at ``per_request(phase) x rate`` per phase."""
    parts, value, first = [], 0.0, True
    for p in phases:
        samples = p.minutes * 60 // step
        inc = per_request(p) * p.requests_per_s * step
        if first:
            parts.append(f"{value:g}+{inc:g}x{samples}")
            value += inc * samples
            first = False
        else:
            parts.append(f"{value + inc:g}+{inc:g}x{samples - 1}")
            value += inc * samples
    return " ".join(parts)


def slo_series(
    step: int,
    phases: tuple[Phase, ...],
    model: str = SLO_MODEL,
    namespace: str = "prod",
    instance: str = A,
    bounds: tuple[float, ...] = TTFT_LE,
) -> list[dict]:
    """TTFT histogram and finished requests by reason of one replica over ``phases``."""
    engine = {"instance": instance, "job": "inferwatch", "namespace": namespace}
    engine |= {"backend": "vllm", "model": model, "engine": "0"}
    metric = "inferwatch_time_to_first_token_seconds"
    out = []
    for le in (*bounds, "+Inf"):

        def below(p: Phase, le=le) -> float:
            fast = 1 - p.slow_share - p.medium_share
            if le == "+Inf" or le >= 5.0:
                return 1.0
            return fast * (le >= 0.5) + p.medium_share * (le >= 2.5)

        out.append(
            {
                "series": f"{metric}_bucket" + _labels(**engine, le=str(le)),
                "values": _piecewise(step, phases, below),
            }
        )
    out.append(
        {
            "series": f"{metric}_count" + _labels(**engine),
            "values": _piecewise(step, phases, lambda p: 1.0),
        }
    )
    for reason, share in (
        ("stop", lambda p: 1 - p.error_share - p.abort_share),
        ("error", lambda p: p.error_share),
        ("abort", lambda p: p.abort_share),
    ):
        out.append(
            {
                "series": "inferwatch_requests_finished_total" + _labels(**engine, reason=reason),
                "values": _piecewise(step, phases, share),
            }
        )
    return out


def firing(alert: str, slo: str, model: str = SLO_MODEL, namespace: str = "prod") -> dict:
    """The alert's series in ``ALERTS`` (labels only: promql_expr_test shows no annotations)."""
    severity = "critical" if alert == "InferenceSLOFastBurn" else "warning"
    labels = {"alertname": alert, "alertstate": "firing", "severity": severity, "slo": slo}
    labels |= {"layer": "slo", "namespace": namespace, "backend": "vllm", "model": model}
    return {"labels": "ALERTS" + _labels(**labels), "value": 1}


def slo_checks(
    at: str, fast: tuple[dict, ...] | None = (), slow: tuple[dict, ...] | None = ()
) -> list[dict]:
    """What fires at ``at``: the fast and slow burns expected (None: not checked)."""
    checks = []
    for alert, expected in (("InferenceSLOFastBurn", fast), ("InferenceSLOSlowBurn", slow)):
        if expected is None:
            continue
        checks.append(
            {
                "expr": f'ALERTS{{alertname="{alert}",alertstate="firing"}}',
                "eval_time": at,
                "exp_samples": list(expected),
            }
        )
    return checks


# Long windows hold only the history there is: healthy traffic first, as long as the
# longest window a scenario judges apart from the short ones (6 h), so that each window
# means what it says.
SIX_HOURS = Phase(6 * 60)
ONSET = 6 * 60  # minutes


def _at(minutes: int, onset: int = ONSET) -> str:
    return f"{onset + minutes}m"


SLO_FAST = [
    {
        "name": "fast burn: every request of llama-3-8b fails (99.9 % objective): page in 1 min",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, error_share=1.0))),
        "promql_expr_test": [
            *slo_checks(_at(0), slow=None),
            *slo_checks(_at(1), fast=(firing("InferenceSLOFastBurn", "errors"),), slow=None),
        ],
        # Seven minutes in: 1 h burn 7/60 / 0.1 % = 117x; the 5 min error rates recorded so far
        # (0.4, 0.8, ... 2, 2, 2 req/s) against 2 req/s over 6 h hold 13.7x the 28 d budget; the
        # cause alert has fired since minute 6 (a step later than its `for`: the two rule
        # groups are evaluated concurrently, so at minute 6 the page may see it pending).
        "alert_rule_test": [
            {
                "eval_time": _at(7),
                "alertname": "InferenceSLOFastBurn",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "critical",
                            "slo": "errors",
                            "layer": "slo",
                            "namespace": "prod",
                            "backend": "vllm",
                            "model": SLO_MODEL,
                        },
                        "exp_annotations": {
                            "summary": f"{SLO_MODEL}: the server errors objective burns its "
                            "error budget fast",
                            "description": "Objective: 99.9 % of finished requests end without "
                            "a server error over 28d. The budget burns at 117x the sustainable "
                            "rate (threshold 13.4x over 1h and 5m or 5.6x over 6h and 30m); "
                            "-1270% of the 28d budget is left. Cause alerts of this model: "
                            "InferenceRequestErrors (firing).",
                            "runbook_url": f"{RUNBOOKS}InferenceSLOFastBurn.md",
                        },
                    }
                ],
            }
        ],
    },
    {
        "name": "fast burn: every first token of llama-3-8b misses 0.5 s (99 %): page in 9 min",
        # 1h share of bad events 8/60 = 13.3 % < 2 % x 28 d / 1 h x 1 % = 13.44 %; 9/60 above.
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, slow_share=1.0))),
        "promql_expr_test": [
            *slo_checks(_at(8), slow=None),
            *slo_checks(_at(9), fast=(firing("InferenceSLOFastBurn", "ttft"),), slow=None),
        ],
    },
    {
        # 1 h share 2/60 = 3.3 % (< 13.44 %), 30 min 6.7 % but 6 h 0.56 % (< 5.6 %), 2 h
        # 1.7 % (< 2.8 %), 6 h below 0.93 %: no window pair burns.
        "name": "blip: two minutes of slow first tokens after six healthy hours: silent",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(2, slow_share=1.0), Phase(30))),
        "promql_expr_test": [*slo_checks(_at(2)), *slo_checks(_at(5)), *slo_checks(_at(30))],
    },
    {
        "name": "aborts are the clients': half the requests aborted burn no error budget",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, abort_share=0.5))),
        "promql_expr_test": [*slo_checks(_at(10), slow=None), *slo_checks(_at(20), slow=None)],
        "alert_rule_test": [
            {"eval_time": _at(20), "alertname": "InferenceRequestErrors", "exp_alerts": []}
        ],
    },
    {
        "name": "namespaces: llama-3-8b fails in staging only; prod is not paged",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20)))
        + slo_series(60, (SIX_HOURS, Phase(20, error_share=1.0)), namespace="staging", instance=B),
        "promql_expr_test": [
            *slo_checks(
                _at(5),
                fast=(firing("InferenceSLOFastBurn", "errors", namespace="staging"),),
                slow=None,
            ),
        ],
    },
    {
        "name": "per-model objectives: first tokens in 0.5-2.5 s miss llama-3-8b's, not llama-3-70b's",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, medium_share=1.0)))
        + slo_series(60, (SIX_HOURS, Phase(20, medium_share=1.0)), model=SLO_LARGE, instance=B),
        "promql_expr_test": [
            *slo_checks(_at(20), fast=(firing("InferenceSLOFastBurn", "ttft"),), slow=None)
        ],
    },
    {
        "name": "unmeasured: a server without a 0.5 s bucket",
        "interval": "1m",
        "input_series": slo_series(
            60, (Phase(20),), bounds=(0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0)
        ),
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "InferenceSLOUnmeasured", "exp_alerts": []},
            {
                "eval_time": "20m",
                "alertname": "InferenceSLOUnmeasured",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "slo": "ttft",
                            "layer": "slo",
                            "namespace": "prod",
                            "backend": "vllm",
                            "model": SLO_MODEL,
                        },
                        "exp_annotations": {
                            "summary": f"{SLO_MODEL}: the time to first token objective cannot "
                            "be measured",
                            "description": "Objective: 99 % of requests within 0.5 s (time to "
                            "first token). Requests arrive but "
                            "inferwatch_time_to_first_token_seconds has no bucket at 0.5 s; the "
                            "server's bounds are 0.1 0.2 0.4 0.6 0.8 1.0 2.0 4.0 6.0 . Set the "
                            "objective's seconds to one of them (or give the server that bucket) "
                            "and regenerate the rules.",
                            "runbook_url": f"{RUNBOOKS}InferenceSLOUnmeasured.md",
                        },
                    }
                ],
            },
        ],
    },
]
SLO_SLOW = [
    {
        "name": "slow burn: 1.5 % of first tokens late for days (1.5x): ticket after ~45 h, no page",
        # 3 d share 1.5 % x t / 72 h > 0.9333 x 1 % once t > 44.8 h; 1.5x never reaches 2.8x.
        # Samples every 2 min: the long windows add up the recorded 5 min rates, and a 5 min
        # rate needs two samples (rules evaluated every 10 min).
        "interval": "2m",
        "input_series": slo_series(120, (Phase(3 * 24 * 60), Phase(3 * 24 * 60, slow_share=0.015))),
        "promql_expr_test": [
            *slo_checks(f"{72 + 44}h"),
            *slo_checks(f"{72 + 46}h", slow=(firing("InferenceSLOSlowBurn", "ttft"),)),
            *slo_checks("144h", slow=(firing("InferenceSLOSlowBurn", "ttft"),)),
        ],
    },
]


def slo_rules() -> str:
    """The example config's rules file (what `inferwatch generate --config` writes)."""
    from inferwatch.method.rules import GENERATED, dump_yaml, rules_document
    from inferwatch.method.spec import spec_from_config

    config = yaml.safe_load(SLO_CONFIG.read_text())
    return GENERATED + dump_yaml(rules_document(spec_from_config(config)))


HEADER = (
    "# Generated by alerts/tests/scenarios.py (the scenarios are readable there); do not edit.\n"
)


def render() -> dict[str, str]:
    """File name -> content of every test file."""
    out = {}
    for name, scenarios in FILES.items():
        doc = {
            "rule_files": ["../inferwatch-rules.yaml"],
            "evaluation_interval": f"{STEP}s",
            "tests": [test_group(s) for s in scenarios],
        }
        out[name] = HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)
    for name, interval, tests in (
        ("slos-fast.yaml", "1m", SLO_FAST),
        ("slos-slow.yaml", "10m", SLO_SLOW),
    ):
        doc = {"rule_files": [SLO_RULES], "evaluation_interval": interval, "tests": tests}
        out[name] = HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)
    out[SLO_RULES] = slo_rules()
    return out


if __name__ == "__main__":
    for name, content in render().items():
        (HERE / name).parent.mkdir(exist_ok=True)
        (HERE / name).write_text(content)
