"""The router's series: what a router in front of replicas says about them (``--backend
vllm-router`` or ``sglang-router``), under the labels every backend series carries; a
worker is the replica's URL as the router names it (credentials never)."""

from __future__ import annotations

from inferwatch.metrics.definition import C, G, H, MetricDef, defs

ROUTER: dict[str, MetricDef] = defs(
    MetricDef(
        "router_worker_requests",
        C,
        "Requests the router sent to the worker, first tries and retries, answered or not.",
        ("worker",),
    ),
    MetricDef(
        "router_worker_successes",
        C,
        "Requests to the worker that succeeded (its circuit breaker's success outcomes).",
        ("worker",),
    ),
    MetricDef(
        "router_worker_failures",
        C,
        "Requests to the worker that failed (its circuit breaker's failure outcomes).",
        ("worker",),
    ),
    MetricDef(
        "router_policy_decisions",
        C,
        "Requests the router's policy chose the worker for, by policy.",
        ("worker", "policy"),
    ),
    MetricDef(
        "router_worker_healthy",
        G,
        "1 while the router's health check passes the worker, 0 once it fails it.",
        ("worker",),
    ),
    MetricDef(
        "router_worker_circuit_state",
        G,
        "The worker's circuit breaker: 0 closed (requests flow), 1 open (none are sent), "
        "2 half-open (a few are tried).",
        ("worker",),
    ),
    MetricDef("router_workers_active", G, "Workers the router routes to."),
    MetricDef("router_retries", C, "Requests the router retried on another try."),
    MetricDef(
        "router_retries_exhausted",
        C,
        "Requests that failed every try: the client got the error.",
    ),
    MetricDef(
        "router_request_duration_seconds",
        H,
        "Time the router took for a request, its tries and backoffs included.",
    ),
    MetricDef(
        "router_responses",
        C,
        "Responses the router sent its clients, by status class (2xx, 4xx, 5xx).",
        ("status",),
    ),
)
