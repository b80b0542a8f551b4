"""The fleet's signals: the router's view of the replicas it routes to (read off a sidecar
next to a router, ``--backend vllm-router`` or ``sglang-router``, one series per worker) and
how the load is spread across a model's replicas, and across the prefill and decode pools of a
disaggregated one.

The router's own page judges each of its workers (``per="worker"``: the verdict of the sidecar
next to it) and shows the router whole (its sparklines); the rest is PromQL only, as one
exporter's pages show one replica, or one router.
"""

from __future__ import annotations

from inferwatch.method.recipes import Gauge, Quantile, Rate, Ratio, Sum
from inferwatch.method.signal import INSTANCE, MODEL, NODE, Signal

# The router's mean time per answered request, and that of the replicas behind it (every
# serving replica of its namespace, by their own end-to-end histograms).
_ROUTER_MEAN = (
    "(\n  sum by (namespace, job, instance) "
    "(rate(inferwatch_router_request_duration_seconds_sum[%(window)s]))\n"
    "  / sum by (namespace, job, instance) "
    "(rate(inferwatch_router_request_duration_seconds_count[%(window)s]))\n)"
)
# No parenthesis after ``group_left``: PromQL would read it as the labels to copy.
_REPLICAS_MEAN = (
    "sum by (namespace) (rate(inferwatch_request_duration_seconds_sum[%(window)s]))\n"
    "  / sum by (namespace) (rate(inferwatch_request_duration_seconds_count[%(window)s]))"
)
_OVERHEAD = f"({_ROUTER_MEAN}\n- on (namespace) group_left\n  {_REPLICAS_MEAN})"

_OVERHEAD_SIGNALS = (
    Signal(
        name="router_overhead",
        label="router's time per request beyond its replicas' own",
        unit="seconds",
        level=NODE,
        promql=_OVERHEAD,
        local=None,
    ),
    Signal(
        name="router_overhead_share",
        label="share of the router's time per request outside the replicas",
        unit="ratio",
        level=NODE,
        promql=f"{_OVERHEAD}\n/ {_ROUTER_MEAN}",
        local=None,
    ),
)

_TRIES_TOTAL = "inferwatch_router_worker_requests_total"
_TRIES = Rate(_TRIES_TOTAL)
# A worker's failed requests (its failure outcomes, each counted as the request ends; none
# while it never failed) over its tries. Not its tries less its answers: a request still in
# flight is neither, and a worker whose requests run longer than half the window (long
# generations, or the first ones as traffic starts) would read as failing half its tries.
# The failures' series is born at the first failure, often already at ten: one born inside
# the window counts whole, where the worker's tries were counted at its start.
_FAILURES_TOTAL = "inferwatch_router_worker_failures_total"
_FAILURES = Rate(_FAILURES_TOTAL, born_beside=_TRIES_TOTAL)
_FAILURE_SHARE = Ratio(Sum((), optional=(_FAILURES,)), _TRIES)


def _rate(counter: str, whole: bool) -> str:
    """A router counter's rate per worker, or every worker added (``whole``)."""
    rate = f"rate({counter}[%(window)s])"
    return f"sum without (worker) ({rate})" if whole else rate


def _failure_share(whole: bool) -> str:
    """:data:`_FAILURE_SHARE` in PromQL, per worker or every worker added."""
    tries = f"increase({_TRIES_TOTAL}[%(window)s])"
    failed = (
        f"(\n    ({_FAILURES_TOTAL} unless {_FAILURES_TOTAL} offset %(window)s)\n"
        f"    and on (instance, job, worker) ({_TRIES_TOTAL} offset %(window)s)\n"
        f"    or increase({_FAILURES_TOTAL}[%(window)s])\n    or 0 * {tries}\n  )"
    )
    if whole:
        failed, tries = f"sum without (worker) {failed}", f"sum without (worker) ({tries})"
    return f"(\n  {failed}\n)\n/ {tries}"


# Either of a router's verdicts on a worker, 1 where it has the worker out; vllm-router's
# circuit series is born at the worker's first request.
_HEALTH_FAILED = "(1 - inferwatch_router_worker_healthy)"
_CIRCUIT_NOT_CLOSED = "(inferwatch_router_worker_circuit_state > bool 0)"

