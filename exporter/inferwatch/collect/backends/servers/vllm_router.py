"""vLLM's router (``vllm-router`` 0.1, a Rust binary on PyPI) in front of vLLM replicas, read
on its metrics port (``--prometheus-port``, 29000 by default: ``/metrics`` on its main port
is a replica's page passed through). Sample (0.1.17, a replica down, its circuit open)::

    vllm_router_processed_requests_total{worker="http://127.0.0.1:18102"} 39
    vllm_router_cb_state{worker="http://127.0.0.1:18102"} 1

becomes::

    inferwatch_router_worker_requests_total{backend="vllm-router",model="unknown",worker="http://127.0.0.1:18102"} 39.0
    inferwatch_router_worker_circuit_state{backend="vllm-router",model="unknown",worker="http://127.0.0.1:18102"} 1.0

No series names the model: it reads ``unknown``. A worker's failure outcomes appear at its
first failure, often already at ten (the circuit opens on the tenth in a row): Prometheus
sees no increase in a series born at ten, so the router's signals read the failures as its
tries less its successes (both counted from the worker's first request). ``requests_total`` and
``generate_duration_seconds`` count only the requests answered: with ``--disable-retries``
the ones that failed are in neither, only in the workers' failure outcomes and in
``retries_exhausted_total``. Absent: responses by status (the page has none), everything an
engine measures.
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import Source, feed

VLLM_ROUTER = Backend(
    name="vllm-router",
    signature=("vllm_router_",),
    labels={"worker": "worker", "policy": "policy"},
    serves_inference=False,
    feeds=(
        feed("router_worker_requests", "vllm_router_processed_requests_total"),
        feed(
            "router_worker_successes",
            Source("vllm_router_cb_outcomes_total", where={"outcome": "success"}),
        ),
        feed(
            "router_worker_failures",
            Source("vllm_router_cb_outcomes_total", where={"outcome": "failure"}),
        ),
        feed("router_policy_decisions", "vllm_router_policy_decisions_total"),
        feed("router_worker_healthy", "vllm_router_worker_health"),
        feed("router_worker_circuit_state", "vllm_router_cb_state"),
        feed("router_workers_active", "vllm_router_active_workers"),
        feed("router_retries", "vllm_router_retries_total"),
        feed("router_retries_exhausted", "vllm_router_retries_exhausted_total"),
        feed("router_request_duration_seconds", "vllm_router_generate_duration_seconds"),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = VLLM_ROUTER
