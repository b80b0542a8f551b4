"""The scheduling layer: requests that wait, for capacity or for a stalled engine, and decode
steps that wait behind prefill chunks."""

from __future__ import annotations

from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    INSTANCE_ITL,
    P50,
    P99,
    PLAIN_NUMBER,
    if_present,
    value_of,
    window_mean,
)
from inferwatch.method.alerts.memory import kv_pressure_on_a
from inferwatch.method.scenario import (
    SERVED_MODEL,
    A,
    B,
    Dist,
    Scenario,
    healthy,
    instance_alert,
    model_alert,
)
from inferwatch.method.signals import INSTANCE, MODEL, QUEUE

# Fleet TTFT p95 7.375 s with 4.5 s of a 6 s mean queued (two overloaded replicas, or one
# stalled one).
FLEET_QUEUEING = model_alert(
    "InferenceQueueingDelay",
    "info",
    "prefill",
    "scheduling",
    f"TTFT p95 of {SERVED_MODEL} across replicas is 7.375s (threshold 2s) and requests spend "
    "75% of their mean TTFT waiting to be scheduled: the fleet lacks capacity.",
    f"{SERVED_MODEL}: time to first token is dominated by queueing",
)

# ITL: 97 % in (25, 50] ms, 3 % in (0.75, 1] s -> 3 % of the gaps above the 0.5 s tail
# bound, while 3.2k prompt tokens/s are prefilled in 2k-token steps: decode's long tail next
# to prefill.
PREFILL_TAIL = {
    "itl": Dist({0.05: 0.97, 1.0: 0.03}, 0.0589),
    "prompt_tokens": Dist({5000: 1.0}, 1600),
    "step_tokens": Dist({2048: 1.0}, 2048),
}

# ---------------------------------------------------------------------------------------
# InferenceQueuedWhileIdle


def queued_while_idle_on_a(idle_percent: int, waiting: int) -> dict:
    """InferenceQueuedWhileIdle on replica A, idle ``idle_percent`` % of the window."""
    return instance_alert(
        "InferenceQueuedWhileIdle",
        A,
        "warning",
        "any",
        "scheduling",
        f"Requests for {SERVED_MODEL} waited while the GPU (or, without NVML, the engine) sat idle "
        f"{idle_percent}% of the last 5m (threshold 10 %); queue depth now {waiting}. The "
        "scheduler or the CPU is not feeding the accelerator.",
        f"Requests wait while the accelerator idles on {A}",
    )


STALL = Scenario(
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
    file="scheduling.yaml",
    place=1,
    fires={
        "InferenceQueuedWhileIdle": [queued_while_idle_on_a(50, 12)],
        "InferenceQueueingDelay": [FLEET_QUEUEING],
    },
    silent=("InferenceGPUUnderutilized", "InferencePrefillBottleneck"),
)
HIDDEN_STALL = Scenario(
    # A stalled engine core does not take requests in, so vLLM's queue timer has not
    # started: after the stall TTFT is high (p95 4.875 s) with only 0.1 s queued, which
    # looks prefill-bound. Streams cut by the stall show long token gaps (3 % above the
    # tail bound) while the backlog is prefilled, which looks like prefill stalling
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
    file="scheduling.yaml",
    place=2,
    fires={"InferenceQueuedWhileIdle": [queued_while_idle_on_a(30, 0)]},
    silent=("InferencePrefillBottleneck", "InferencePrefillStallsDecode"),
)
STALL_NEAR_MISS = Scenario(
    # Near miss: 3 s of stalls every minute is 5 %: a hiccup, under the 10 % threshold.
    "stall near miss: brief hiccups",
    (healthy(A, queued_while_idle_share=0.05),),
    file="scheduling.yaml",
    place=3,
    fires={},
    silent=("InferenceQueuedWhileIdle",),
)

QUEUED_WHILE_IDLE = Alert(
    name="InferenceQueuedWhileIdle",
    order=2,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="scheduling",
    explains=(
        "InferenceQueueingDelay",
        "InferenceGPUUnderutilized",
        "InferencePrefillStallsDecode",
        *USERS_SEE,
    ),
    for_default="1m",
    summary="Requests wait while the accelerator idles on {{ $labels.instance }}",
    description="Requests for {{ $labels.model }} waited while the GPU (or, without NVML, the "
    "engine) sat idle {{ $value | humanizePercentage }} of the last %(window)s "
    "(threshold %(pct.queued_while_idle_ratio)s); queue depth now "
    + value_of("inferwatch_requests_waiting", INSTANCE, PLAIN_NUMBER)
    + ". The scheduler or the CPU is not feeding the accelerator.",
    when=(Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),),
    evidence=(
        f"In the engine's trace the steps ({STEP_SPAN} spans) stop: gaps between consecutive "
        "steps as long as the stall, while `server-metrics-before.txt` shows requests "
        "waiting. In a real capture of a vLLM engine paused 2 s at a time "
        "(tests/test_capture_real.py) the longest gap between steps is 2.00 s. A fully hung "
        "engine takes the profiler's start call only when it runs again: the manifest says "
        "how long the call waited, and then the stacks are the evidence. `stacks-dump.txt` "
        "shows where each of the server's "
        "processes was at the trigger: an engine thread in a collective, a lock or a "
        "`recv` is the stall; the API server busy in tokenization is the CPU side."
    ),
    scenarios=(STALL, HIDDEN_STALL, STALL_NEAR_MISS),
)

