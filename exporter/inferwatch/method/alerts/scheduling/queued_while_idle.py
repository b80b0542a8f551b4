"""InferenceQueuedWhileIdle: requests wait while the engine or its GPU idles (a stall)."""

from __future__ import annotations

from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    PLAIN_NUMBER,
    value_of,
)
from inferwatch.method.alerts.scheduling.workloads import FLEET_QUEUEING
from inferwatch.method.scenario import (
    A,
    Dist,
    Expected,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE


def queued_while_idle_on_a(*, idle: float, waiting: int) -> Expected:
    """InferenceQueuedWhileIdle on replica A, idle the share ``idle`` of the window with
    ``waiting`` requests queued."""
    return instance_alert(A, value=idle, queries=(waiting,))


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
        "InferenceQueuedWhileIdle": [queued_while_idle_on_a(idle=0.5, waiting=12)],
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
    fires={"InferenceQueuedWhileIdle": [queued_while_idle_on_a(idle=0.3, waiting=0)]},
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

ALERTS = (QUEUED_WHILE_IDLE,)
