"""SGLang's router (``sglang-router`` 0.3, the Rust model gateway: families ``smg_*``) in
front of replicas, read on its metrics port (``--prometheus-port``). Sample (0.3.2)::

    smg_worker_health{worker="http://127.0.0.1:18101"} 1
    smg_http_responses_total{status_code="200",error_code=""} 10

becomes::

    inferwatch_router_worker_healthy{backend="sglang-router",model="unknown",worker="http://127.0.0.1:18101"} 1.0
    inferwatch_router_responses_total{backend="sglang-router",model="unknown",status="2xx"} 10.0

A worker's requests are its circuit breaker's outcomes, successes and failures added. No
series names both a worker and a model: the model reads ``unknown``. Absent:
the policy's choices by worker (``smg_worker_selection_total`` counts them by model),
retries (none on a page without them), everything an engine measures.
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import Source, feed

SGLANG_ROUTER = Backend(
    name="sglang-router",
    signature=("smg_",),
    labels={"worker": "worker"},
    serves_inference=False,
    feeds=(
        feed("router_worker_requests", "smg_worker_cb_outcomes_total"),
        feed(
            "router_worker_successes",
            Source("smg_worker_cb_outcomes_total", where={"outcome": "success"}),
        ),
        feed(
            "router_worker_failures",
            Source("smg_worker_cb_outcomes_total", where={"outcome": "failure"}),
        ),
        feed("router_worker_healthy", "smg_worker_health"),
        feed("router_worker_circuit_state", "smg_worker_cb_state"),
        feed(
            "router_workers_active",
            Source("smg_worker_pool_size", where={"worker_type": "regular"}),
        ),
        feed("router_retries", "smg_router_retries_total"),
        feed("router_request_duration_seconds", "smg_router_request_duration_seconds"),
        feed(
            "router_responses", Source("smg_http_responses_total", labels={"status_code": "status"})
        ),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = SGLANG_ROUTER
