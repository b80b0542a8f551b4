"""vLLM (V1 engine 0.8 -> 0.33, and the V0 engine of 0.6/0.7). Sample (vLLM 0.32)::

    vllm:num_requests_waiting{engine="0",model_name="tiny"} 20.0
    vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 25.0
    vllm:cache_config_info{engine="0",kv_cache_size_tokens="1048576",...} 1.0
    http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 25.0

becomes::

    inferwatch_requests_waiting{backend="vllm",model="tiny",engine="0"} 20.0
    inferwatch_requests_finished_total{backend="vllm",model="tiny",engine="0",reason="length"} 25.0
    inferwatch_kv_cache_capacity_tokens{backend="vllm",model="tiny",engine="0"} 1048576.0
    inferwatch_http_requests_total{backend="vllm",model="tiny",status="2xx"} 25.0
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import (
    Profiler,
    Source,
    feed,
    feed_sum,
    inference_api,
    info,
    newest_info,
)

# vLLM's inference routes outside /v1/: SageMaker's /invocations and the pooling, scoring
# and rerank routes.
_INFERENCE = inference_api(
    "/invocations", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank"
)

# vllm/v1/metrics/stats.py's KV_FETCH_STAGES in the contract's terms.
_KV_FETCH_STAGES = {
    "waiting_to_start": "pending",
    "in_progress": "transferring",
    "completed_waiting": "received",
}


def _role(page: str) -> str:
    """A KV consumer counts the requests fetching their KV (``kv_fetch_by_stage``): decode
    (a kv_both instance reads as decode too: ``--role both``); a server with a connector's
    transfer families and no such count is its producer: prefill; nothing without one."""
    if "vllm:num_requests_kv_fetch_by_stage" in page:
        return "decode"
    return "prefill" if "vllm:nixl_" in page or "vllm:mooncake_" in page else ""


VLLM = Backend(
    name="vllm",
    signature=("vllm:",),
    # engine is the data-parallel rank; a pid label (multiprocess mode) is dropped, its
    # series merged.
    labels={
        "model_name": "model",
        "engine": "engine",
        "finished_reason": "reason",
        "status": "status",
    },
    version_path="/version",
    role_of=_role,
    # vLLM 0.13+: the endpoints exist when the server starts with a torch profiler; the
    # engine's and the API server's traces land in its torch_profiler_dir.
    profiler=Profiler(
        enable="""vllm serve ... --profiler-config '{"profiler": "torch", "torch_profiler_dir": DIR}'""",
        prefix_field="profile_prefix",
        steps_field="max_iterations",
    ),
    feeds=(
        feed("requests_running", "vllm:num_requests_running"),
        feed("requests_waiting", "vllm:num_requests_waiting"),
        # Deferred: waiting on a LoRA budget, a KV transfer or a blocked status, not capacity.
        feed(
            "requests_deferred",
            Source("vllm:num_requests_waiting_by_reason", where={"reason": "deferred"}),
        ),
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
        # Per request: decode time over the tokens after the first. Where a release lacks it,
        # absent: the per-token ITL histogram is not a TPOT.
        feed("request_time_per_output_token_seconds", "vllm:request_time_per_output_token_seconds"),
        feed(
            "kv_cache_capacity_tokens",
            info(
                "vllm:cache_config_info",
                from_labels=("kv_cache_size_tokens", ("num_gpu_blocks", "block_size")),
            ),
        ),
        # One series per state it has been in, each valued at the time it was last set; the
        # newest's running_lora_adapters names every adapter with requests running or waiting.
        feed(
            "lora_adapters_active",
            newest_info("vllm:lora_requests_info", "running_lora_adapters", count=True),
        ),
        feed("lora_adapters_max", newest_info("vllm:lora_requests_info", "max_lora")),
        feed("spec_decode_draft_tokens", "vllm:spec_decode_num_draft_tokens_total"),
        feed("spec_decode_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_total"),
        # Disaggregated prefill/decode (vLLM 0.34, vllm/distributed/kv_transfer/kv_connector/
        # v1/nixl/stats.py and mooncake/stats.py): the connector's own families. NIXL pulls,
        # so the decode instance times its reads; Mooncake pushes, so the prefill times its
        # writes. Bytes: the sum of the per-transfer size histogram.
        feed(
            "kv_transfer_seconds", "vllm:nixl_xfer_time_seconds", "vllm:mooncake_xfer_time_seconds"
        ),
        feed(
            "kv_transfer_bytes",
            "vllm:nixl_bytes_transferred_sum",
            "vllm:mooncake_bytes_transferred_sum",
        ),
        # NIXL's counts handshake and notification failures too; Mooncake's sender counts
        # failed writes, its receiver failed receives.
        feed_sum(
            "kv_transfer_failures",
            Source("vllm:nixl_num_failed_transfers_total"),
            Source("vllm:mooncake_num_failed_transfers_total"),
            Source("vllm:mooncake_num_failed_recvs_total"),
        ),
        feed(
            "kv_transfer_expired_requests",
            "vllm:nixl_num_kv_expired_reqs_total",
            "vllm:mooncake_num_kv_expired_reqs_total",
        ),
        # A KV consumer's waiting requests by async KV load stage (vLLM 0.33+).
        feed(
            "kv_transfer_requests_waiting",
            Source(
                "vllm:num_requests_kv_fetch_by_stage",
                where={"stage": _KV_FETCH_STAGES.__contains__},
                labels={"stage": "stage"},
                values={"stage": _KV_FETCH_STAGES},
            ),
        ),
        feed(
            "kv_transfer_prompt_tokens",
            Source("vllm:prompt_tokens_by_source_total", where={"source": "external_kv_transfer"}),
        ),
        # The API server's (prometheus-fastapi-instrumentator, status already 2xx...), summed
        # over handler and method on the inference API; vLLM already leaves out /metrics,
        # /health, /load, /ping, /version and /server_info.
        feed("http_requests", Source("http_requests_total", where={"handler": _INFERENCE})),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = VLLM
