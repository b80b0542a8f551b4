"""The triage dashboard's baseline rows: "what regressed?" (live p95 against the baseline
file's) and "how much more load?" (live traffic against the capacity its load search measured)."""

from __future__ import annotations

from inferwatch.dashboards.queries import (
    MODEL,
    NO_BASELINE,
    TARGET,
    PanelSpec,
    Query,
    quantile,
    series,
)
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel

# The baseline's p95, at the measured concurrency nearest the current load.
_BASELINE_P95 = f'{TARGET}, percentile="95"'


def baseline_panels(spec: Spec) -> list[PanelSpec]:
    """TTFT and inter-token latency p95, live and in the baseline."""
    window, factor = spec.timing.window, spec.threshold("regression_factor")
    return [
        PanelSpec(
            Panel.TTFT_VS_BASELINE,
            "Live TTFT p95 against the baseline's p95 at the nearest measured concurrency (from "
            "`inferwatch baseline`). Above the baseline line by more than "
            f"{factor:g}x: TTFT regressed (InferenceLatencyRegression).",
            [
                Query(quantile(0.95, "time_to_first_token_seconds", window), "live p95"),
                Query(
                    f"max({series('baseline_time_to_first_token_seconds', _BASELINE_P95)})",
                    "baseline p95",
                ),
            ],
            unit="s",
            width=12,
            no_value=NO_BASELINE,
        ),
        PanelSpec(
            Panel.ITL_VS_BASELINE,
            "Live inter-token latency p95 against the baseline's at the nearest concurrency. Above "
            f"it by more than {factor:g}x: decode regressed.",
            [
                Query(quantile(0.95, "inter_token_latency_seconds", window), "live p95"),
                Query(
                    f"max({series('baseline_inter_token_latency_seconds', _BASELINE_P95)})",
                    "baseline p95",
                ),
            ],
            unit="s",
            width=12,
            no_value=NO_BASELINE,
        ),
    ]


NO_CAPACITY = "no capacity: give inferwatch a baseline file from `inferwatch baseline --search on`"


def capacity_panels(spec: Spec) -> list[PanelSpec]:
    """Finished requests/s against the measured capacity, its share in use, the replicas the
    traffic needs."""
    window, high = spec.timing.window, spec.threshold("capacity_use_high")
    finished = f"sum(rate({series('requests_finished')}[{window}]))"
    capacity = f"sum({series('baseline_capacity_requests_per_second')})"
    return [
        PanelSpec(
            Panel.LOAD_VS_CAPACITY,
            "Finished requests/s of the selected replicas against the capacity their baseline "
            "measured (the highest rate whose goodput met its target, scaled to the live output "
            f"length). Above the {high * 100:g} % line for the alert's `for`: "
            "InferenceNearCapacity, a ticket to add replicas before the queue forms.",
            [
                Query(finished, "finished requests/s"),
                Query(capacity, "capacity"),
                Query(f"{high:g} * {capacity}", f"ticket at {high * 100:g} %"),
            ],
            unit="reqps",
            width=12,
            no_value=NO_CAPACITY,
        ),
        PanelSpec(
            Panel.CAPACITY_IN_USE,
            "The share of the measured capacity the traffic uses. Headroom is the rest: what "
            "more traffic the replicas carry at the goodput target.",
            [Query(f"{finished} / ({capacity} > 0)", "in use")],
            unit="percentunit",
            kind="stat",
            width=6,
            no_value=NO_CAPACITY,
            thresholds=[(None, "green"), (high, "orange"), (1, "red")],
        ),
        PanelSpec(
            Panel.REPLICAS_NEEDED,
            "The traffic over one replica's measured capacity: how many replicas it needs at "
            "full capacity (`model:inferwatch_replicas_needed`, what the autoscaler recipe in "
            "deploy/kubernetes/autoscaling targets), and how many report a capacity.",
            [
                Query(
                    f"sum(model:inferwatch_replicas_needed:{spec.rate_name}{{{MODEL}}})",
                    "needed",
                ),
                Query(f"count({series('baseline_capacity_requests_per_second')})", "replicas"),
            ],
            width=6,
            no_value=NO_CAPACITY,
        ),
        _load_curve(),
    ]


def _load_curve() -> PanelSpec:
    """The load search's steps at the shape the capacity is read at: one row per rate."""

    def column(key: str, legend: str, unit: str, latency: str | None = None) -> Query:
        selector = TARGET + (f', latency="{latency}"' if latency else "")
        shape = "model, prompt_tokens, output_tokens, rate"
        return Query(
            f"avg by ({shape}) ({series(key, selector)})",
            legend,
            instant=True,
            table=True,
            unit=unit,
        )

    latency = "baseline_step_latency_seconds"
    return PanelSpec(
        Panel.LOAD_CURVE,
        "What the baseline's load search measured at the shape nearest the live requests, one "
        "row per rate it offered (requests/s): what the server finished, the share of requests "
        "that met every objective jointly (goodput), and latency p95 client side. The capacity "
        "is the highest rate whose goodput met its target; past it, latency outgrows the load.",
        [
            column("baseline_step_requests_per_second", "finished requests/s", "reqps"),
            column("baseline_step_goodput_ratio", "goodput", "percentunit"),
            column(latency, "TTFT p95", "s", "ttft"),
            column(latency, "ITL p95", "s", "itl"),
            column(latency, "E2E p95", "s", "e2e"),
        ],
        kind="table",
        width=24,
        no_value=NO_CAPACITY,
        sort_by="rate",
    )
