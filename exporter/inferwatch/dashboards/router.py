"""The fleet dashboard's "Router" row: what the router in front of the replicas says about
each of them (a sidecar next to it, ``--backend vllm-router`` or ``sglang-router``).

Per worker: the requests sent and failed, the router's health check and circuit breaker;
then the retries that hide a dead replica from clients, and the router's own duration.
Every panel shows "no router" where no sidecar reads one (``ROUTER_PANELS``).
"""

from __future__ import annotations

from inferwatch.dashboards.queries import (
    NO_ROUTER,
    PLACE,
    PanelSpec,
    Query,
    quantiles,
    series,
)
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel


def router_panels(spec: Spec) -> list[PanelSpec]:
    """The row's panels: each worker as the router sees it, then what its clients see; rates
    over the rules' window, as the router's alerts read them."""
    window = spec.timing.window
    sent = f"rate({series('router_worker_requests', PLACE)}[{window}])"
    # The tries less the successes, as the alerts read them: the failures' own series is
    # born at a worker's first failure, often already at ten, and no rate sees that.
    answered = f"rate({series('router_worker_successes', PLACE)}[{window}])"
    failed = f"{sent} - ({answered} or 0 * {sent})"
    retries = f"rate({series('router_retries', PLACE)}[{window}])"
    exhausted = f"rate({series('router_retries_exhausted', PLACE)}[{window}])"
    return [
        PanelSpec(
            Panel.ROUTER_REQUESTS,
            "Requests per second the router sends each worker, and those that fail. One worker "
            "far above the others: the policy or an affinity sends it the load. Failures on one "
            "worker while its health still reads 1: the router keeps routing to a dead replica.",
            [
                Query(f"sum by (worker) ({sent})", "sent {{worker}}"),
                Query(f"sum by (worker) ({failed})", "failed {{worker}}"),
            ],
            unit="reqps",
            no_value=NO_ROUTER,
        ),
        PanelSpec(
            Panel.ROUTER_WORKERS,
            "The router's view of each worker: its health check (1 passes) and its circuit "
            "breaker (0 closed, 1 open: nothing sent, 2 half-open). The health check fails a "
            "dead replica only after several misses, minutes after its requests began to fail.",
            [
                Query(
                    f"min by (worker) ({series('router_worker_healthy', PLACE)})",
                    "healthy {{worker}}",
                ),
                Query(
                    f"max by (worker) ({series('router_worker_circuit_state', PLACE)})",
                    "circuit {{worker}}",
                ),
            ],
            no_value=NO_ROUTER,
        ),
        PanelSpec(
            Panel.ROUTER_RETRIES,
            "Requests the router retried on another worker, and those that failed every try "
            "(the client got the error). Retries rising with no client error: a replica fails "
            "and the others absorb it.",
            [Query(f"sum({retries})", "retried"), Query(f"sum({exhausted})", "failed every try")],
            unit="reqps",
            no_value=NO_ROUTER,
        ),
        PanelSpec(
            Panel.ROUTER_DURATION,
            "The router's time per answered request, tries and backoffs included. Well above "
            "the replicas' own end-to-end latency: the hop, the retries or the router itself.",
            quantiles("router_request_duration_seconds", window, "router", PLACE),
            unit="s",
            no_value=NO_ROUTER,
        ),
    ]
