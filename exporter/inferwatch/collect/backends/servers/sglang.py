"""SGLang (0.3 -> 0.5.x and later main): its ``sglang:*`` families, or the ``sglang_*`` the
SMG router re-exposes. Sample (``L``: ``model_name="Qwen3",tp_rank="0"``, other ranks)::

    sglang:num_queue_reqs{L} 3.0
    sglang:cuda_graph_passes_total{L,mode="prefill_cuda_graph"} 2.0
    sglang:cuda_graph_passes_total{L,mode="decode_cuda_graph"} 8.0
    sglang:max_total_num_tokens{L} 125292.0

becomes::

    inferwatch_requests_waiting{backend="sglang",model="Qwen3"} 3.0
    inferwatch_engine_steps_total{backend="sglang",model="Qwen3"} 10.0
    inferwatch_kv_cache_capacity_tokens{backend="sglang",model="Qwen3"} 125292.0

Absent, and why: ``requests_finished`` (``num_requests_total`` has no finish reason);
``request_decode_time_seconds`` (no family); ``engine_step_tokens`` / ``engine_step_seconds``
(no per-step histogram, only busy-time counters and per-request stages); ``spec_decode_*``
(only gauges of the last interval, such as ``spec_accept_rate``: a rate sums into no counter);
``kv_transfer_expired_requests`` and ``kv_transfer_prompt_tokens`` (no family).
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import Feed, Profiler, Source, feed, feed_sum, inference_api


def _sglang_feed(key: str, name: str, **where: str) -> Feed:
    """A feed from ``sglang:<name>`` or, as the SMG router re-exposes it, ``sglang_<name>``."""
    return feed(key, *(Source(f"{prefix}{name}", where=where) for prefix in ("sglang:", "sglang_")))


def _sglang_feed_scaled(key: str, name: str, scale: float) -> Feed:
    """``_sglang_feed`` in another unit: ms to seconds, MiB to bytes."""
    return feed(key, *(Source(f"{prefix}{name}", scale=scale) for prefix in ("sglang:", "sglang_")))


def _both_prefixes(*names: str) -> tuple[Source, ...]:
    return tuple(Source(f"{prefix}{name}") for prefix in ("sglang:", "sglang_") for name in names)


# The disaggregation queues: the role (engine_type) that fills each, and the contract's
# stage of a request waiting in it for its KV.
_PD_QUEUES = {
    "num_prefill_bootstrap_queue_reqs": ("prefill", "pending"),
    "num_prefill_inflight_queue_reqs": ("prefill", "transferring"),
    "num_decode_prealloc_queue_reqs": ("decode", "pending"),
    "num_decode_transfer_queue_reqs": ("decode", "transferring"),
}

# SGLang's native inference routes outside /v1/.
_INFERENCE = inference_api("/generate", "/encode", "/classify")


# engine_type on every series: a disaggregated instance's role, or one that runs both phases.
_ENGINE_TYPES = {"prefill": "prefill", "decode": "decode", "unified": "both", "dynamic": "both"}


def _role(page: str) -> str:
    """The role the page's ``engine_type`` labels say (they all say the same)."""
    return next((role for t, role in _ENGINE_TYPES.items() if f'engine_type="{t}"' in page), "")


