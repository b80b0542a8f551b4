"""InferenceKVCachePressure: a full KV cache (or token budget) and preempted requests."""

from __future__ import annotations

from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    PLAIN_NUMBER,
    TOKEN_BUDGET_USE,
    if_present,
    value_of,
)
from inferwatch.method.scenario import (
    A,
    B,
    Expected,
    Scenario,
    healthy,
    instance_alert,
    tgi,
)
from inferwatch.method.signals import INSTANCE


def kv_pressure_on_a(*, kv_usage: float, preempted: float = 0.1) -> Expected:
    """InferenceKVCachePressure on replica A (a server without a token budget), preempting
    ``preempted`` requests/s, its KV-cache use now ``kv_usage`` (the wave of KV values at
    15m, sample 30)."""
    return instance_alert(A, queries=(None, kv_usage, preempted))


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
    fires={"InferenceKVCachePressure": [kv_pressure_on_a(kv_usage=0.99)]},
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
        # The token budget (in use 97.55 % over the window) and 5 requests waiting.
        "InferenceKVCachePressure": [instance_alert(A, backend="tgi", queries=(2048, 0.9755, 5))]
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
    # No place a slow first token waits: a request waits in the queue for blocks, and one
    # preempted before its first token is computed again inside its prefill time.
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

ALERTS = (KV_CACHE_PRESSURE,)