# ---------------------------------------------------------------------------------------
# InferenceQueueingDelay


def overloaded(deferred: float | None) -> tuple:
    """OVERLOAD's replicas, the share ``deferred`` of their waiting requests held back by
    other than capacity at every sample: the same share whichever samples a window holds
    (promtool may read a description's recorded share one evaluation apart)."""
    waiting = (28, 31, 35, 30)
    return tuple(
        healthy(
            i,
            ttft=Dist({7.5: 1.0}, 6.0),
            queue=Dist({5.0: 1.0}, 4.5),
            itl=Dist({0.075: 1.0}, 0.06),
            running=(16,),
            waiting=waiting,
            deferred=None if deferred is None else tuple(w * deferred for w in waiting),
        )
        for i in (A, B)
    )


OVERLOAD = Scenario(
    # TTFT in (5, 7.5] -> p95 7.375 s, 4.5 s of a 6 s mean spent queued: capacity.
    "pure overload: queueing, not prefill",
    overloaded(None),
    file="phase.yaml",
    place=4,
    fires={"InferenceQueueingDelay": [FLEET_QUEUEING]},
    silent=(
        "InferencePrefillBottleneck",
        "InferenceDecodeBottleneck",
        "InferenceQueuedWhileIdle",
    ),
)

DEFERRED_SHARE = "model:inferwatch_requests_deferred:share_%(w)s"


DEFERRED = Scenario(
    # The same queue, but 77 % of it waits on a grammar or a KV transfer.
    "deferred, not capacity: the queue waits on something else",
    overloaded(0.77),
    file="scheduling.yaml",
    place=5,
    fires={},
    silent=("InferenceQueueingDelay",),
)
DEFERRED_NEAR_MISS = Scenario(
    # 30 % deferred: most of the queue is capacity's.
    "deferred near miss: most of the queue waits for capacity",
    overloaded(0.3),
    file="scheduling.yaml",
    place=6,
    fires={
        "InferenceQueueingDelay": [
            model_alert(
                "InferenceQueueingDelay",
                "info",
                "prefill",
                "scheduling",
                f"TTFT p95 of {SERVED_MODEL} across replicas is 7.375s (threshold 2s) and "
                "requests spend 75% of their mean TTFT waiting to be scheduled (of the waiting "
                "requests, 30% were held back by other than capacity): the fleet lacks "
                "capacity.",
                f"{SERVED_MODEL}: time to first token is dominated by queueing",
            )
        ]
    },
)

QUEUEING_DELAY = Alert(
    name="InferenceQueueingDelay",
    order=3,
    severity="warning",
    level=MODEL,
    phase="prefill",
    layer="scheduling",
    explains=USERS_SEE,
    for_default="5m",
    summary="{{ $labels.model }}: time to first token is dominated by queueing",
    description="TTFT p95 of {{ $labels.model }} across replicas is "
    "{{ $value | humanizeDuration }} (threshold %(t.ttft_p95_seconds)ss) and requests spend "
    + value_of(f"model:inferwatch_{QUEUE}:mean_per_ttft_mean_%(w)s", MODEL, "humanizePercentage")
    + " of their mean TTFT waiting to be scheduled"
    + if_present(
        DEFERRED_SHARE,
        MODEL,
        " (of the waiting requests, "
        + value_of(DEFERRED_SHARE, MODEL, "humanizePercentage")
        + " were held back by other than capacity)",
        "",
    )
    + ": the fleet lacks capacity.",
    when=(
        Cond("model_ttft_p95", ">", "ttft_p95_seconds"),
        Cond("model_queue_share", ">", "queue_share_high"),
    ),
    # Requests that wait on a grammar, a KV transfer or an adapter, not on capacity.
    unless=(Cond("model_deferred_share", ">", "deferred_share_high"),),
    evidence=(
        f"The engine's steps ({STEP_SPAN}) run back to back with the batch full (D at "
        "`--max-num-seqs`): the queue is capacity, not a stall. Gaps between steps would "
        "point at InferenceQueuedWhileIdle's causes instead."
    ),
    scenarios=(OVERLOAD, DEFERRED, DEFERRED_NEAR_MISS),
)

# ---------------------------------------------------------------------------------------
# InferencePrefillStallsDecode