# A router's worker by its origin (``server``), as a replica's sidecar names the server it
# reads (``inferwatch_backend_info``'s ``server``: scheme://host:port).
_WORKER_ORIGIN = (
    "label_replace(\n"
    "    inferwatch_router_worker_healthy or inferwatch_router_worker_circuit_state,\n"
    '    "server", "$1", "worker", "(https?://[^/?#]+).*"\n'
    "  )"
)
# The servers that answer their sidecars, by origin. A sidecar that reads its server on
# loopback (a pod is one network namespace) names it as the router does by its own address:
# the host of its ``instance`` and the server's port.
_SERVERS_ANSWERING = (
    "label_replace(\n"
    "    label_join(\n"
    '      inferwatch_backend_info{server!=""} and on (instance, job) (inferwatch_backend_up == 1),\n'
    '      "server_at", "|", "server", "instance"\n'
    "    ),\n"
    '    "server", "$1$3$2", "server_at",\n'
    '    "(https?://)(?:localhost|127[.][0-9.]+)(:[0-9]+)?[|](.+):[0-9]+"\n'
    "  )"
)

# The router as a whole, every worker added: what the sidecar next to it draws (its verdict
# page's sparklines, :data:`inferwatch.serve.verdict.ROUTER_SERIES`).
_ROUTER_WHOLE = (
    Signal(
        name="router_request_rate",
        label="router's requests/s to its workers, tries and retries",
        unit="per_second",
        level=NODE,
        promql=_rate("inferwatch_router_worker_requests_total", whole=True),
        local=_TRIES,
    ),
    Signal(
        name="router_failure_share",
        label="router's requests to its workers that failed",
        unit="ratio",
        level=NODE,
        promql=_failure_share(whole=True),
        local=_FAILURE_SHARE,
    ),
    Signal(
        name="router_retry_rate",
        label="router's retries/s",
        unit="per_second",
        level=NODE,
        promql="rate(inferwatch_router_retries_total[%(window)s])",
        local=Rate("inferwatch_router_retries_total"),
    ),
    Signal(
        name="router_duration_p95",
        label="router's time per answered request p95",
        unit="seconds",
        level=NODE,
        promql="histogram_quantile(0.95, rate(inferwatch_router_request_duration_seconds_bucket"
        "[%(window)s]))",
        local=Quantile("router_request_duration_seconds", 0.95),
    ),
    Signal(
        name="router_workers_active",
        label="workers the router routes to",
        unit="count",
        level=NODE,
        promql="inferwatch_router_workers_active",
        local=Gauge("inferwatch_router_workers_active"),
    ),
)

ROUTER_SIGNALS = (
    Signal(
        name="router_worker_failure_share",
        label="router's requests to a worker that failed",
        unit="ratio",
        level=NODE,
        promql=_failure_share(whole=False),
        local=_FAILURE_SHARE,
        per="worker",
    ),
    Signal(
        name="router_worker_request_rate",
        label="router's requests/s to a worker",
        unit="per_second",
        level=NODE,
        promql=_rate("inferwatch_router_worker_requests_total", whole=False),
        local=_TRIES,
        per="worker",
    ),
    Signal(
        name="router_worker_circuit_state",
        label="router's circuit breaker for a worker (0 closed, 1 open, 2 half-open)",
        unit="count",
        level=NODE,
        promql="inferwatch_router_worker_circuit_state",
        local=Gauge("inferwatch_router_worker_circuit_state"),
        per="worker",
    ),
    Signal(
        name="router_worker_healthy",
        label="router's health check of a worker",
        unit="count",
        level=NODE,
        promql="inferwatch_router_worker_healthy",
        local=Gauge("inferwatch_router_worker_healthy"),
        per="worker",
    ),
    Signal(
        name="router_worker_out",
        label="router has a worker out (its health check failed, or its circuit not closed)",
        unit="count",
        level=NODE,
        # In parentheses: a condition compares the signal, and ``or`` binds looser.
        promql=f"(\n  clamp_max({_HEALTH_FAILED} + {_CIRCUIT_NOT_CLOSED}, 1)\n"
        f"  or {_HEALTH_FAILED}\n  or {_CIRCUIT_NOT_CLOSED}\n)",
        local=None,
    ),
    Signal(
        name="router_worker_server_answers",
        label="the server behind a router's worker answers its own sidecar",
        unit="count",
        level=NODE,
        promql=f"0 * max without (server) (\n  {_WORKER_ORIGIN}\n  and on (server)\n"
        f"  {_SERVERS_ANSWERING}\n) + 1",
        local=None,
    ),
    *_OVERHEAD_SIGNALS,
    *_ROUTER_WHOLE,
)

