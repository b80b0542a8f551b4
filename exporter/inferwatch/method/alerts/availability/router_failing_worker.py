"""InferenceRouterFailingWorker: the router keeps sending requests to a replica that fails
them, before its own health check notices."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.scenario import (
    ROUTER,
    A,
    Replica,
    Router,
    Scenario,
    Worker,
    healthy,
    worker_alert,
)
from inferwatch.method.signals import INSTANCE

UP, DEAD = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def router(dead: Worker) -> tuple[Router, Replica]:
    """The router in front of a healthy replica A and ``dead``, whose sidecar is gone with it."""
    return (Router(ROUTER, (Worker(UP), dead)), healthy(A))


STILL_ROUTED = Scenario(
    # The replica behind DEAD is killed: 90 % of what the router sends it fails (retries
    # on UP hide it from clients), while the health check, every 60 s and 3 misses, still
    # passes it and the circuit has not opened.
    "router keeps routing to a dead replica",
    router(Worker(DEAD, requests_per_s=1.0, failures_per_s=0.9)),
    file="availability.yaml",
    place=12,
    fires={"InferenceRouterFailingWorker": [worker_alert(DEAD, value=0.9)]},
)
NOTICED = Scenario(
    # The same failures once the health check has failed the replica: the router has taken
    # it out, nothing more to page about here (its own sidecar says why it is down).
    "router has failed the dead replica itself",
    router(Worker(DEAD, requests_per_s=1.0, failures_per_s=0.9, healthy="0x40")),
    file="availability.yaml",
    place=13,
    fires={},
    silent=("InferenceRouterFailingWorker",),
)
NEAR_MISS = Scenario(
    # Near miss: a replica failing 10 % of its requests is its own errors' business.
    "router near miss: a replica fails a few requests",
    router(Worker(DEAD, requests_per_s=1.0, failures_per_s=0.1)),
    file="availability.yaml",
    place=14,
    fires={},
    silent=("InferenceRouterFailingWorker",),
)

ROUTER_FAILING_WORKER = Alert(
    name="InferenceRouterFailingWorker",
    order=23,
    severity="critical",
    level=INSTANCE,
    phase="any",
    layer="availability",
    for_default="1m",
    outside_the_slis=True,
    summary="The router keeps sending requests to failing replica {{ $labels.worker }}",
    description="{{ $value | humanizePercentage }} of the requests the router behind "
    "{{ $labels.instance }} sent to {{ $labels.worker }} failed over the last %(window)s "
    "(threshold %(pct.router_worker_failure_share)s) while its health check still passes "
    "it: the router keeps routing to a replica that is down or broken. Retries hide it from "
    "clients until they run out; the replica's server never counts these requests.",
    when=(
        Cond("router_worker_failure_share", ">", "router_worker_failure_share"),
        Cond("router_worker_healthy", "==", 1),
    ),
    scenarios=(STILL_ROUTED, NOTICED, NEAR_MISS),
)

ALERTS = (ROUTER_FAILING_WORKER,)
