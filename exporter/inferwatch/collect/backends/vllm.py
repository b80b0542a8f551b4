"""vLLM (V1 engine 0.8 -> 0.33, and the V0 engine of 0.6/0.7).

Sample of what it maps (vLLM 0.32, one engine)::

    vllm:num_requests_waiting{engine="0",model_name="tiny"} 20.0
    vllm:iteration_tokens_total_bucket{engine="0",le="16.0",model_name="tiny"} 41.0
    vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 25.0

becomes::

    inferwatch_requests_waiting{backend="vllm",model="tiny",engine="0"} 20.0
    inferwatch_engine_step_tokens_bucket{backend="vllm",model="tiny",engine="0",le="16.0"} 41.0
    inferwatch_requests_finished_total{backend="vllm",model="tiny",engine="0",reason="length"} 25.0

Renames across releases are listed newest first in each feed: ``kv_cache_usage_perc``
(0.9.2+) before ``gpu_cache_usage_perc``; ``inter_token_latency_seconds`` (0.10.2+) before
``time_per_output_token_seconds``; ``prefix_cache_*`` (0.9.2+) before
``gpu_prefix_cache_*``. ``engine`` (the data-parallel rank, 0.8.5+) is kept; a ``pid``
label (multiprocess mode, 0.9.2-0.11) is dropped and its series merged.
"""

from inferwatch.collect.backends.base import Backend, feed

VLLM = Backend(
    name="vllm",
    signature=("vllm:",),
    labels={"model_name": "model", "engine": "engine", "finished_reason": "reason"},
    version_path="/version",
    feeds=(
        feed("requests_running", "vllm:num_requests_running"),
        feed("requests_waiting", "vllm:num_requests_waiting"),
        feed("kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        feed("preemptions", "vllm:num_preemptions_total"),
        feed("prompt_tokens", "vllm:prompt_tokens_total"),
        feed("generation_tokens", "vllm:generation_tokens_total"),
        feed("requests_finished", "vllm:request_success_total"),
        feed(
            "prefix_cache_queries",
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ),
        feed(
            "prefix_cache_hits", "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"
        ),
        # One observation per engine step: the histogram's count is the step counter.
        feed("engine_steps", "vllm:iteration_tokens_total_count"),
        feed("frontend_cpu_seconds", "process_cpu_seconds_total"),
        feed("estimated_read_bytes", "vllm:estimated_read_bytes_per_gpu_total"),
        feed("estimated_flops", "vllm:estimated_flops_per_gpu_total"),
        feed("time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
        feed(
            "inter_token_latency_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
        ),
        feed("request_duration_seconds", "vllm:e2e_request_latency_seconds"),
        feed("request_queue_time_seconds", "vllm:request_queue_time_seconds"),
        feed("request_prefill_time_seconds", "vllm:request_prefill_time_seconds"),
        feed("request_decode_time_seconds", "vllm:request_decode_time_seconds"),
        feed("request_prompt_tokens", "vllm:request_prompt_tokens"),
        feed("request_generation_tokens", "vllm:request_generation_tokens"),
        feed("engine_step_tokens", "vllm:iteration_tokens_total"),
    ),
)
