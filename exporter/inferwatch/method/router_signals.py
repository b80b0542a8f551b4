"""The router's view of the replicas it routes to: the signals read off a sidecar next to a
router (``--backend vllm-router`` or ``sglang-router``), one series per worker.

PromQL only: a router's page says nothing the exporter's own verdict judges yet.
"""

from __future__ import annotations

from inferwatch.method.signal import NODE, Signal

ROUTER_SIGNALS = (
    Signal(
        name="router_worker_failure_share",
        label="router's requests to a worker that failed",
        unit="ratio",
        level=NODE,
        promql="rate(inferwatch_router_worker_failures_total[%(window)s])\n"
        "  / rate(inferwatch_router_worker_requests_total[%(window)s])",
        local=None,
    ),
    Signal(
        name="router_worker_healthy",
        label="router's health check of a worker",
        unit="count",
        level=NODE,
        promql="inferwatch_router_worker_healthy",
        local=None,
    ),
)
