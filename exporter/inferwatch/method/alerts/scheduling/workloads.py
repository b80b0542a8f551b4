"""What several scheduling alerts' scenarios expect: the fleet's queueing."""

from __future__ import annotations

from inferwatch.method.scenario import (
    SERVED_MODEL,
    model_alert,
)

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
