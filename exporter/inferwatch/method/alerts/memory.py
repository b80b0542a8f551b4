"""The memory layer: decode against the memory-bandwidth floor, and the KV cache.

Decode reads every weight and the KV cache each step: its floor is the weights' bytes over
the GPU's memory bandwidth.
"""

from __future__ import annotations

from functools import partial

from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    CANARY_TTFT_P95,
    DECODE_STEP_OVER_FLOOR,
    INSTANCE_ITL,
    INSTANCE_TTFT,
    P95,
    PLAIN_NUMBER,
    TOKEN_BUDGET_USE,
    if_present,
    value_of,
    window_mean,
)
from inferwatch.method.scenario import (
    SERVED_MODEL,
    TGI_LE,
    TGI_PREFILL,
    A,
    B,
    C,
    Dist,
    Scenario,
    bottleneck,
    healthy,
    instance_alert,
    tgi,
)
from inferwatch.method.signals import INSTANCE

decode_bottleneck = partial(bottleneck, "decode", "memory")

# ---------------------------------------------------------------------------------------
# InferenceDecodeBottleneck

DECODE_BOUND = Scenario(
    # ITL in (0.15, 0.2] -> p95 197.5 ms, mean 170 ms = 35.4x the 4.8 ms floor; TTFT normal.
    # Replica C decodes as slowly but its floor is 100 ms (a huge model): within 3x of the
    # floor, so not a decode *inefficiency* (near miss).
    "decode-bound: far above the hardware floor",
    (
        healthy(A, itl=Dist({0.2: 1.0}, 0.17), step_tokens=Dist({256: 1.0}, 256)),
        healthy(C, itl=Dist({0.2: 1.0}, 0.17), step_tokens=Dist({256: 1.0}, 256), decode_floor=0.1),
    ),
    file="phase.yaml",
    place=5,
    fires={
        "InferenceDecodeBottleneck": [
            decode_bottleneck(
                A,
                "Inter-token latency p95 is 197.5ms (threshold 0.1s) while TTFT p95 is a normal "
                "487.5ms; mean ITL over the hardware floor is 35.4x (n/a: floor unknown), with "
                "256 tokens per engine step. Decode is slower than the memory bandwidth allows.",
            )
        ]
    },
    silent=(
        "InferencePrefillBottleneck",
        "InferenceQueueingDelay",
        "InferenceDecodeAtHardwareFloor",
    ),
)

TGI_DECODE_BOUND = Scenario(
    # TGI: no inter-token histogram; decode steps in (147.8, 221.7] ms -> p95 218 ms, mean
    # 200 ms = 41.7x the 4.8 ms floor; the canary's first tokens normal. B's decode steps in
    # (65.7, 98.5] ms -> p95 96.9 ms (near miss). C is an old TGI without step histograms
    # or canary: nothing to judge the phase on, so silent.
    "TGI: decode steps slow",
    (
        tgi(A, step_seconds={"prefill": TGI_PREFILL, "decode": Dist({TGI_LE[18]: 1.0}, 0.2)}),
        tgi(B, step_seconds={"prefill": TGI_PREFILL, "decode": Dist({TGI_LE[16]: 1.0}, 0.09)}),
        tgi(C, step_seconds=None, canary_ttft=None, canary_probes=None, token_budget_use=None),
    ),
    file="tgi.yaml",
    place=1,
    fires={
        "InferenceDecodeBottleneck": [
            decode_bottleneck(
                A,
                "Decode steps take 218ms at p95 (threshold 0.1s; a decode step is every "
                "running request's next token, timed by the server) while the canary's TTFT "
                "p95 is a normal 242.5ms; the mean decode step over the hardware floor is "
                "41.7x (n/a: floor unknown), with 9.82 requests running. Decode is slower than "
                "the memory bandwidth allows.",
                backend="tgi",
            )
        ]
    },
    silent=("InferencePrefillBottleneck", "InferenceDecodeAtHardwareFloor"),
)

