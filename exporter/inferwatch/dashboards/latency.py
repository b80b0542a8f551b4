"""The triage dashboard's "Latency by phase: prefill or decode?" row.

TTFT, inter-token and end-to-end latency quantiles and the TTFT split into queue and
prefill; the three histograms' heatmaps; per-request time per output token and the
speculative-decoding acceptance.
"""

from __future__ import annotations

from inferwatch.dashboards.queries import (
    DECODE_FLOOR,
    NO_SPEC_DECODE,
    RATE_INTERVAL,
    PanelSpec,
    Query,
    distribution,
    limit,
    mean,
    quantiles,
    series,
)
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel


def latency_panels(spec: Spec) -> list[PanelSpec]:
    """The phases' latencies, their distributions, then per request and speculation."""
    return [*_phase_latency(spec), _step_latency(spec), *_distributions(), *_per_request()]


def _phase_latency(spec: Spec) -> list[PanelSpec]:
    """TTFT, ITL and end-to-end quantiles, and TTFT split into queue and prefill."""
    window, threshold = spec.timing.window, spec.threshold
    return [
        PanelSpec(
            Panel.TTFT,
            "Time to first token quantiles (server side, includes queueing and tokenization). "
            "Healthy: p95 under the dashed threshold. TTFT high with normal inter-token latency "
            "puts the problem in the prefill phase.",
            quantiles("time_to_first_token_seconds", window, "TTFT"),
            unit="s",
            width=12,
            thresholds=limit(threshold("ttft_p95_seconds")),
        ),
        PanelSpec(
            Panel.ITL,
            "Latency between successive output tokens of a request (one sample per decode step), "
            "with the decode floor. Healthy: p95 flat, under the threshold and within a small "
            "factor of the floor. A p99 far above p50 while prompts are prefilled: prefill "
            "stalls decode (chunk size).",
            [
                *quantiles("inter_token_latency_seconds", window, "ITL"),
                Query(DECODE_FLOOR, "decode floor"),
            ],
            unit="s",
            width=12,
            thresholds=limit(threshold("itl_p95_seconds")),
        ),
        PanelSpec(
            Panel.E2E,
            "End-to-end request latency on the server (arrival to last token). Grows with output "
            "length, so read it with Request lengths; client-side latency adds network and SSE.",
            quantiles("request_duration_seconds", window, "E2E"),
            unit="s",
            width=12,
        ),
        PanelSpec(
            Panel.TTFT_SPLIT,
            "Mean TTFT split into time waiting to be scheduled (queue) and time from first "
            "scheduled to first token (prefill). Queue dominating: capacity or scheduling, scale "
            "out. Prefill dominating: prompts are long or not cached.",
            [
                Query(mean("request_queue_time_seconds", window), "queue"),
                Query(mean("request_prefill_time_seconds", window), "prefill"),
                Query(mean("time_to_first_token_seconds", window), "TTFT (mean)"),
            ],
            unit="s",
            width=12,
        ),
    ]


def _step_latency(spec: Spec) -> PanelSpec:
    """Engine steps by kind, where the server times them (TGI)."""
    window, step = spec.timing.window, "engine_step_seconds"
    return PanelSpec(
        Panel.STEP_LATENCY,
        "How long one forward of the running batch takes, by kind, as a server that times "
        "its steps measures it (TGI; its stand-in for TTFT and inter-token histograms). A "
        "decode step gives every running request its next token: its p95 is judged against "
        "the inter-token threshold. A first token waits in the queue, then for a prefill "
        "step.",
        [
            Query(
                f"histogram_quantile(0.95, sum by (le, kind) "
                f"(rate({series(step, suffix='_bucket')}[{window}])))",
                "{{kind}} step p95",
            ),
            Query(
                f"sum by (kind) (rate({series(step, suffix='_sum')}"
                f"[{window}]))\n  / (sum by (kind) (rate("
                f"{series(step, suffix='_count')}[{window}])) > 0)",
                "{{kind}} step mean",
            ),
        ],
        unit="s",
        width=12,
        thresholds=limit(spec.threshold("itl_p95_seconds")),
    )


def _distributions() -> list[PanelSpec]:
    """The heatmaps: every bucket of the three latency histograms over time."""
    return [
        PanelSpec(
            Panel.TTFT_HEATMAP,
            "How many requests' first token came within each bucket, per interval. A second "
            "band above the main one is a class of requests (long prompts, a cold prefix "
            "cache, queueing) that the quantiles blur into one line.",
            distribution("time_to_first_token_seconds"),
            unit="s",
            kind="heatmap",
        ),
        PanelSpec(
            Panel.ITL_HEATMAP,
            "Gaps between successive output tokens per bucket and interval. A tight band is "
            "steady decode; a faint band far above it is decode steps stalled behind prefill "
            "chunks (InferencePrefillStallsDecode) or preemptions.",
            distribution("inter_token_latency_seconds"),
            unit="s",
            kind="heatmap",
        ),
        PanelSpec(
            Panel.E2E_HEATMAP,
            "End-to-end request latency per bucket and interval. Bands follow output lengths; "
            "a band that moves up without longer outputs is slower serving.",
            distribution("request_duration_seconds"),
            unit="s",
            kind="heatmap",
        ),
    ]


def _per_request() -> list[PanelSpec]:
    """Each finished request's time per output token, and the speculative-decoding
    acceptance (the draft tokens a decode step keeps)."""
    accepted = f"rate({series('spec_decode_accepted_tokens')}[{RATE_INTERVAL}])"
    drafted = f"rate({series('spec_decode_draft_tokens')}[{RATE_INTERVAL}])"
    return [
        PanelSpec(
            Panel.TPOT,
            "Time per output token of each finished request (its decode time over its output "
            "tokens after the first), p50/p95/p99, as the server measures it: the unit many "
            "SLOs are written in. Unlike inter-token latency (one sample per step) every "
            "request counts once. High with a normal TTFT: the decode phase.",
            quantiles("request_time_per_output_token_seconds", RATE_INTERVAL, "TPOT"),
            unit="s",
            width=12,
        ),
        PanelSpec(
            Panel.SPEC_DECODE,
            "Speculative decoding: the share of draft tokens the target model accepted. "
            "Each rejected draft token is wasted compute, so a low acceptance makes decode "
            "slower than without speculation (a decode-phase cause): try fewer speculative "
            "tokens or a draft model closer to the target.",
            [
                Query(
                    f"sum by (instance) ({accepted})\n  / (sum by (instance) ({drafted}) > 0)",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            width=12,
            no_value=NO_SPEC_DECODE,
        ),
    ]
