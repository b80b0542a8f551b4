"""InferenceKVCacheGaugeFrozen: a KV-cache gauge stuck high with nothing running."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.memory.kv_cache_pressure import kv_pressure_on_a
from inferwatch.method.scenario import (
    A,
    B,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE

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
        "InferenceKVCacheGaugeFrozen": [instance_alert(A, value=0.99)],
        "InferenceKVCachePressure": [kv_pressure_on_a(kv_usage=0.99, preempted=0)],
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

ALERTS = (KV_CACHE_GAUGE_FROZEN,)
