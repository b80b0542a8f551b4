"""Against the baseline: live latency measured against the benchmark at comparable load."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import INSTANCE_ITL, INSTANCE_TTFT, P95, value_of
from inferwatch.method.scenario import SERVED_MODEL, A, B, Scenario, healthy, instance_alert
from inferwatch.method.signals import BASELINE95, INSTANCE, ITL, TTFT

REGRESSION = Scenario(
    # Baseline at concurrency 8: TTFT p95 300 ms, ITL p95 40 ms. Live TTFT p95 487.5 ms is
    # 1.625x (fires; printed with 3 digits, half to even); live ITL p95 48.75 ms is 1.22x.
    # B's baseline TTFT 400 ms makes its 487.5 ms only 1.22x (near miss).
    "latency regression against the baseline",
    (healthy(A, baseline=(0.3, 0.04)), healthy(B, baseline=(0.4, 0.04))),
    file="baseline.yaml",
    place=1,
    fires={
        "InferenceLatencyRegression": [
            instance_alert(
                "InferenceLatencyRegression",
                A,
                "warning",
                "any",
                "baseline",
                f"Live p95 latency of {SERVED_MODEL} is 1.62x the baseline at comparable load "
                "(concurrency 8; threshold 1.5x): TTFT p95 487.5ms vs 300ms, inter-token "
                "latency p95 48.75ms vs 40ms.",
                f"Latency on {A} regressed against the baseline",
            )
        ]
    },
    eval_time="19m",  # its `for` is 15m
)

LATENCY_REGRESSION = Alert(
    name="InferenceLatencyRegression",
    order=14,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="baseline",
    for_default="15m",
    summary="Latency on {{ $labels.instance }} regressed against the baseline",
    description='Live p95 latency of {{ $labels.model }} is {{ $value | printf "%%.3g" }}x the '
    "baseline at comparable load (concurrency "
    + value_of(f"inferwatch_baseline_{TTFT}{BASELINE95}", INSTANCE, 'label "concurrency"')
    + "; threshold %(t.regression_factor)sx): TTFT p95 "
    + value_of(f"{INSTANCE_TTFT}:quantile_%(w)s{P95}", INSTANCE, "humanizeDuration")
    + " vs "
    + value_of(f"inferwatch_baseline_{TTFT}{BASELINE95}", INSTANCE, "humanizeDuration")
    + ", inter-token latency p95 "
    + value_of(f"{INSTANCE_ITL}:quantile_%(w)s{P95}", INSTANCE, "humanizeDuration")
    + " vs "
    + value_of(f"inferwatch_baseline_{ITL}{BASELINE95}", INSTANCE, "humanizeDuration")
    + ".",
    any_of=(
        Cond("ttft_over_baseline", ">", "regression_factor"),
        Cond("itl_over_baseline", ">", "regression_factor"),
    ),
    evidence=(
        "Compare the trace's step durations with a capture taken at baseline load "
        "(`inferwatch capture` on a healthy replica): the same step shape taking longer is "
        "the hardware or the build; a different shape is the load."
    ),
    scenarios=(REGRESSION,),
)

ALERTS = (LATENCY_REGRESSION,)
