"""The compute layer: prefill that computes slowly, GPUs that idle or run throttled."""

from __future__ import annotations

from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    INSTANCE_ITL,
    INSTANCE_TTFT,
    P95,
    PREFILL_STEP_MEAN,
    STEP_P95,
    if_present,
    value_of,
    window_mean,
)
from inferwatch.method.alerts.memory.kv_cache_pressure import kv_pressure_on_a
from inferwatch.method.scenario import (
    TGI_DECODE,
    TGI_LE,
    A,
    B,
    Dist,
    Scenario,
    gpu_alert,
    healthy,
    instance_alert,
    tgi,
)
from inferwatch.method.signals import INSTANCE, QUEUE

# ---------------------------------------------------------------------------------------
# InferencePrefillBottleneck


LONG_PROMPTS = Scenario(
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
    file="phase.yaml",
    place=2,
    fires={
        "InferencePrefillBottleneck": [
            # TTFT p95 (its series present); queue time, ITL p95, mean prompt, prefix hits.
            instance_alert(i, value=4.875, queries=(4.875, 0.1, 0.04875, 3000, 0.05))
            for i in (A, B)
        ]
    },
    # The method's cross-checks: not decode, not a capacity problem.
    silent=(
        "InferenceDecodeBottleneck",
        "InferenceQueueingDelay",
        "InferencePrefillStallsDecode",
    ),
)
PREFILL_NEAR_MISS = Scenario(
    # Near miss: 90 % of TTFT in (0.75, 1], 10 % in (1, 2.5] -> p95 = 1 + 0.5 * 1.5 = 1.75 s.
    "prefill near miss: TTFT p95 below threshold",
    (healthy(A, ttft=Dist({1.0: 0.9, 2.5: 0.1}, 1.0), queue=Dist({0.3: 1.0}, 0.1)),),
    file="phase.yaml",
    place=3,
    fires={},
    silent=("InferencePrefillBottleneck", "InferenceQueueingDelay"),
)
KV_PRESSURE_AS_PREFILL = Scenario(
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
    file="memory.yaml",
    place=3,
    fires={"InferenceKVCachePressure": [kv_pressure_on_a(kv_usage=0.93)]},
    silent=("InferencePrefillBottleneck",),
)

TGI_LONG_PROMPTS = Scenario(
    # TGI: no TTFT histogram. The canary's first tokens in (2.5, 5] s -> p95 4.875 s; prefill
    # steps in (2.53, 3.79] s, mean 3 s, against 5 ms queued: the queue's share 0.2 %.
    # Decode steps normal. B's canary TTFT p95 1.75 s (near miss).
    "TGI: long prompts",
    (
        tgi(
            A,
            canary_ttft=Dist({5.0: 1.0}, 3.5),
            step_seconds={"prefill": Dist({TGI_LE[24]: 1.0}, 3.0), "decode": TGI_DECODE},
            prompt_tokens=Dist({5000: 1.0}, 3000),
        ),
        tgi(B, canary_ttft=Dist({1.0: 0.9, 2.5: 0.1}, 1.0)),
    ),
    file="tgi.yaml",
    place=2,
    fires={
        "InferencePrefillBottleneck": [
            # No TTFT series: the canary's TTFT p95; queue time, prefill step mean, decode
            # step p95, mean prompt.
            instance_alert(A, backend="tgi", value=4.875, queries=(None, 0.005, 3, 0.02871, 3000))
        ]
    },
    silent=("InferenceDecodeBottleneck", "InferenceKVCachePressure"),
)

