"""What several scheduling alerts' scenarios expect: the fleet's queueing."""

from __future__ import annotations

from inferwatch.method.scenario import (
    model_alert,
)

# Fleet TTFT p95 7.375 s with 4.5 s of a 6 s mean queued (two overloaded replicas, or one
# stalled one).
FLEET_QUEUEING = model_alert(value=7.375, queries=(0.75, None))  # the queue's share; none deferred
