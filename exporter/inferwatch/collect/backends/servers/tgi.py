"""Hugging Face Text Generation Inference (TGI 1.x -> 3.x router).

Scrape the main HTTP port (``--port``; 80 in the Docker image, 3000 by default): its
``/metrics`` is the only working one. ``--prometheus-port`` (9000, v3.3+) is bound at start
but never served. Sample of what it maps, in the shape TGI's renderer (Rust
``metrics-exporter-prometheus``) writes: no label but ``method`` on batch families, counters
without ``_total``, integer counter values; the model comes from ``GET /info`` ->
``model_id`` (``M`` below) and the version from its ``version``::

    tgi_queue_size 3
    tgi_batch_current_size 4
    tgi_batch_inference_count{method="decode"} 292
    tgi_batch_inference_count{method="prefill"} 1
    tgi_request_input_length_sum 4096
    tgi_request_queue_duration_bucket{le="0.0003375"} 2

becomes::

    inferwatch_requests_waiting{backend="tgi",model="M"} 3.0
    inferwatch_requests_running{backend="tgi",model="M"} 4.0
    inferwatch_engine_steps_total{backend="tgi",model="M"} 293.0
    inferwatch_prompt_tokens_total{backend="tgi",model="M"} 4096.0
    inferwatch_request_queue_time_seconds_bucket{backend="tgi",model="M",le="0.0003375"} 2.0

``requests_finished`` adds TGI's successes and its failures by kind (:data:`FAILURES`):
``tgi_request_success`` has no finish reason (stop or length), so its requests count under
``reason="success"``. A failure is the server's (``reason="error"``: ``overloaded``, a refusal
when its queue is full; ``generation`` and ``incomplete``, a shard's fault) or the client's
(``dropped``: it went away, ``reason="abort"``); ``validation`` and ``template`` (the request
itself was wrong) are the client's errors and are not counted, as vLLM does not count a
request its API server rejects: the errors objective is the server's own.

``engine_steps`` sums ``tgi_batch_inference_count`` over ``method`` (one increment per
prefill or decode forward of the running batch). Token counters are the sums of the
per-request histograms: prompt tokens are counted when a request is validated, generated
tokens when it finishes.

``engine_step_seconds{kind}`` is ``tgi_batch_inference_duration`` by ``method`` (its
``method`` is the contract's ``kind``; ``tgi_batch_forward_duration``, the model's forward
alone, where a release lacks it): the time of one inference call of the running batch. A
decode step gives every running request its next token, so its duration is the batch's
per-token latency as the server measures it; prefill steps are what a first token waits
for after the queue. Per step, not per request: it misses the time a request's decode
waits behind another's prefill (the request's own inter-token gaps, which only a client
or the canary sees).

Absent, and why:

- ``time_to_first_token_seconds``: TGI has no TTFT histogram. The closest signals are
  ``tgi_request_queue_duration`` (re-exported as queue time) plus the per-*batch*
  ``tgi_batch_inference_duration{method="prefill"}``; their sum is an estimate, not a
  per-request TTFT, so it is not exported under the contract name.
- ``inter_token_latency_seconds``: ``tgi_request_mean_time_per_token_duration`` is a
  request's inference time (prefill included) over its tokens, so it overstates the decode
  latency of short outputs; ``tgi_batch_inference_duration{method="decode"}`` is per batch
  step and misses decode stalls behind prefills. Neither is a per-token latency.
- ``request_time_per_output_token_seconds``: for the same reason,
  ``tgi_request_mean_time_per_token_duration`` (prefill included) is not the contract's
  TPOT (decode time over the tokens after the first).
- ``request_prefill_time_seconds`` / ``request_decode_time_seconds``: only per-batch
  durations exist (``engine_step_seconds`` above).
- ``kv_cache_usage_ratio``: ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens`` is
  the token budget the batch reserves, not KV blocks in use: they are mapped under their own
  names, ``batch_reserved_tokens`` and ``batch_token_budget`` (TGI's admission limit, the
  role KV-cache use plays for vLLM's scheduler). The budget gauge exists on the v3 backend
  (2.3.1+) and is set at start-up, often before the metrics recorder is installed: many
  pages lack it (the real page in tests/fixtures does).
- ``preemptions``, ``prefix_cache_*``, ``engine_step_tokens``, ``frontend_cpu_seconds``:
  not exposed (``tgi_batch_next_size`` counts requests per new batch, not tokens per step).
- ``kv_cache_capacity_tokens``: ``tgi_batch_max_total_tokens`` (v3 backend, 2.3.1+) is the
  batch token budget, which an operator can set below what the KV cache holds; no capture.
- ``spec_decode_*``: ``tgi_request_skipped_tokens`` (a summary of speculated tokens per
  request) does not say how many drafts were proposed and accepted.
- ``http_requests``: TGI counts requests (``tgi_request_count``, ``tgi_request_success``,
  ``tgi_request_failure{err}``), not HTTP status classes.
"""

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import Source, feed, feed_sum

_KIND = {"method": "kind"}  # prefill or decode
# tgi_request_failure's err -> the finish reason it counts under (the rest are not counted).
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
        feed("engine_steps", "tgi_batch_inference_count"),
        feed("prompt_tokens", "tgi_request_input_length_sum"),
        feed("generation_tokens", "tgi_request_generated_tokens_sum"),
        feed("request_duration_seconds", "tgi_request_duration"),
        feed("request_queue_time_seconds", "tgi_request_queue_duration"),
        feed("request_prompt_tokens", "tgi_request_input_length"),
        feed("request_generation_tokens", "tgi_request_generated_tokens"),
        feed("batch_reserved_tokens", "tgi_batch_current_max_tokens"),
        feed_sum(
            "requests_finished",
            Source("tgi_request_success", constant={"reason": "success"}),
            Source(
                "tgi_request_failure",
                where={"err": FAILURES.__contains__},
                labels={"err": "reason"},
                values={"reason": FAILURES},
            ),
        ),
        feed("batch_token_budget", "tgi_batch_max_total_tokens"),
        feed(
            "engine_step_seconds",
            Source("tgi_batch_inference_duration", labels=_KIND),
            Source("tgi_batch_forward_duration", labels=_KIND),
        ),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = TGI