PREFILL_BOTTLENECK = Alert(
    name="InferencePrefillBottleneck",
    order=4,
    severity="warning",
    level=INSTANCE,
    phase="prefill",
    layer="compute",
    explains=USERS_SEE,
    first_token_waits_in="prefill",
    for_default="5m",
    summary="Prefill is the bottleneck on {{ $labels.instance }} ({{ $labels.model }})",
    # Where the server has no TTFT histogram (TGI), the canary's first tokens, the queue
    # and the prefill steps stand in (method/fallbacks.py), and the text says so.
    description=if_present(
        f"{INSTANCE_TTFT}:quantile_%(w)s{P95}",
        INSTANCE,
        "TTFT p95 is {{ $value | humanizeDuration }} (threshold %(t.ttft_p95_seconds)ss) "
        "while queueing takes only "
        + value_of(window_mean(f"inferwatch_{QUEUE}"), INSTANCE, "humanizeDuration")
        + " and inter-token latency p95 is a normal "
        + value_of(f"{INSTANCE_ITL}:quantile_%(w)s{P95}", INSTANCE, "humanizeDuration")
        + ". Prompts take long to compute: mean prompt "
        + value_of(window_mean("inferwatch_request_prompt_tokens"), INSTANCE)
        + " tokens, prefix-cache hit ratio "
        + value_of(
            window_mean(
                "inferwatch_prefix_cache_hits_total", "inferwatch_prefix_cache_queries_total"
            ),
            INSTANCE,
            "humanizePercentage",
        )
        + ".",
        "The canary's TTFT p95 is {{ $value | humanizeDuration }} (threshold "
        "%(t.ttft_p95_seconds)ss; the server has no TTFT histogram) while queueing takes only "
        + value_of(window_mean(f"inferwatch_{QUEUE}"), INSTANCE, "humanizeDuration")
        + " against "
        + value_of(PREFILL_STEP_MEAN, INSTANCE, "humanizeDuration")
        + " per prefill step, and decode steps take a normal "
        + value_of(STEP_P95, INSTANCE, "humanizeDuration")
        + " at p95. Prompts take long to compute: mean prompt "
        + value_of(window_mean("inferwatch_request_prompt_tokens"), INSTANCE)
        + " tokens.",
    ),
    when=(
        Cond("ttft_p95", ">", "ttft_p95_seconds"),
        Cond("queue_share", "<", "queue_share_low"),
        Cond("itl_p95", "<=", "itl_p95_seconds"),
        Cond("request_rate", ">", "min_request_rate"),
    ),
    # Preempted requests wait for KV space again after being scheduled, which the
    # queue time does not count: a slow first token is then the memory layer's.
    # Requests that reach a stalled engine are not queued yet either (vLLM starts
    # the queue timer when the engine core takes them in): their TTFT is the stall's.
    unless=(
        Cond("preemption_rate", ">", "preemptions_per_second"),
        Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),
    ),
    evidence=(
        f"Steps with a large `context` token count ({STEP_SPAN}) take most of the timeline; "
        "their duration against p is the prefill throughput. Long steps with few tokens "
        "mean slow kernels (look inside the step: attention vs. MLP)."
    ),
    scenarios=(LONG_PROMPTS, PREFILL_NEAR_MISS, KV_PRESSURE_AS_PREFILL, TGI_LONG_PROMPTS),
)

# ---------------------------------------------------------------------------------------
# InferenceGPUUnderutilized

IDLE_GPUS = Scenario(
    # GPUs busy 10 % with ~10 requests running on A; B's GPUs busy 50 % (near miss).
    "GPU underutilized while requests run",
    (healthy(A, gpu_busy=(0.1, 0.1)), healthy(B, gpu_busy=(0.5, 0.5))),
    file="system.yaml",
    place=1,
    fires={"InferenceGPUUnderutilized": [instance_alert(A, backend=None, model=None, value=0.1)]},
)

GPU_UNDERUTILIZED = Alert(
    name="InferenceGPUUnderutilized",
    order=9,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="compute",
    explains=USERS_SEE,
    for_default="10m",
    summary="GPUs on {{ $labels.instance }} mostly idle while requests run",
    description="The GPUs were busy {{ $value | humanizePercentage }} of the time over %(window)s "
    "(threshold %(pct.gpu_busy_low)s) while requests were running: batches are too "
    "small or the CPU side (tokenization, scheduling, output processing) cannot keep "
    "the GPU fed.",
    when=(Cond("gpu_busy", "<", "gpu_busy_low"), Cond("running", ">=", 1)),
    evidence=(
        f"Gaps between the engine's steps ({STEP_SPAN}) are time the accelerator waits on the "
        "host; inside a step, gaps between kernels (the CUDA stream rows in Perfetto) are "
        "launch overhead. The API server's stacks show whether the host is busy there."
    ),
    scenarios=(IDLE_GPUS,),
)

# ---------------------------------------------------------------------------------------
# InferenceGPUThrottling

THROTTLED = Scenario(
    # GPU 0 of A thermally throttled all along; B's GPU 0 power-capped (normal, silent).
    "GPU throttling",
    (
        healthy(A, throttled={"hw_thermal_slowdown": "1x40"}),
        healthy(B, throttled={"sw_power_cap": "1x40"}),
    ),
    file="availability.yaml",
    place=7,
    fires={"InferenceGPUThrottling": [gpu_alert(A, reason="hw_thermal_slowdown", value=1)]},
)

GPU_THROTTLING = Alert(
    name="InferenceGPUThrottling",
    order=15,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="compute",
    explains=("InferencePrefillBottleneck", "InferenceDecodeBottleneck", *USERS_SEE),
    for_default="5m",
    summary="GPU {{ $labels.gpu }} on {{ $labels.instance }} is throttled ({{ $labels.reason }})",
    description="GPU {{ $labels.gpu }} ({{ $labels.name }}) had its clocks held down for "
    "{{ $labels.reason }} {{ $value | humanizePercentage }} of the last %(window)s: "
    "every kernel runs slower until cooling or power delivery is fixed.",
    when=(Cond("gpu_throttled", ">", "throttled_share"),),
    scenarios=(THROTTLED,),
)

ALERTS = (PREFILL_BOTTLENECK, GPU_UNDERUTILIZED, GPU_THROTTLING)
