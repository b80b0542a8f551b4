"""InferenceBackendDown: a server whose /metrics the sidecar cannot read."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import value_of
from inferwatch.method.scenario import (
    A,
    B,
    Expected,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE


def backend_down(instance: str, *, took: float) -> Expected:
    """InferenceBackendDown for ``instance``, its last scrape attempt having taken ``took``
    seconds."""
    return instance_alert(instance, model=None, queries=(took,))


DOWN = Scenario(
    # A's backend stops answering at 5m; B misses a single scrape (near miss).
    "backend down",
    (
        healthy(A, backend_up="1x10 0x30", scrape_duration="0.004x10 2x30"),
        healthy(B, backend_up="1x10 0 1x29"),
    ),
    file="availability.yaml",
    place=1,
    fires={"InferenceBackendDown": [backend_down(A, took=2)]},
)

BACKEND_DOWN = Alert(
    name="InferenceBackendDown",
    order=1,
    severity="critical",
    level=INSTANCE,
    phase="any",
    layer="availability",
    for_default="1m",
    summary="Inference backend on {{ $labels.instance }} cannot be scraped",
    description="inferwatch on {{ $labels.instance }} has not been able to read the "
    '{{ or $labels.backend "inference" }} server\'s /metrics (or the sidecar itself '
    "is down) for %(for)s; its last scrape attempt took "
    + value_of(
        "inferwatch_backend_scrape_duration_seconds",
        INSTANCE,
        "humanizeDuration",
        match_model=False,
    )
    + " (the sidecar's log names the cause). Latency alerts of this pod are inhibited "
    "meanwhile.",
    any_of=(Cond("backend_up", "==", 0), Cond("exporter_up", "==", 0)),
    outside_the_slis=True,
    scenarios=(DOWN,),
)

ALERTS = (BACKEND_DOWN,)