DECODE_BOTTLENECK = Alert(
    name="InferenceDecodeBottleneck",
    order=5,
    severity="warning",
    level=INSTANCE,
    phase="decode",
    layer="memory",
    explains=USERS_SEE,
    for_default="5m",
    summary="Decode is the bottleneck on {{ $labels.instance }} ({{ $labels.model }})",
    # Where the server has no inter-token histogram (TGI), its decode steps and the canary's
    # first tokens stand in (method/fallbacks.py), and the text says so.
    description=if_present(
        f"{INSTANCE_ITL}:quantile_%(w)s{P95}",
        INSTANCE,
        "Inter-token latency p95 is {{ $value | humanizeDuration }} (threshold "
        "%(t.itl_p95_seconds)ss) while TTFT p95 is a normal "
        + value_of(f"{INSTANCE_TTFT}:quantile_%(w)s{P95}", INSTANCE, "humanizeDuration")
        + "; mean ITL over the hardware floor is "
        + value_of(f"{INSTANCE_ITL}:mean_per_decode_floor_%(w)s", INSTANCE, PLAIN_NUMBER)
        + "x (n/a: floor unknown), with "
        + value_of(window_mean("inferwatch_engine_step_tokens"), INSTANCE)
        + " tokens per engine step.",
        "Decode steps take {{ $value | humanizeDuration }} at p95 (threshold "
        "%(t.itl_p95_seconds)ss; a decode step is every running request's next token, "
        "timed by the server) while the canary's TTFT p95 is a normal "
        + value_of(CANARY_TTFT_P95, INSTANCE, "humanizeDuration")
        + "; the mean decode step over the hardware floor is "
        + value_of(DECODE_STEP_OVER_FLOOR, INSTANCE, PLAIN_NUMBER)
        + "x (n/a: floor unknown), with "
        + value_of("avg_over_time(inferwatch_requests_running[%(window)s])", INSTANCE, PLAIN_NUMBER)
        + " requests running.",
    )
    + " Decode is slower than the memory bandwidth allows.",
    when=(
        Cond("itl_p95", ">", "itl_p95_seconds"),
        Cond("ttft_p95", "<=", "ttft_p95_seconds"),
        Cond("generation_rate", ">", "min_token_rate"),
    ),
    unless=(Cond("itl_over_floor", "<", "floor_factor_far"),),
    evidence=(
        f"Decode-only steps (`execute_context_0(0)_generation_<D>(<d>)`, {STEP_SPAN}) and "
        "their durations: a step time that grows with D is the batch's memory traffic; "
        "gaps between steps are host overhead (scheduling, sampling, detokenization: see "
        "the API server's stacks)."
    ),
    scenarios=(DECODE_BOUND, TGI_DECODE_BOUND),
)

# ---------------------------------------------------------------------------------------
# InferenceDecodeAtHardwareFloor

AT_THE_FLOOR = Scenario(
    # Mean ITL 6 ms against a 4.8 ms floor: 1.25x, hardware-bound (info only).
    "decode at the hardware floor",
    (healthy(A, itl=Dist({0.01: 1.0}, 0.006)), healthy(B, itl=Dist({0.01: 1.0}, 0.009))),
    file="phase.yaml",
    place=6,
    fires={
        "InferenceDecodeAtHardwareFloor": [
            instance_alert(
                "InferenceDecodeAtHardwareFloor",
                A,
                "info",
                "decode",
                "memory",
                f"Mean inter-token latency of {SERVED_MODEL} is 1.25x the floor of 4.8ms "
                "(weight bytes / peak memory bandwidth). Decode is hardware-bound: only a "
                "smaller or quantized model, or more GPUs, make it faster.",
                f"Decode on {A} runs at the memory-bandwidth floor",
            )
        ]
    },
    # B runs at 1.875x the floor: neither at the floor nor a bottleneck (ITL p95 9.5 ms).
    silent=("InferenceDecodeBottleneck",),
)

