"""NVIDIA Triton Inference Server, with or without the TensorRT-LLM backend, read on its
metrics port (8002). Sample (``M``: ``model="tensorrt_llm",version="1"``)::

    nv_trt_llm_request_metrics{M,request_type="waiting"} 1
    nv_trt_llm_kv_cache_block_metrics{M,kv_cache_block_type="tokens_per"} 64
    nv_trt_llm_kv_cache_block_metrics{M,kv_cache_block_type="max"} 6239
    nv_trt_llm_general_metrics{M,general_type="iteration_counter"} 0

becomes::

    inferwatch_requests_waiting{backend="triton",model="tensorrt_llm"} 1.0
    inferwatch_kv_cache_capacity_tokens{backend="triton",model="tensorrt_llm"} 399296.0
    inferwatch_engine_steps_total{backend="triton",model="tensorrt_llm"} 0.0

Absent, and why: request duration and queue time (microsecond counters give means, not
histograms); inter-token latency, time per output token, prefill and decode time (no
family); ``requests_finished`` (``nv_inference_request_failure`` counts failures only, no
finish reason); ``preemptions``, prefix-cache tokens (``kv_cache_block_type="reused"`` counts
blocks), ``engine_step_*``, ``frontend_cpu_seconds`` and ``spec_decode_*`` (not exposed);
``http_requests`` (successes and failures per model, not HTTP status classes). Triton's
``nv_gpu_*`` gauges are left to the NVML source.
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import Source, feed


def _trt_llm_gauge(family: str, **where: str) -> Source:
    """The series of a TensorRT-LLM gauge family, ``nv_trt_llm_<family>_metrics``, of one
    category (``request_type="active"``)."""
    return Source(f"nv_trt_llm_{family}_metrics", where=where)


TRITON = Backend(
    name="triton",
    signature=("nv_inference_", "nv_trt_llm_"),
    # model is kept (an ensemble shows one series per step), version dropped. No
    # version_path: the metrics port has no version endpoint.
    labels={"model": "model"},
    feeds=(
        feed("requests_running", _trt_llm_gauge("request", request_type="active")),
        # The executor's queue. A TensorRT-LLM page without "waiting" leaves it absent rather
        # than fall back to Triton's queue, which a decoupled TensorRT-LLM model bypasses.
        feed(
            "requests_waiting",
            _trt_llm_gauge("request", request_type="waiting"),
            "nv_inference_pending_request_count",
        ),
        feed(
            "kv_cache_usage_ratio", _trt_llm_gauge("kv_cache_block", kv_cache_block_type="fraction")
        ),
        feed(
            "kv_cache_capacity_tokens",
            Source(
                "nv_trt_llm_kv_cache_block_metrics",
                where={"kv_cache_block_type": "max"},
                times=_trt_llm_gauge("kv_cache_block", kv_cache_block_type="tokens_per"),
            ),
        ),
        feed("prompt_tokens", "nv_llm_input_token_len_sum"),
        feed("generation_tokens", "nv_llm_output_token_len_sum"),
        # The executor's iteration number; else one model execution per scheduled batch.
        feed(
            "engine_steps",
            _trt_llm_gauge("general", general_type="iteration_counter"),
            "nv_inference_exec_count",
        ),
        # A streaming model's time to first response, its bounds in ms.
        feed(
            "time_to_first_token_seconds",
            Source("nv_inference_first_response_histogram_ms", scale=0.001),
        ),
        feed("request_prompt_tokens", "nv_llm_input_token_len"),
        feed("request_generation_tokens", "nv_llm_output_token_len"),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = TRITON
