"""What a panel is (``PanelSpec``, ``Query``) and the PromQL pieces every panel is built from.

Label selectors for the dashboard variables, the "no value" messages, and the helpers for
histograms: quantiles come from ``sum by (le)`` of the raw bucket rates, means from rates of
``_sum`` over rates of ``_count``, over the rules' window where a panel is read against an
alert's threshold and ``$__rate_interval`` elsewhere. Every query reads the contract's series
(named by their key in :mod:`inferwatch.metrics`, see :func:`series`) or one of the method's
recording rules (``inferwatch.method.recording``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferwatch.metrics import ALL
from inferwatch.panels import Panel

# Series labels chosen by the variables.
# namespace and cluster default to All (".*"), which also matches series without the label.
PLACE = 'namespace=~"$namespace", cluster=~"$cluster"'
TARGET = f'backend=~"$backend", model=~"$model", instance=~"$instance", {PLACE}'
MODEL = f'backend=~"$backend", model=~"$model", {PLACE}'
NODE = f'instance=~"$instance", {PLACE}'  # GPU series carry no backend/model labels

# The dashboards' uids (their URLs /d/<uid>, and the fleet's drill-down into triage).
TRIAGE_UID = "inferwatch-triage"
FLEET_UID = "inferwatch-fleet"

# inferwatch's alerts firing now for the selected model, and those without one (GPU alerts).
FIRING_ALERTS = 'ALERTS{alertstate="firing", alertname=~"Inference.*", model=~"$model|"}'

# The hardware floor of a decode step, highest among the selected instances.
DECODE_FLOOR = f"max({ALL['decode_floor_seconds'].name}{{{TARGET}}})"

# Grafana's own rate window for a panel that is not read against an alert's threshold.
RATE_INTERVAL = "$__rate_interval"

# Grafana has no token unit: a suffix.
TOKENS = "suffix: tokens"
TOKENS_PER_SECOND = "suffix: tokens/s"

NOT_PROVIDED = "not provided by this backend"
GPU_ONLY = "GPU-only: no NVML data"
NO_BASELINE = "no baseline: start inferwatch with --baseline"
NO_SLO = "no SLO data: no objectives configured, or no traffic yet"
NO_SPEC_DECODE = "no speculative decoding on this server"
NO_ROUTER = "no router: no sidecar reads one (--backend vllm-router or sglang-router)"

# The panels that need NVML (empty on machines without a GPU) and a baseline file.
GPU_ONLY_PANELS = {
    Panel.GPU_BUSY,
    Panel.GPU_BUSY_BY_GPU,
    Panel.GPU_ACTIVITY,
    Panel.GPU_MEMORY,
    Panel.GPU_CLOCKS,
    Panel.GPU_POWER,
    Panel.MEMORY_BANDWIDTH,
    Panel.LINK_SHARE,
    Panel.PCIE_THROUGHPUT,
    Panel.NVLINK_THROUGHPUT,
    "GPU busy by instance",
}
# Empty unless a sidecar reads a router.
ROUTER_PANELS = {
    Panel.ROUTER_REQUESTS,
    Panel.ROUTER_WORKERS,
    Panel.ROUTER_RETRIES,
    Panel.ROUTER_DURATION,
}
# Empty unless a model's replicas report prefill and decode roles and a baseline capacity.
POOL_PANELS = {Panel.POOL_CAPACITY_USE}
# Empty unless the server runs speculative decoding.
SPEC_DECODE_PANELS = {Panel.SPEC_DECODE}
# Empty unless the server serves LoRA adapters.
LORA_PANELS = {Panel.LORA_ADAPTERS}
# Empty unless the server times its engine steps and admits by a token budget (TGI).
STEP_TIMED_PANELS = {Panel.STEP_LATENCY, Panel.TOKEN_BUDGET}


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False
    unit: str | None = None  # where it differs from the panel's (an override on its series)


@dataclass
class PanelSpec:
    """One panel: what it shows and how healthy and unhealthy look in the method's terms."""

    title: str
    description: str
    queries: list[Query]
    unit: str = "short"
    # timeseries, stat, table, heatmap (a query without a legend returns buckets by le; with
    # one, each of its series is a row: a replica's load over time)
    kind: str = "timeseries"
    width: int = 8
    height: int = 8
    no_value: str = NOT_PROVIDED
    thresholds: list[tuple[float | None, str]] = field(default_factory=list)  # (from, color)
    stacked: bool = False
    # Each series links to this dashboard (uid) for its instance, keeping time and variables.
    drilldown: str | None = None
    # A table of ALERTS: this column (e.g. "alertname") links each row to its alert's runbook.
    runbook_column: str | None = None
    # A table's rows in the ascending order of this label's values, read as numbers.
    sort_by: str | None = None


# One dashboard row: its title (None: no row header) and its panels, left to right.
Row = tuple[str | None, list[PanelSpec]]


def series(key: str, selector: str = TARGET, suffix: str = "") -> str:
    """The contract's series ``key`` (``suffix``: a histogram's ``_bucket``, ``_sum`` or
    ``_count``) with ``selector``: ``inferwatch_requests_waiting{backend=~"$backend", ...}``."""
    return f"{ALL[key].name}{suffix}{{{selector}}}"


def quantile(q: float, histogram: str, window: str, selector: str = TARGET) -> str:
    """The ``q``-quantile of the contract's ``histogram`` (its key) across the selected
    instances, from its raw bucket rates over ``window`` (the rules' window where the panel
    is read against an alert's threshold)."""
    rate = f"rate({series(histogram, selector, '_bucket')}[{window}])"
    return f"histogram_quantile({q}, sum by (le) ({rate}))"


def quantiles(histogram: str, window: str, label: str, selector: str = TARGET) -> list[Query]:
    """p50, p95 and p99 of a histogram, legends ``<label> p<n>``."""
    return [
        Query(quantile(q, histogram, window, selector), f"{label} p{round(q * 100)}")
        for q in (0.5, 0.95, 0.99)
    ]


def distribution(histogram: str, selector: str = TARGET) -> list[Query]:
    """A histogram's observations per bucket and interval, for a heatmap (one row per ``le``)."""
    buckets = series(histogram, selector, "_bucket")
    return [Query(f"sum by (le) (increase({buckets}[{RATE_INTERVAL}]))")]


def mean(histogram: str, window: str, selector: str = TARGET) -> str:
    """Mean of a histogram across the selected instances: rate of sum over rate of count."""
    return (
        f"sum(rate({series(histogram, selector, '_sum')}[{window}]))\n"
        f"  / (sum(rate({series(histogram, selector, '_count')}[{window}])) > 0)"
    )


def limit(value: float) -> list[tuple[float | None, str]]:
    """Thresholds: green below ``value``, red from it."""
    return [(None, "green"), (value, "red")]