DECODE_AT_HARDWARE_FLOOR = Alert(
    name="InferenceDecodeAtHardwareFloor",
    order=6,
    severity="info",
    level=INSTANCE,
    phase="decode",
    layer="memory",
    for_default="10m",
    summary="Decode on {{ $labels.instance }} runs at the memory-bandwidth floor",
    description='Mean inter-token latency of {{ $labels.model }} is {{ $value | printf "%%.3g" }}x '
    "the floor of "
    + value_of("inferwatch_decode_floor_seconds", INSTANCE, "humanizeDuration")
    + " (weight bytes / peak memory bandwidth). Decode is hardware-bound: only a "
    "smaller or quantized model, or more GPUs, make it faster.",
    when=(
        Cond("itl_over_floor", "<", "floor_factor_near"),
        Cond("generation_rate", ">", "min_token_rate"),
    ),
    scenarios=(AT_THE_FLOOR,),
)

# ---------------------------------------------------------------------------------------
# InferenceKVCachePressure


def kv_pressure_on_a(kv_percent: int, preempted: str = "0.1") -> dict:
    """InferenceKVCachePressure on replica A, preempting ``preempted`` requests/s, KV use now
    ``kv_percent`` % (the wave of KV values at 15m, sample 30)."""
    return instance_alert(
        "InferenceKVCachePressure",
        A,
        "warning",
        "decode",
        "memory",
        f"KV-cache use now {kv_percent}% (threshold 90 % averaged over 5m) and the scheduler "
        f"preempted {preempted} requests/s (threshold 0.02/s). Preempted requests lose their "
        "KV cache and are recomputed later.",
        f"KV cache under pressure on {A} ({SERVED_MODEL})",
    )


KV_PRESSURE = Scenario(
    # KV use ~97 % for the whole window and 0.1 preemptions/s on A; B at 85 % without
    # preemptions (near miss).
    "KV-cache pressure",
    (
        healthy(A, kv_usage=(0.96, 0.98, 0.99, 0.97), preemptions_per_s=0.1),
        healthy(B, kv_usage=(0.83, 0.87, 0.85)),
    ),
    file="memory.yaml",
    place=4,
    fires={"InferenceKVCachePressure": [kv_pressure_on_a(99)]},
)

TGI_BUDGET_EXHAUSTED = Scenario(
    # TGI: the running batch holds 97.55 % of its token budget and requests queue on A; B
    # holds ~83 % (near miss).
    "TGI: token budget exhausted with a queue",
    (
        tgi(A, token_budget_use=(0.96, 0.98, 0.99, 0.97), waiting=(5, 7, 6)),
        tgi(B, token_budget_use=(0.8, 0.85, 0.83)),
    ),
    file="tgi.yaml",
    place=3,
    fires={
        "InferenceKVCachePressure": [
            instance_alert(
                "InferenceKVCachePressure",
                A,
                "warning",
                "decode",
                "memory",
                "The running batch has reserved 97.55% of its token budget (threshold 90 % "
                "averaged over 5m) with 5 requests waiting: the server admits a request only "
                "when its tokens fit the budget, so new requests wait for running ones to "
                "finish.",
                f"Batch token budget exhausted on {A} ({SERVED_MODEL})",
                backend="tgi",
            )
        ]
    },
    silent=("InferenceDecodeBottleneck", "InferencePrefillBottleneck"),
)

