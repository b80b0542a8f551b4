"""InferenceRouterExcludesLiveWorker: the router has taken out a replica whose server answers:
the other replicas carry its share."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.scenario import (
    ROUTER,
    A,
    B,
    Replica,
    Router,
    Scenario,
    Worker,
    healthy,
    instance_alert,
    worker_alert,
)
from inferwatch.method.signals import INSTANCE

# Replica A's sidecar reads its server on loopback (a pod is one network namespace); the
# router names it by the pod's address. Replica B's sidecar reads it as the router does.
WORKER_A, WORKER_B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
REPLICAS = (
    healthy(A, server="http://127.0.0.1:8000"),
    healthy(B, server=WORKER_B, running=(1,), waiting=(0,)),
)


def fleet(b: Worker, replicas: tuple[Replica, ...] = REPLICAS) -> tuple[Router | Replica, ...]:
    """The router in front of replica A (in rotation) and ``b``, and the replicas' sidecars."""
    return (Router(ROUTER, (Worker(WORKER_A), b)), *replicas)


HEALTH_FAILED = Scenario(
    # The router's health check failed replica B (a /health that times out under load, a
    # wrong path) while B's server answers its sidecar: the router sends B nothing.
    "router fails the health check of a replica that answers",
    fleet(Worker(WORKER_B, requests_per_s=0.0, healthy="0x40")),
    file="scheduling.yaml",
    place=10,
    fires={"InferenceRouterExcludesLiveWorker": [worker_alert(WORKER_B, value=1)]},
)
CIRCUIT_OPEN = Scenario(
    # B's circuit stays open, its health check passing: the same, by the circuit breaker.
    # The router names B with a trailing slash; A's server, read on loopback, is found too.
    "router holds the circuit of a replica that answers open",
    (
        Router(
            ROUTER, (Worker(WORKER_A, circuit="1x40"), Worker(WORKER_B + "/", requests_per_s=0))
        ),
        *REPLICAS,
    ),
    file="scheduling.yaml",
    place=11,
    fires={"InferenceRouterExcludesLiveWorker": [worker_alert(WORKER_A, value=1)]},
)
SERVER_DOWN = Scenario(
    # Near miss: the router took B out because B's server is down (its sidecar says so):
    # the router is right, and B's own InferenceBackendDown says why.
    "router excludes live worker near miss: the replica's server is down",
    fleet(
        Worker(WORKER_B, requests_per_s=0.0, healthy="0x40"),
        (REPLICAS[0], healthy(B, server=WORKER_B, backend_up="0x40", running=(0,), waiting=(0,))),
    ),
    file="scheduling.yaml",
    place=12,
    # B's own InferenceBackendDown, its scrapes failing in 4 ms.
    fires={"InferenceBackendDown": [instance_alert(B, model=None, queries=(0.004,))]},
    silent=("InferenceRouterExcludesLiveWorker",),
)

ROUTER_EXCLUDES_LIVE_WORKER = Alert(
    name="InferenceRouterExcludesLiveWorker",
    order=28,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="scheduling",
    for_default="5m",
    summary="The router has taken out {{ $labels.worker }}, whose server answers",
    description="The router behind {{ $labels.instance }} has held {{ $labels.worker }} out "
    "for %(for)s (out: {{ $value }}; its health check fails that worker, or its circuit "
    "breaker is not closed) while the replica's server answers its own sidecar. The other "
    "replicas carry "
    "its share of the traffic: their queues and latency rise, and the fleet runs short of "
    "a replica it has.",
    when=(
        Cond("router_worker_out", "==", 1),
        Cond("router_worker_server_answers", "==", 1),
    ),
    scenarios=(HEALTH_FAILED, CIRCUIT_OPEN, SERVER_DOWN),
)

ALERTS = (ROUTER_EXCLUDES_LIVE_WORKER,)
