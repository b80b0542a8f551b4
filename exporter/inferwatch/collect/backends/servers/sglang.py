"""SGLang (0.3 -> 0.5.x and later main), started with ``--enable-metrics``.

SGLang serves ``/metrics`` through prometheus_client's content negotiation: without
``Accept: text/plain`` it may answer OpenMetrics or gzip, which is why the exporter always
asks for classic text. Names use the ``sglang:`` prefix; the SMG router's HTTP sidecar
re-exposes the same families as ``sglang_*`` (colon replaced), so every feed lists both.
Sample of what it maps (in the shape of a 2026 build, TP1; ``L`` stands for the labels
``engine_type="unified",model_name="Qwen3",moe_ep_rank="0",pp_rank="0",tp_rank="0"``)::

    sglang:num_queue_reqs{L} 3.0
    sglang:cuda_graph_passes_total{L,mode="prefill_cuda_graph"} 2.0
    sglang:cuda_graph_passes_total{L,mode="decode_cuda_graph"} 8.0
    sglang:time_to_first_token_seconds_bucket{engine_type="unified",is_streaming="false",
        le="0.1",model_name="Qwen3"} 0.0
    sglang:max_total_num_tokens{L} 125292.0
    sglang:http_responses_total{endpoint="/v1/chat/completions",method="POST",
        status_code="200"} 2.0

becomes::

    inferwatch_requests_waiting{backend="sglang",model="Qwen3"} 3.0
    inferwatch_engine_steps_total{backend="sglang",model="Qwen3"} 10.0
    inferwatch_time_to_first_token_seconds_bucket{backend="sglang",model="Qwen3",le="0.1"} 0.0
    inferwatch_kv_cache_capacity_tokens{backend="sglang",model="Qwen3"} 125292.0
    inferwatch_http_requests_total{backend="sglang",model="Qwen3",status="2xx"} 2.0

``dp_rank`` (data-parallel attention) is kept as ``engine``; ``tp_rank``, ``pp_rank``,
``moe_ep_rank``, ``engine_type``, ``is_streaming``, ``pid`` and the SMG ``worker_addr`` are
dropped and their series merged (gauges: max, counters and histograms: sum). With
``--enable-metrics-for-all-schedulers`` every TP rank reports its scheduler counters, so
``engine_steps`` and the prefix-cache token counters then count once per rank.

Queued-while-idle without NVML. SGLang's gauges, ``num_queue_reqs`` included, are published
only on a prefill, every ``--decode-log-interval`` (40) decode steps, and when idle at most
every 30 s, so after a burst the queue gauge can read > 0 for half a minute while nothing
waits. Two counters make the signal honest:

- engine progress is ``sglang:cuda_graph_passes_total`` summed over ``mode``: it grows by
  one on every prefill and every decode forward pass (with or without CUDA graphs),
  unlike ``realtime_tokens_total``, which moves only at log intervals;
- ``sglang:scheduler_idle_seconds_total`` (0.5.20+) is exported as
  ``scheduler_idle_seconds`` (a contract extension). SGLang adds to it, about once a
  second, only time with nothing running *or queued*, so it can never show requests
  queued on an idle engine; what it shows is that the queue was empty. The derivation
  therefore uses it the other way round: an engine whose idle counter grew within the last
  two seconds is not "queued", whatever its stale queue gauge says, and a stall counts only
  once it has gone two seconds without such a report (then from its start; see
  ``inferwatch.collect.derive``). ``forward_execution_seconds_total`` (busy GPU time) would be the
  better progress signal, but SGLang only records it with
  ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1``, so it is not relied on.

Releases before ``cuda_graph_passes_total`` have no per-step counter: ``engine_steps`` is
absent there, and queued-while-idle needs NVML.

Other mappings: ``kv_cache_usage_ratio`` is ``token_usage`` (the fullest KV pool);
``preemptions`` is ``num_retracted_requests_total`` (the ``num_retracted_reqs`` gauge only
counts the last interval); prefix-cache queries are all ``prefill_effective_tokens_total``
modes and hits its ``device_hit`` mode (GPU radix cache, like vLLM's local hits), falling
back to ``prompt_tokens_total`` / ``cached_tokens_total`` on releases before it;
``frontend_cpu_seconds`` is ``process_cpu_seconds_total{component="tokenizer"}`` (the HTTP
server's process); prefill time is ``per_stage_req_latency_seconds{stage="prefill_forward"}``
(first forward to the end of the last prefill chunk); ``inter_token_latency_seconds`` falls
back to ``time_per_output_token_seconds`` (per-token, 2024 releases);
``request_time_per_output_token_seconds`` is the family of that name (after 0.5.20: per
request, (finished - first token) / (output tokens - 1)), never the per-token 2024 family;
``kv_cache_capacity_tokens`` is ``max_total_num_tokens`` (0.5.12+, the KV pool's size);
``http_requests`` is ``http_responses_total{endpoint,method,status_code}`` (the status code
grouped into its class), summed over endpoint and method for the inference API only
(``/v1/...`` but ``/v1/models``, and the native ``/generate``, ``/encode``, ``/classify``:
not ``/metrics``, ``/health``, ``/get_server_info``, ``/model_info``, ``/freeze_gc``...).

Absent, and why: ``requests_finished`` (``num_requests_total`` has no finish reason, only
aborts are counted apart); ``request_decode_time_seconds`` (no family); ``engine_step_tokens``
and ``engine_step_seconds`` (no per-step histogram: ``forward_execution_seconds_total`` is
busy time by forward mode, a counter, and ``per_stage_req_latency_seconds`` is per
request); the disaggregation queues are not added to ``requests_waiting`` (the grammar
queue is, and is ``requests_deferred``: a request whose grammar compiles waits, but not for
capacity); ``spec_decode_draft_tokens`` / ``spec_decode_accepted_tokens``
(SGLang exports no spec-decode counters, only gauges of the last interval:
``spec_accept_rate`` (accepted / proposed drafts), ``spec_accept_length`` (mean accepted
drafts + bonus token per forward), ``spec_block_accept_length``, ``spec_cap_length``, and the
settings ``spec_num_steps`` / ``spec_num_draft_tokens``; a rate cannot be summed into a
counter).
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import Feed, Profiler, Source, feed, feed_sum, inference_api


def _sglang_feed(key: str, name: str, **where: str) -> Feed:
    """A feed from ``sglang:<name>`` or, as the SMG router re-exposes it, ``sglang_<name>``."""
    return feed(key, *(Source(f"{prefix}{name}", where=where) for prefix in ("sglang:", "sglang_")))


# SGLang's native inference routes outside /v1/.
_INFERENCE = inference_api("/generate", "/encode", "/classify")


SGLANG = Backend(
    name="sglang",
    signature=("sglang:", "sglang_"),
    labels={"model_name": "model", "dp_rank": "engine", "status_code": "status"},
    version_path="/get_server_info",
    # The traces land in the server's SGLANG_TORCH_PROFILER_DIR (default /tmp).
    profiler=Profiler(enable="SGLANG_TORCH_PROFILER_DIR=DIR python -m sglang.launch_server ..."),
    feeds=(
        _sglang_feed("requests_running", "num_running_reqs"),
        # A request whose grammar compiles waits in a queue of its own: waiting, deferred.
        feed_sum(
            "requests_waiting",
            *(
                Source(f"{prefix}{name}")
                for prefix in ("sglang:", "sglang_")
                for name in ("num_queue_reqs", "num_grammar_queue_reqs")
            ),
        ),
        _sglang_feed("requests_deferred", "num_grammar_queue_reqs"),
        _sglang_feed("kv_cache_usage_ratio", "token_usage"),
        _sglang_feed("preemptions", "num_retracted_requests_total"),
        _sglang_feed("prompt_tokens", "prompt_tokens_total"),
        _sglang_feed("generation_tokens", "generation_tokens_total"),
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
        _sglang_feed("engine_steps", "cuda_graph_passes_total"),
        _sglang_feed("scheduler_idle_seconds", "scheduler_idle_seconds_total"),
        _sglang_feed("frontend_cpu_seconds", "process_cpu_seconds_total", component="tokenizer"),
        _sglang_feed("estimated_read_bytes", "estimated_read_bytes_per_gpu_total"),
        _sglang_feed("estimated_flops", "estimated_flops_per_gpu_total"),
        _sglang_feed("time_to_first_token_seconds", "time_to_first_token_seconds"),
        feed(
            "inter_token_latency_seconds",
            "sglang:inter_token_latency_seconds",
            "sglang_inter_token_latency_seconds",
            "sglang:time_per_output_token_seconds",
            "sglang_time_per_output_token_seconds",
        ),
        _sglang_feed("request_duration_seconds", "e2e_request_latency_seconds"),
        _sglang_feed("request_queue_time_seconds", "queue_time_seconds"),
        _sglang_feed(
            "request_prefill_time_seconds", "per_stage_req_latency_seconds", stage="prefill_forward"
        ),
        _sglang_feed("request_prompt_tokens", "prompt_tokens_histogram"),
        _sglang_feed("request_generation_tokens", "generation_tokens_histogram"),
        _sglang_feed(
            "request_time_per_output_token_seconds", "request_time_per_output_token_seconds"
        ),
        _sglang_feed("kv_cache_capacity_tokens", "max_total_num_tokens"),
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
