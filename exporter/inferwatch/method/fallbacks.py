"""The signals read where a server lacks a signal's own series (``Signal.fallback``).

TGI times its engine's steps instead of its requests' tokens, and admits requests by a
token budget instead of KV blocks: there the phase, the decode floor and memory pressure are
judged on what it does measure. A decode step gives every running request its next token
(its duration is the batch's per-token latency, server side); a first token waits for the
queue and then a prefill step; the canary's probes are the only true first token.
"""

from __future__ import annotations

from inferwatch.method.recipes import Gauge, Mean, Quantile, Rate, Ratio, Sum
from inferwatch.method.signal import INSTANCE, QUEUE, Signal

STEP = "engine_step_seconds"
_DECODE, _PREFILL = {"kind": "decode"}, {"kind": "prefill"}


def _step_series(part: str, kind: str) -> str:
    return f'inferwatch_{STEP}_{part}{{kind="{kind}"}}'


def _mean_of(sum_series: str, count_series: str, without: str) -> str:
    """A histogram's mean over the window: rate of the sum over rate of the count."""
    return (
        f"sum without ({without}) (rate({sum_series}[%(window)s]))"
        f" / (sum without ({without}) (rate({count_series}[%(window)s])) > 0)"
    )


def _step_mean(kind: str) -> str:
    return _mean_of(_step_series("sum", kind), _step_series("count", kind), "engine, kind")


def _queue_mean() -> str:
    return _mean_of(f"inferwatch_{QUEUE}_sum", f"inferwatch_{QUEUE}_count", "engine")


FALLBACKS = (
    Signal(
        name="canary_ttft_p95",
        label="TTFT p95 (canary, client side)",
        unit="seconds",
        level=INSTANCE,
        promql="histogram_quantile(0.95, sum without (engine) "
        "(rate(inferwatch_canary_time_to_first_token_seconds_bucket[%(window)s])))",
        local=Quantile("canary_time_to_first_token_seconds", 0.95),
    ),
    Signal(
        name="decode_step_p95",
        label="decode step p95 (server step latency)",
        unit="seconds",
        level=INSTANCE,
        promql=f"histogram_quantile(0.95, sum without (engine, kind) "
        f"(rate({_step_series('bucket', 'decode')}[%(window)s])))",
        local=Quantile(STEP, 0.95, where=_DECODE),
    ),
    Signal(
        name="decode_step_over_floor",
        label="mean decode step / decode floor",
        unit="factor",
        level=INSTANCE,
        promql=f"({_step_mean('decode')})\n  / on (instance, job, backend, model) group_left "
        "max by (instance, job, backend, model) (inferwatch_decode_floor_seconds)",
        local=Ratio(Mean(STEP, where=_DECODE), Gauge("inferwatch_decode_floor_seconds")),
    ),
    Signal(
        name="queue_share_of_steps",
        label="queue share of queue + prefill step (server side)",
        unit="ratio",
        level=INSTANCE,
        promql=f"clamp_max(\n  ({_queue_mean()})\n  / (\n    ({_queue_mean()})\n"
        f"    + ({_step_mean('prefill')})\n  ),\n  1\n)",
        local=Ratio(Mean(QUEUE), Sum((Mean(QUEUE), Mean(STEP, where=_PREFILL)))),
    ),
    # Where a server counts no finished requests by reason (SGLang), its request duration
    # histogram counts them all the same.
    Signal(
        name="request_duration_rate",
        label="finished requests/s (request duration count)",
        unit="per_second",
        level=INSTANCE,
        promql="sum without (engine) (rate(inferwatch_request_duration_seconds_count[%(window)s]))",
        local=Rate("inferwatch_request_duration_seconds_count"),
    ),
    Signal(
        name="generation_rate",
        label="generated tokens/s",
        unit="per_second",
        level=INSTANCE,
        promql="instance:inferwatch_generation_tokens:%(w)s",
        local=Rate("inferwatch_generation_tokens_total"),
    ),
    Signal(
        name="prompt_rate",
        label="prompt tokens/s",
        unit="per_second",
        level=INSTANCE,
        promql="instance:inferwatch_prompt_tokens:%(w)s",
        local=Rate("inferwatch_prompt_tokens_total"),
    ),
    # A server that admits requests by a token budget (TGI) holds them in the queue when
    # the running batch has reserved it all, as a full KV cache does elsewhere.
    Signal(
        name="token_budget_use",
        label="batch token budget in use",
        unit="ratio",
        level=INSTANCE,
        promql="clamp_max(\n  max without (engine) (avg_over_time(inferwatch_batch_reserved_tokens"
        "[%(window)s]))\n  / max without (engine) (avg_over_time(inferwatch_batch_token_budget"
        "[%(window)s])),\n  1\n)",
        local=Ratio(
            Gauge("inferwatch_batch_reserved_tokens", averaged=True),
            Gauge("inferwatch_batch_token_budget", averaged=True),
        ),
    ),
)
