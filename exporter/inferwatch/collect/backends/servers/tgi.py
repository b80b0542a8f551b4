"""Hugging Face Text Generation Inference (TGI 1.x -> 3.x router), its model from ``GET
/info`` (``M`` below). Sample: counters without ``_total``, no label but ``method``::

    tgi_queue_size 3
    tgi_batch_inference_count{method="decode"} 292
    tgi_batch_inference_count{method="prefill"} 1
    tgi_request_input_length_sum 4096

becomes::

    inferwatch_requests_waiting{backend="tgi",model="M"} 3.0
    inferwatch_engine_steps_total{backend="tgi",model="M"} 293.0
    inferwatch_prompt_tokens_total{backend="tgi",model="M"} 4096.0

Absent, and why: TTFT (no histogram; queue time plus the batch's prefill step is an
estimate, not a request's TTFT); ``inter_token_latency_seconds`` and
``request_time_per_output_token_seconds`` (``tgi_request_mean_time_per_token_duration``
includes prefill, and decode steps are per batch); ``request_prefill_time_seconds`` /
``request_decode_time_seconds`` (only per-batch step durations); ``kv_cache_usage_ratio`` /
``kv_cache_capacity_tokens`` (TGI has a batch token budget, which an operator may set below
what the KV cache holds: mapped under its own names); ``preemptions``, ``prefix_cache_*``,
``engine_step_tokens``, ``frontend_cpu_seconds`` (not exposed); ``spec_decode_*``
(``tgi_request_skipped_tokens`` says neither drafts proposed nor accepted); ``http_requests``
(TGI counts requests, not HTTP status classes).
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import Source, feed, feed_sum

_KIND = {"method": "kind"}  # prefill or decode
# tgi_request_failure's err -> the finish reason it counts under: the server's faults are
# errors, a client gone away an abort. validation and template (the request was wrong) are
# not counted, as vLLM does not count what its API server rejects.
FAILURES = {"overloaded": "error", "generation": "error", "incomplete": "error", "dropped": "abort"}

TGI = Backend(
    name="tgi",
    signature=("tgi_",),
    labels={},
    version_path="/info",
    version_field="version",
    model_path="/info",
    model_field="model_id",
    feeds=(
        feed("requests_running", "tgi_batch_current_size"),
        feed("requests_waiting", "tgi_queue_size"),
        # Summed over method: one per prefill or decode forward of the running batch.
        feed("engine_steps", "tgi_batch_inference_count"),
        # Sums of the per-request histograms: prompts counted at validation, generated tokens
        # when a request finishes.
        feed("prompt_tokens", "tgi_request_input_length_sum"),
        feed("generation_tokens", "tgi_request_generated_tokens_sum"),
        feed("request_duration_seconds", "tgi_request_duration"),
        feed("request_queue_time_seconds", "tgi_request_queue_duration"),
        feed("request_prompt_tokens", "tgi_request_input_length"),
        feed("request_generation_tokens", "tgi_request_generated_tokens"),
        # The batch's reserved tokens against its budget: TGI's admission limit, the role
        # KV-cache use plays for vLLM's scheduler, but not KV blocks in use.
        feed("batch_reserved_tokens", "tgi_batch_current_max_tokens"),
        feed_sum(
            "requests_finished",
            # No finish reason (stop or length) on successes.
            Source("tgi_request_success", constant={"reason": "success"}),
            Source(
                "tgi_request_failure",
                where={"err": FAILURES.__contains__},
                labels={"err": "reason"},
                values={"reason": FAILURES},
            ),
        ),
        feed("batch_token_budget", "tgi_batch_max_total_tokens"),
        # One inference call of the running batch (the forward alone where a release lacks
        # it): a decode step is the batch's per-token latency, missing a request's waits
        # behind another's prefill.
        feed(
            "engine_step_seconds",
            Source("tgi_batch_inference_duration", labels=_KIND),
            Source("tgi_batch_forward_duration", labels=_KIND),
        ),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = TGI
