"""InferencePrefillStallsDecode: decode steps wait behind prefill chunks."""

from __future__ import annotations

from inferwatch.method.alerts.alert import USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    INSTANCE_ITL,
    P50,
    P99,
    value_of,
    window_mean,
)
from inferwatch.method.alerts.memory.kv_cache_pressure import kv_pressure_on_a
from inferwatch.method.alerts.scheduling.workloads import FLEET_QUEUEING
from inferwatch.method.scenario import (
    A,
    B,
    Dist,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE

# ITL: 97 % in (25, 50] ms, 3 % in (0.75, 1] s -> 3 % of the gaps above the 0.5 s tail
# bound, while 3.2k prompt tokens/s are prefilled in 2k-token steps: decode's long tail next
# to prefill.
PREFILL_TAIL = {
    "itl": Dist({0.05: 0.97, 1.0: 0.03}, 0.0589),
    "prompt_tokens": Dist({5000: 1.0}, 1600),
    "step_tokens": Dist({2048: 1.0}, 2048),
}


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
        # 3 % of the gaps in the tail; ITL p99 and median, prompt tokens/s, tokens per step.
        "InferencePrefillStallsDecode": [
            instance_alert(A, value=0.03, queries=(0.9167, 0.03789, 3200, 2048))
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
    fires={"InferenceKVCachePressure": [kv_pressure_on_a(kv_usage=0.61)]},
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
    # The stalled steps are the streams' decode steps: that is where their time goes.
    slow_tokens_spent_in="decode",
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

ALERTS = (PREFILL_STALLS_DECODE,)