KV_CACHE_PRESSURE = Alert(
    name="InferenceKVCachePressure",
    order=7,
    severity="warning",
    level=INSTANCE,
    phase="decode",
    layer="memory",
    # Preempted requests wait and are computed again: the queueing, the prefill work and the
    # decode streams stalled behind that recompute are its doing. A cache that cannot hold
    # the batch is also why the load reaches its capacity (long generations hold their
    # places for many steps): the capacity ticket is the memory's.
    explains=(
        "InferenceNearCapacity",
        "InferenceQueueingDelay",
        "InferencePrefillBottleneck",
        "InferencePrefillStallsDecode",
        *USERS_SEE,
    ),
    for_default="5m",
    summary=if_present(
        "inferwatch_batch_token_budget",
        INSTANCE,
        "Batch token budget exhausted",
        "KV cache under pressure",
    )
    + " on {{ $labels.instance }} ({{ $labels.model }})",
    # A server that admits by a token budget (TGI) has no KV-cache gauge or preemptions:
    # its budget in use is read instead (method/fallbacks.py).
    description=if_present(
        "inferwatch_batch_token_budget",
        INSTANCE,
        "The running batch has reserved "
        + value_of(TOKEN_BUDGET_USE, INSTANCE, "humanizePercentage")
        + " of its token budget (threshold %(pct.kv_usage_high)s averaged over %(window)s) "
        "with "
        + value_of("inferwatch_requests_waiting", INSTANCE)
        + " requests waiting: the server admits a request only when its tokens fit the "
        "budget, so new requests wait for running ones to finish.",
        "KV-cache use now "
        + value_of("inferwatch_kv_cache_usage_ratio", INSTANCE, "humanizePercentage")
        + " (threshold %(pct.kv_usage_high)s averaged over %(window)s) and the scheduler "
        "preempted "
        + value_of("instance:inferwatch_preemptions:%(w)s", INSTANCE, PLAIN_NUMBER)
        + " requests/s (threshold %(t.preemptions_per_second)s/s). Preempted requests lose "
        "their KV cache and are recomputed later.",
    ),
    any_of=(
        Cond("kv_usage", ">", "kv_usage_high"),
        Cond("preemption_rate", ">", "preemptions_per_second"),
    ),
    evidence=(
        f"Steps ({STEP_SPAN}) whose decode count D drops and prefill count P jumps without new "
        "requests are preempted requests being recomputed."
    ),
    scenarios=(KV_PRESSURE, TGI_BUDGET_EXHAUSTED),
)

# ---------------------------------------------------------------------------------------
# InferenceKVCacheGaugeFrozen

KV_FROZEN = Scenario(
    # A's KV-cache use reads 99 % with nothing running and no engine step (after mass
    # aborts); B's reads 85 % the same way (near miss). The pressure the stale gauge shows
    # fires in Prometheus too, listed under the frozen gauge (Alertmanager inhibits it).
    "a KV-cache gauge frozen high with nothing running",
    tuple(
        healthy(i, requests_per_s=0.0, steps_per_s=0.0, running=(0,), waiting=(0,), kv_usage=(kv,))
        for i, kv in ((A, 0.99), (B, 0.85))
    ),
    file="memory.yaml",
    place=7,
    fires={
        "InferenceKVCacheGaugeFrozen": [
            instance_alert(
                "InferenceKVCacheGaugeFrozen",
                A,
                "warning",
                "any",
                "memory",
                f"KV-cache use of {SERVED_MODEL} on {A} read 99% over the last 5m while no "
                "request ran and the engine took no step: the gauge is stale, not the cache "
                "full. Routers that balance on it send this pod nothing.",
                f"The KV-cache gauge of {A} is frozen ({SERVED_MODEL})",
            )
        ],
        "InferenceKVCachePressure": [kv_pressure_on_a(99, preempted="0")],
    },
)

KV_CACHE_GAUGE_FROZEN = Alert(
    name="InferenceKVCacheGaugeFrozen",
    order=22,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="memory",
    # A full cache with nothing in it is the gauge's fault, not memory pressure.
    explains=("InferenceKVCachePressure",),
    for_default="5m",
    summary="The KV-cache gauge of {{ $labels.instance }} is frozen ({{ $labels.model }})",
    description="KV-cache use of {{ $labels.model }} on {{ $labels.instance }} read "
    "{{ $value | humanizePercentage }} over the last %(window)s while no request ran and the "
    "engine took no step: the gauge is stale, not the cache full. Routers that balance on "
    "it send this pod nothing.",
    when=(
        Cond("kv_usage", ">", "kv_usage_high"),
        Cond("running", "<=", 0),
        Cond("engine_step_rate", "<=", 0),
    ),
    scenarios=(KV_FROZEN,),
)

ALERTS = (DECODE_BOTTLENECK, DECODE_AT_HARDWARE_FLOOR, KV_CACHE_PRESSURE, KV_CACHE_GAUGE_FROZEN)
