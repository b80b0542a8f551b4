"""llama.cpp ``llama-server`` started with ``--metrics`` (2024 builds -> 2026), and forks
that keep its names (ik_llama.cpp).

No series carries a label, so the model comes from ``GET /v1/models`` -> ``data[0].id``
(the ``--alias``, else the model path) and the version from ``GET /props`` ->
``build_info``. Sample of what it maps (build b10380)::

    llamacpp:prompt_tokens_total 25
    llamacpp:tokens_predicted_total 200
    llamacpp:n_decode_total 202
    llamacpp:requests_processing 0
    llamacpp:spec_decode_num_draft_tokens_total 0

becomes::

    inferwatch_prompt_tokens_total{backend="llamacpp",model="tiny"} 25.0
    inferwatch_generation_tokens_total{backend="llamacpp",model="tiny"} 200.0
    inferwatch_engine_steps_total{backend="llamacpp",model="tiny"} 202.0
    inferwatch_requests_running{backend="llamacpp",model="tiny"} 0.0
    inferwatch_spec_decode_draft_tokens_total{backend="llamacpp",model="tiny"} 0.0

``engine_steps`` is ``n_decode_total`` (one ``llama_decode()`` call per batch step).
``requests_waiting`` is ``requests_deferred`` (tasks waiting for a free slot).
``kv_cache_usage_ratio`` is ``kv_cache_usage_ratio`` where a build still has it (before
May 2025, and the ik_llama.cpp fork). ``prefix_cache_hits`` is ``prompt_tokens_cached_total``
(2026 builds); those builds count only computed tokens in ``prompt_tokens_total``, so the
prefix-cache lookups are the sum of both and ``prefix_cache_queries`` is left absent rather
than exported as either one. ``spec_decode_draft_tokens`` / ``spec_decode_accepted_tokens``
are ``spec_decode_num_draft_tokens_total`` / ``spec_decode_num_accepted_tokens_total``
(2026 builds; 0 while speculative decoding is off).

Quirks handled:

- Builds from about b7010 to the fix of 2025-11-28 (issue ggml-org/llama.cpp#17384, PR
  #17386) sent the page JSON-escaped: one quoted string with ``\\n`` escapes. ``preprocess``
  decodes such a body before parsing.
- ``prompt_tokens_seconds`` and ``predicted_tokens_seconds`` are averaged over the window
  since the *previous scrape by anyone* and reset by each scrape: a sidecar and Prometheus
  scraping one server steal each other's windows. They are never read; rates come from the
  ``_total`` counters.
- ``n_busy_slots_per_decode`` is a cumulative average (typed counter until late 2025) and
  reads ``-nan(ind)`` on Windows before the first decode: not mapped.
- ``n_tokens_max`` (named ``n_past_max`` from Aug to Oct 2025) is a high-water mark, not a
  counter of anything in the contract: not mapped under either name.

Absent, and why: TTFT, inter-token latency, request duration, queue/prefill/decode time and
token-length histograms (llama-server has no histograms; ``prompt_seconds_total`` and
``tokens_predicted_seconds_total`` give mean prefill and decode speed per token, not
per-request distributions); ``preemptions``, ``requests_finished``,
``frontend_cpu_seconds``, ``engine_step_tokens`` and ``engine_step_seconds`` (not
exposed: the seconds counters are totals, not per-step durations);
``request_time_per_output_token_seconds`` (``tokens_predicted_seconds_total`` /
``tokens_predicted_total`` is an aggregate mean, not a per-request histogram);
``kv_cache_capacity_tokens`` (``kv_cache_tokens``, where a build has it, counts the tokens in
the cache, not its size; ``n_ctx`` is only in ``/props``); ``http_requests`` (no HTTP
counter).
"""

import json

from inferwatch.collect.backends.mapping import Backend
from inferwatch.collect.backends.table import feed
from inferwatch.collect.textparse import ExpositionError


def unescape_quoted_body(text: str) -> str:
    """The page itself when a build sent it as one JSON string (``"# HELP ...\\n..."``)."""
    stripped = text.strip()
    if not stripped.startswith('"'):
        return text
    try:
        page = json.loads(stripped)
    except ValueError:
        raise ExpositionError("body starts with a quote but is not a JSON string") from None
    if not isinstance(page, str):
        raise ExpositionError("body is JSON, not Prometheus text")
    return page


LLAMACPP = Backend(
    name="llamacpp",
    signature=("llamacpp:",),
    labels={},
    version_path="/props",
    version_field="build_info",
    model_path="/v1/models",
    model_field="data.0.id",
    preprocess=unescape_quoted_body,
    feeds=(
        feed("requests_running", "llamacpp:requests_processing"),
        feed("requests_waiting", "llamacpp:requests_deferred"),
        feed("kv_cache_usage_ratio", "llamacpp:kv_cache_usage_ratio"),
        feed("prompt_tokens", "llamacpp:prompt_tokens_total"),
        feed("generation_tokens", "llamacpp:tokens_predicted_total"),
        feed("prefix_cache_hits", "llamacpp:prompt_tokens_cached_total"),
        feed("engine_steps", "llamacpp:n_decode_total"),
        feed("spec_decode_draft_tokens", "llamacpp:spec_decode_num_draft_tokens_total"),
        feed("spec_decode_accepted_tokens", "llamacpp:spec_decode_num_accepted_tokens_total"),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = LLAMACPP