PREFILL_STALLS = Scenario(
    # ITL: 97 % in (25, 50] ms, 3 % in (0.75, 1] s -> 3 % of the gaps above the 0.5 s tail
    # bound while A prefills 3.2k prompt tokens/s in 2k-token steps. B has the same tail
    # but no prompt tokens flowing (near miss: another cause).
    "prefill stalls decode",
    (
        healthy(A, **PREFILL_TAIL),
        healthy(B, itl=PREFILL_TAIL["itl"], prompt_tokens=Dist({1: 1.0}, 0)),
    ),
    file="scheduling.yaml",
    place=4,
    fires={
        "InferencePrefillStallsDecode": [
            instance_alert(
                "InferencePrefillStallsDecode",
                A,
                "info",
                "decode",
                "scheduling",
                "3% of the gaps between tokens were longer than 0.5s over 5m (threshold 2 %; "
                "ITL p99 916.7ms, median 37.89ms) while prompts are prefilled at 3.2k tokens/s "
                "with 2.048k tokens per engine step: decode steps wait behind prefill chunks.",
                f"Prefill stalls decode on {A} ({SERVED_MODEL})",
            )
        ]
    },
    # ITL p95 (49.2 ms) stays normal: the median request is not slowed.
    silent=("InferenceDecodeBottleneck",),
)
OVERLOAD_TAIL = Scenario(
    # Overload: requests wait 4.5 s of a 6 s TTFT, and every engine step admits new
    # prompts, so decode has the same long tail as in "prefill stalls decode". The tail is
    # the queue's (capacity), not the prefill chunk size's.
    "overload: admissions stall decode",
    (healthy(A, ttft=Dist({7.5: 1.0}, 6.0), queue=Dist({5.0: 1.0}, 4.5), **PREFILL_TAIL),),
    file="memory.yaml",
    place=1,
    fires={"InferenceQueueingDelay": [FLEET_QUEUEING]},
    silent=("InferencePrefillStallsDecode",),
)
RECOMPUTATION_TAIL = Scenario(
    # Preempted requests are prefilled again: the same tail, the memory layer's cause.
    # (At 15m, sample 30, the wave of 4 KV values shows index 2: 61 %.)
    "KV pressure: recomputation stalls decode",
    (healthy(A, preemptions_per_s=0.1, **PREFILL_TAIL),),
    file="memory.yaml",
    place=2,
    fires={"InferenceKVCachePressure": [kv_pressure_on_a(61)]},
    silent=("InferencePrefillStallsDecode",),
)

PREFILL_STALLS_DECODE = Alert(
    name="InferencePrefillStallsDecode",
    order=8,
    severity="warning",
    level=INSTANCE,
    phase="decode",
    layer="scheduling",
    # Long prompts that stall the streams also make their own first token slow: the two
    # hold together, and the stall is the one that says what to change (the chunk size
    # bounds it), so the prefill bottleneck is listed under it.
    explains=("InferencePrefillBottleneck", *USERS_SEE),
    for_default="5m",
    summary="Prefill stalls decode on {{ $labels.instance }} ({{ $labels.model }})",
    description="{{ $value | humanizePercentage }} of the gaps between tokens were longer than "
    "%(t.itl_tail_bound_seconds)ss over %(window)s (threshold %(pct.itl_tail_share)s; ITL "
    "p99 "
    + value_of(f"{INSTANCE_ITL}:quantile_%(w)s{P99}", INSTANCE, "humanizeDuration")
    + ", median "
    + value_of(f"{INSTANCE_ITL}:quantile_%(w)s{P50}", INSTANCE, "humanizeDuration")
    + ") while prompts are prefilled at "
    + value_of("instance:inferwatch_prompt_tokens:%(w)s", INSTANCE)
    + " tokens/s with "
    + value_of(window_mean("inferwatch_engine_step_tokens"), INSTANCE)
    + " tokens per engine step: decode steps wait behind prefill chunks.",
    # The tail counted where the server's buckets are exact (a median interpolated in a wide
    # first bucket hides a 20x tail from a p99 / p50 ratio); most gaps stay under the bound:
    # a decode that is slow throughout is the decode bottleneck, not a tail.
    when=(
        Cond("itl_tail_share", ">", "itl_tail_share"),
        Cond("itl_tail_share", "<", 0.5),
        Cond("itl_p99", ">", "itl_p99_seconds"),
        Cond("prompt_rate", ">", "min_token_rate"),
    ),
    # A stalled engine cuts every stream for the stall's length and then prefills the
    # backlog: a long tail that prefill did not cause. Under overload every step admits
    # new prompts, and under KV pressure preempted requests are prefilled again: the
    # tail is then capacity's or memory's (QueueingDelay, KVCachePressure say what to
    # change), not the chunk size's.
    unless=(
        Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),
        Cond("queue_share", ">", "queue_share_high"),
        Cond("preemption_rate", ">", "preemptions_per_second"),
    ),
    evidence=(
        "A prefill chunk blocking decode is one step with a large `context` count among "
        "short decode-only steps: the decode requests of that step wait as long as the "
        "chunk. Its duration is the ITL spike users saw; `--max-num-batched-tokens` bounds it."
    ),
    scenarios=(PREFILL_STALLS, OVERLOAD_TAIL, RECOMPUTATION_TAIL),
)

ALERTS = (QUEUED_WHILE_IDLE, QUEUEING_DELAY, PREFILL_STALLS_DECODE)
