"""InferenceQueueingDelay: the fleet's first tokens wait for capacity."""

from __future__ import annotations

from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    if_present,
    value_of,
)
from inferwatch.method.alerts.scheduling.workloads import FLEET_QUEUEING
from inferwatch.method.scenario import (
    A,
    B,
    Dist,
    Scenario,
    healthy,
    model_alert,
)
from inferwatch.method.signals import MODEL, QUEUE


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
        # The queue's share of the mean TTFT; of the waiting requests, 30 % deferred.
        "InferenceQueueingDelay": [model_alert(value=7.375, queries=(0.75, 0.3))]
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
    first_token_waits_in="queue",
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

ALERTS = (QUEUEING_DELAY,)
