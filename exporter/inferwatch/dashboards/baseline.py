"""The triage dashboard's "Baseline: what regressed?" row: live p95 against the baseline file's."""

from __future__ import annotations

from inferwatch.dashboards.queries import NO_BASELINE, TARGET, PanelSpec, Query, quantile, series
from inferwatch.method.panels import Panel
from inferwatch.method.spec import Spec

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
