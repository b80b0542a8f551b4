"""The "Inference fleet" dashboard: per-model and per-instance drill-down across replicas.

One function per row: ``_models_row`` (the top row, without a header) and
``_instances_row`` ("Instances"). The latency and error series are the method's per-model and
per-instance recording rules (``inferwatch.method.recording``).
"""

from __future__ import annotations

from inferwatch.dashboards.queries import (
    GPU_ONLY,
    MODEL,
    NODE,
    TARGET,
    TRIAGE_UID,
    PanelSpec,
    Query,
    Row,
    limit,
    series,
)
from inferwatch.dashboards.router import router_panels
from inferwatch.method.router_signals import POOL_CAPACITY_USE
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel

# The quantile label of the recorded p95 series.
Q95 = 'quantile="0.95"'


def fleet_panels(spec: Spec) -> list[Row]:
    """(row title, panels) in order; the first row has no header."""
    return [
        (None, _models_row(spec)),
        ("Instances", _instances_row(spec)),
        ("Router: which replica, as the router sees it", router_panels(spec)),
    ]


def _models_row(spec: Spec) -> list[PanelSpec]:
    """The row without a header: one table row per model, then TTFT, ITL and errors by model."""
    rate = spec.rate_name
    return [
        _models_table(spec),
        PanelSpec(
            "TTFT p95 by model",
            "Time to first token p95 per model across replicas. Compare with its threshold "
            f"({spec.threshold('ttft_p95_seconds'):g} s).",
            [
                Query(
                    f"model:inferwatch_time_to_first_token_seconds:quantile_{rate}{{{MODEL}, {Q95}}}",
                    "{{model}} {{cluster}}",
                )
            ],
            unit="s",
            width=8,
            thresholds=limit(spec.threshold("ttft_p95_seconds")),
        ),
        PanelSpec(
            "ITL p95 by model",
            "Inter-token latency p95 per model across replicas. Compare with its threshold "
            f"({spec.threshold('itl_p95_seconds'):g} s).",
            [
                Query(
                    f"model:inferwatch_inter_token_latency_seconds:quantile_{rate}{{{MODEL}, {Q95}}}",
                    "{{model}} {{cluster}}",
                )
            ],
            unit="s",
            width=8,
            thresholds=limit(spec.threshold("itl_p95_seconds")),
        ),
        PanelSpec(
            "Server errors and aborts by model",
            "Share of finished requests that ended in a server error (the server's fault, "
            f"InferenceRequestErrors above {spec.threshold('error_ratio') * 100:g} %) and share that "
            "clients aborted (cancelled or timed out, often because the server was slow).",
            [
                Query(
                    f"model:inferwatch_requests_finished:error_ratio_{rate}{{{MODEL}}}",
                    "errors {{model}} {{cluster}}",
                ),
                Query(
                    f"model:inferwatch_requests_finished:abort_ratio_{rate}{{{MODEL}}}",
                    "aborts {{model}} {{cluster}}",
                ),
            ],
            unit="percentunit",
            width=8,
            thresholds=limit(spec.threshold("error_ratio")),
        ),
    ]


def _models_table(spec: Spec) -> PanelSpec:
    """Models row, the table: traffic, latency and error shares of each model, sortable."""
    rate = spec.rate_name
    # A model across its replicas: the labels the model: rules keep (namespace, backend,
    # model and the config's fleet_labels).
    by = f"by ({', '.join(spec.fleet_labels)})"
    return PanelSpec(
        "Models",
        "One row per model across its replicas: traffic, TTFT and ITL p95, the share of "
        "requests ending in a server error and the share clients aborted. Sort by a column "
        "to find the model in trouble.",
        [
            _column(
                f"sum {by} (model:inferwatch_requests_finished:{rate}{{{MODEL}}})",
                "req/s",
                "reqps",
            ),
            _column(
                f"max {by} (model:inferwatch_time_to_first_token_seconds:quantile_{rate}{{{MODEL}, {Q95}}})",
                "TTFT p95",
                "s",
            ),
            _column(
                f"max {by} (model:inferwatch_inter_token_latency_seconds:quantile_{rate}{{{MODEL}, {Q95}}})",
                "ITL p95",
                "s",
            ),
            _column(
                f"max {by} (model:inferwatch_requests_finished:error_ratio_{rate}{{{MODEL}}})",
                "server error share",
                "percentunit",
            ),
            _column(
                f"max {by} (model:inferwatch_requests_finished:abort_ratio_{rate}{{{MODEL}}})",
                "abort share",
                "percentunit",
            ),
            _column(
                f"count {by} ({series('backend_info', MODEL)})",
                "instances",
                "none",
            ),
        ],
        kind="table",
        width=24,
        height=7,
    )


def _column(expr: str, legend: str, unit: str) -> Query:
    """One column of the models table: an instant query in ``unit``."""
    return Query(expr, legend, instant=True, table=True, unit=unit)