# A replica's requests in flight (running and waiting) over the rate window, with its role
# in a disaggregated deployment where its sidecar knows it (``inferwatch_backend_info``).
_LOAD = (
    "(\n"
    "  (\n"
    "    sum without (engine) (avg_over_time(inferwatch_requests_running[%(window)s]))\n"
    "    + sum without (engine) (avg_over_time(inferwatch_requests_waiting[%(window)s]))\n"
    "  )\n"
    "  * on (instance, job) group_left (role)\n"
    "  max by (instance, job, role) (inferwatch_backend_info)\n"
    ")"
)

# A replica's requests waiting over the rate window, with its role (as :data:`_LOAD`).
_WAITING = (
    "(\n"
    "  sum without (engine) (avg_over_time(inferwatch_requests_waiting[%(window)s]))\n"
    "  * on (instance, job) group_left (role)\n"
    "  max by (instance, job, role) (inferwatch_backend_info)\n"
    ")"
)

# A disaggregated model's two pools: its replicas of one role, prefill or decode (a replica of
# role ``both`` serves either and is in neither), as their sidecars label them. Recorded per
# pool: the share of the pool's measured capacity in use, and the replicas its traffic needs
# at full capacity.
POOL_ROLE = 'max by (instance, job, role) (inferwatch_backend_info{role=~"prefill|decode"})'
POOL_CAPACITY_USE = "role:inferwatch_requests_finished:capacity_share_%(w)s"
POOL_REPLICAS_NEEDED = "role:inferwatch_replicas_needed:%(w)s"

# The fleet's view of its replicas: how the load is spread across a model's replicas of one
# role (its replicas share the fleet labels, ``alerting.fleet_labels``, and the role: a
# prefill instance is not compared with a decode one).
FLEET_SIGNALS = (
    Signal(
        name="in_flight",
        label="requests in flight (running and waiting)",
        unit="count",
        level=INSTANCE,
        promql=_LOAD,
        local=None,
    ),
    # Against at least one request: an idle replica makes the factor the hot one's load. The
    # role only chooses what is compared: the factor is the replica's, as its other signals.
    Signal(
        name="load_over_least_loaded",
        label="requests in flight, times the least loaded replica's (at least one)",
        unit="count",
        level=INSTANCE,
        promql=f"max without (role) (\n{_LOAD}\n/ on (%(fleet)s, role) group_left\n"
        f"clamp_min(min by (%(fleet)s, role) {_LOAD}, 1)\n)",
        local=None,
    ),
    # On each replica's series, the fewest requests waiting on any replica of its model and
    # role: under one, some replica has room; every replica queueing is the fleet's capacity.
    Signal(
        name="least_waiting",
        label="requests waiting on the least queued replica of the model",
        unit="count",
        level=INSTANCE,
        promql=f"max without (role) (\n0 * {_WAITING}\n+ on (%(fleet)s, role) group_left\n"
        f"min by (%(fleet)s, role) {_WAITING}\n)",
        local=None,
    ),
    # Per pool; PromQL only, as one exporter's pages show one replica.
    Signal(
        name="pool_capacity_use",
        label="share of its pool's measured capacity in use (prefill or decode pool)",
        unit="ratio",
        level=MODEL,
        promql=POOL_CAPACITY_USE,
        local=None,
    ),
    # On each pool's series, the least used pool's share: the pool's own where the model
    # has one pool.
    Signal(
        name="least_used_pool_capacity_use",
        label="share of its capacity the model's least used pool uses",
        unit="ratio",
        level=MODEL,
        promql=f"0 * {POOL_CAPACITY_USE}\n  + on (%(fleet)s) group_left\n"
        f"  min by (%(fleet)s) ({POOL_CAPACITY_USE})",
        local=None,
    ),
)
