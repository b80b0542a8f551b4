"""NVIDIA Triton Inference Server, with or without the TensorRT-LLM backend.

Triton serves metrics on their own port, **8002** (``--metrics-port``), not on the HTTP
port 8000: point ``--backend-url`` at ``http://host:8002``. Every per-model series carries
``model`` and ``version`` labels; ``model`` is kept (an ensemble shows one series per
step: ``ensemble``, ``preprocessing``, ``tensorrt_llm``, ...), ``version`` is dropped.
Sample of what it maps (TensorRT-LLM backend, README of tensorrtllm_backend; ``M`` stands
for ``model="tensorrt_llm",version="1"``)::

    nv_trt_llm_request_metrics{M,request_type="waiting"} 1
    nv_trt_llm_kv_cache_block_metrics{M,kv_cache_block_type="fraction"} 0.4875
    nv_trt_llm_kv_cache_block_metrics{M,kv_cache_block_type="tokens_per"} 64
    nv_trt_llm_kv_cache_block_metrics{M,kv_cache_block_type="max"} 6239
    nv_trt_llm_general_metrics{M,general_type="iteration_counter"} 0

becomes::

    inferwatch_requests_waiting{backend="triton",model="tensorrt_llm"} 1.0
    inferwatch_kv_cache_usage_ratio{backend="triton",model="tensorrt_llm"} 0.4875
    inferwatch_kv_cache_capacity_tokens{backend="triton",model="tensorrt_llm"} 399296.0
    inferwatch_engine_steps_total{backend="triton",model="tensorrt_llm"} 0.0

With TensorRT-LLM, the ``nv_trt_llm_*`` gauges (refreshed from the executor's iteration
statistics) give the running batch (``request_type="active"``), the executor's queue
(``"waiting"``; builds without that label leave ``requests_waiting`` absent rather than
fall back to Triton's own queue, which a decoupled TensorRT-LLM model bypasses), KV usage
(``kv_cache_block_type="fraction"``), KV capacity in tokens (``"max"`` blocks x
``"tokens_per"`` block) and engine progress (``general_type=
"iteration_counter"``, the executor's iteration number). Without TensorRT-LLM (any other
backend), the queue is ``nv_inference_pending_request_count`` and engine progress is
``nv_inference_exec_count`` (one model execution per scheduled batch).

Latency histograms exist only when Triton runs with ``--metrics-config
histogram_latencies=true`` and is recent enough (the tritonserver 2.51 of nvidia-pytriton
0.7 has none): the time to first response of a streaming model,
``nv_inference_first_response_histogram_ms``, becomes ``time_to_first_token_seconds`` with
its bounds converted from ms to s. Token counts come from
the TensorRT-LLM histograms ``nv_llm_input_token_len`` / ``nv_llm_output_token_len`` (their
sums give the token counters; ensembles built before Nov 2024 lack them).

Absent, and why: request duration and queue time are cumulative microsecond counters
(``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``), which give
means (delta us / delta ``nv_inference_request_success``), not the contract's histograms;
inter-token latency, per-request time per output token, prefill and decode time have no
family; ``requests_finished`` has no
finish reason (``nv_inference_request_failure{reason}`` counts failures only);
``preemptions``, prefix-cache token counters (``kv_cache_block_type="reused"`` counts
blocks), ``engine_step_tokens``, ``engine_step_seconds`` (no per-iteration durations) and
``frontend_cpu_seconds`` are not exposed; Triton's own
``nv_gpu_*`` gauges are left to the NVML source; speculative decoding counters and
``http_requests`` (Triton counts successes and failures per model,
``nv_inference_request_success`` / ``nv_inference_request_failure{reason}``, not HTTP
status classes) are not exposed. There is no version endpoint on the
metrics port, so ``backend_info`` carries no version.
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
    labels={"model": "model"},
    feeds=(
        feed("requests_running", _trt_llm_gauge("request", request_type="active")),
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
        feed(
            "engine_steps",
            _trt_llm_gauge("general", general_type="iteration_counter"),
            "nv_inference_exec_count",
        ),
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