def _instances_row(spec: Spec) -> list[PanelSpec]:
    """Instances: one series per replica, to find the odd one out; each series opens the
    triage dashboard for its instance."""
    return [*_instances_health(spec), *_instances_load(spec), _pools(spec)]


def _instances_health(spec: Spec) -> list[PanelSpec]:
    """Instances row, how each replica serves: up, TTFT and ITL p95."""
    rate = spec.rate_name
    return [
        PanelSpec(
            "Backend up by instance",
            "1 when the sidecar can read its server's /metrics. A 0 is InferenceBackendDown.",
            [Query(series("backend_up", f'backend=~"$backend", {NODE}'), "{{instance}}")],
            unit="bool_yes_no",
            width=8,
            drilldown=TRIAGE_UID,
        ),
        PanelSpec(
            "TTFT p95 by instance",
            "One replica far above the others points at a local cause (hardware, a bad node, "
            "its own configuration); all of them high points at load or the workload.",
            [
                Query(
                    f"instance:inferwatch_time_to_first_token_seconds:quantile_{rate}{{{TARGET}, {Q95}}}",
                    "{{instance}}",
                )
            ],
            unit="s",
            width=8,
            drilldown=TRIAGE_UID,
        ),
        PanelSpec(
            "ITL p95 by instance",
            "Per-replica inter-token latency p95: a slow replica on an otherwise healthy fleet "
            "has a local decode problem (GPU, throttling, batch).",
            [
                Query(
                    f"instance:inferwatch_inter_token_latency_seconds:quantile_{rate}{{{TARGET}, {Q95}}}",
                    "{{instance}}",
                )
            ],
            unit="s",
            width=8,
            drilldown=TRIAGE_UID,
        ),
    ]


def _instances_load(spec: Spec) -> list[PanelSpec]:
    """Instances row, the load on each replica: in flight and queued (a row per replica, to
    read a thousand of them), KV cache, GPU busy."""
    running = f"sum by (instance) ({series('requests_running')})"
    waiting = f"sum by (instance) ({series('requests_waiting')})"
    # Each replica's role where its sidecar knows it, its rows next to its role's.
    roles = f"max by (instance, role) ({series('backend_info')})"
    in_flight = f"sum by (role, instance) (({running} + {waiting}) * on (instance) group_left (role) {roles})"
    return [
        PanelSpec(
            "Requests in flight by instance",
            "Running and waiting requests, a row per replica. One hot row while the others "
            "stay pale: the router's policy or an affinity sends it the load "
            "(InferenceReplicaImbalance). Every row hot at once: the fleet is at capacity. In a "
            "disaggregated deployment the rows are grouped by role (prefill, decode): compare a "
            "row with its role's.",
            [Query(in_flight, "{{role}} {{instance}}")],
            kind="heatmap",
            width=12,
        ),
        PanelSpec(
            "Queue depth by instance",
            "Waiting requests, a row per replica. A queue on one replica while another has none "
            "means the load is not spread; queues everywhere, that there is too little capacity.",
            [Query(waiting, "{{instance}}")],
            kind="heatmap",
            width=12,
        ),
        PanelSpec(
            "KV cache by instance",
            "Highest KV-cache use per replica. One replica pinned at 100 % while the others have "
            "room: its requests are longer, or the balancer sends it more.",
            [
                Query(
                    f"max by (instance) ({series('kv_cache_usage_ratio')})",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            width=8,
            drilldown=TRIAGE_UID,
        ),
        PanelSpec(
            "GPU busy by instance",
            "GPU-only. Mean GPU busy share per replica; an idle replica with a queue is "
            "queued-while-idle.",
            [
                Query(
                    f"instance:inferwatch_gpu_busy_seconds:avg_{spec.rate_name}{{{NODE}}}",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            width=8,
            drilldown=TRIAGE_UID,
            no_value=GPU_ONLY,
        ),
    ]


def _pools(spec: Spec) -> PanelSpec:
    """A disaggregated model's prefill and decode pools against their measured capacities."""
    return PanelSpec(
        Panel.POOL_CAPACITY_USE,
        "A disaggregated model's prefill and decode pools, each against the capacity its "
        "replicas' baselines measured. One pool above the "
        f"{spec.threshold('capacity_use_high') * 100:g} % line while the other stays under "
        f"{spec.threshold('pool_capacity_use_low') * 100:g} %: the split between the pools "
        "is wrong, not the fleet's size (InferencePrefillDecodeImbalance; the replicas each "
        "pool needs: `role:inferwatch_replicas_needed`).",
        [
            Query(
                f"{POOL_CAPACITY_USE % {'w': spec.rate_name}}{{{MODEL}}}",
                "{{role}} {{model}} {{cluster}}",
            )
        ],
        unit="percentunit",
        width=24,
        thresholds=limit(spec.threshold("capacity_use_high")),
        no_value="no pools: no replica's sidecar reports a prefill or decode role with a "
        "baseline capacity",
    )