SGLANG = Backend(
    name="sglang",
    signature=("sglang:", "sglang_"),
    # dp_rank (data-parallel attention) is the engine; tp_rank, pp_rank, moe_ep_rank,
    # engine_type, is_streaming, pid and SMG's worker_addr are dropped, their series merged.
    labels={"model_name": "model", "dp_rank": "engine", "status_code": "status"},
    version_path="/get_server_info",
    role_of=_role,
    # The traces land in the server's SGLANG_TORCH_PROFILER_DIR (default /tmp).
    profiler=Profiler(enable="SGLANG_TORCH_PROFILER_DIR=DIR python -m sglang.launch_server ..."),
    feeds=(
        _sglang_feed("requests_running", "num_running_reqs"),
        # A request whose grammar compiles waits in a queue of its own: waiting, deferred.
        # The disaggregation queues are not added.
        feed_sum(
            "requests_waiting",
            *(
                Source(f"{prefix}{name}")
                for prefix in ("sglang:", "sglang_")
                for name in ("num_queue_reqs", "num_grammar_queue_reqs")
            ),
        ),
        _sglang_feed("requests_deferred", "num_grammar_queue_reqs"),
        _sglang_feed("kv_cache_usage_ratio", "token_usage"),  # the fullest KV pool
        # Not the num_retracted_reqs gauge: it counts the last log interval only.
        _sglang_feed("preemptions", "num_retracted_requests_total"),
        _sglang_feed("prompt_tokens", "prompt_tokens_total"),
        _sglang_feed("generation_tokens", "generation_tokens_total"),
        # Queries: every prefill_effective_tokens_total mode; hits: its device_hit mode (the
        # GPU radix cache, like vLLM's local hits). Older releases: prompt and cached tokens.
        feed(
            "prefix_cache_queries",
            "sglang:prefill_effective_tokens_total",
            "sglang_prefill_effective_tokens_total",
            "sglang:prompt_tokens_total",
            "sglang_prompt_tokens_total",
        ),
        feed(
            "prefix_cache_hits",
            Source("sglang:prefill_effective_tokens_total", where={"mode": "device_hit"}),
            Source("sglang_prefill_effective_tokens_total", where={"mode": "device_hit"}),
            "sglang:cached_tokens_total",
            "sglang_cached_tokens_total",
        ),
        # Summed over mode: one per prefill or decode forward, CUDA graph or not. Not
        # realtime_tokens_total (moves at log intervals only) nor forward_execution_seconds
        # (recorded only with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1).
        _sglang_feed("engine_steps", "cuda_graph_passes_total"),
        # Time with nothing running *or queued*: it proves a stale queue gauge wrong, never
        # an idle engine with a queue (inferwatch.collect.derive).
        _sglang_feed("scheduler_idle_seconds", "scheduler_idle_seconds_total"),
        # The tokenizer component is the HTTP server's process.
        _sglang_feed("frontend_cpu_seconds", "process_cpu_seconds_total", component="tokenizer"),
        _sglang_feed("estimated_read_bytes", "estimated_read_bytes_per_gpu_total"),
        _sglang_feed("estimated_flops", "estimated_flops_per_gpu_total"),
        _sglang_feed("time_to_first_token_seconds", "time_to_first_token_seconds"),
        # The 2024 time_per_output_token_seconds is per token: an ITL, never the TPOT below.
        feed(
            "inter_token_latency_seconds",
            "sglang:inter_token_latency_seconds",
            "sglang_inter_token_latency_seconds",
            "sglang:time_per_output_token_seconds",
            "sglang_time_per_output_token_seconds",
        ),
        _sglang_feed("request_duration_seconds", "e2e_request_latency_seconds"),
        _sglang_feed("request_queue_time_seconds", "queue_time_seconds"),
        # From the first forward to the end of the last prefill chunk.
        _sglang_feed(
            "request_prefill_time_seconds", "per_stage_req_latency_seconds", stage="prefill_forward"
        ),
        _sglang_feed("request_prompt_tokens", "prompt_tokens_histogram"),
        _sglang_feed("request_generation_tokens", "generation_tokens_histogram"),
        # Per request: (finished - first token) / (output tokens - 1).
        _sglang_feed(
            "request_time_per_output_token_seconds", "request_time_per_output_token_seconds"
        ),
        _sglang_feed("kv_cache_capacity_tokens", "max_total_num_tokens"),  # the KV pool's size
        # Disaggregated prefill/decode (SGLang 0.5.23, sglang/srt/observability/
        # metrics_collector.py): the prefill instance observes each transfer it sends, its
        # latency in ms and its size in MiB (bytes / 1024**2). Not kv_transfer_speed_gb_s:
        # a histogram of per-transfer speeds, which bytes over seconds already give; nor
        # kv_transfer_alloc_ms (the decode's wait for KV memory, no transfer).
        _sglang_feed_scaled("kv_transfer_seconds", "kv_transfer_latency_ms", 0.001),
        _sglang_feed_scaled("kv_transfer_bytes", "kv_transfer_total_mb_sum", 1024.0**2),
        _sglang_feed_scaled("kv_transfer_bootstrap_seconds", "kv_transfer_bootstrap_ms", 0.001),
        # Requests, on the side that saw the failure.
        feed_sum(
            "kv_transfer_failures",
            *_both_prefixes("num_bootstrap_failed_reqs_total", "num_transfer_failed_reqs_total"),
        ),
        # The prefill's bootstrap queue (waiting for its decode to pair) and inflight queue
        # (sending), the decode's prealloc queue (pairing, allocating) and transfer queue
        # (receiving), each on its role's instance only: every SGLang writes all four, 0 on
        # a server that is not disaggregated (engine_type="unified"). Not
        # decode_host_receive_queue_reqs: a part of the transfer queue.
        feed_sum(
            "kv_transfer_requests_waiting",
            *(
                Source(
                    f"{prefix}{name}",
                    where={"engine_type": (role, "dynamic").__contains__},
                    constant={"stage": stage},
                )
                for prefix in ("sglang:", "sglang_")
                for name, (role, stage) in _PD_QUEUES.items()
            ),
        ),
        # Status codes by class, summed over endpoint and method on the inference API only.
        feed(
            "http_requests",
            *(
                Source(f"{prefix}http_responses_total", where={"endpoint": _INFERENCE})
                for prefix in ("sglang:", "sglang_")
            ),
        ),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = SGLANG
