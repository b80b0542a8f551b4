"""llama.cpp's ``llama-server`` (2024 -> 2026 builds) and forks that keep its names
(ik_llama.cpp). No series has a label: the model is ``GET /v1/models``' first id. Sample::

    llamacpp:prompt_tokens_total 25
    llamacpp:n_decode_total 202
    llamacpp:requests_processing 0

becomes::

    inferwatch_prompt_tokens_total{backend="llamacpp",model="tiny"} 25.0
    inferwatch_engine_steps_total{backend="llamacpp",model="tiny"} 202.0
    inferwatch_requests_running{backend="llamacpp",model="tiny"} 0.0

Not read: the rate gauges each scrape resets, so that two scrapers steal each other's
window (``prompt_tokens_seconds``, ``predicted_tokens_seconds``), the running average
``n_busy_slots_per_decode`` and the high-water mark ``n_tokens_max``.

Absent, and why: latency and token-length histograms, ``request_time_per_output_token_seconds``
included (llama-server has none: its seconds counters give mean speeds); ``preemptions``,
``requests_finished``, ``frontend_cpu_seconds``, ``engine_step_*`` (not exposed);
``kv_cache_capacity_tokens`` (``kv_cache_tokens`` counts the tokens in the cache, and
``n_ctx`` is only in ``/props``); ``http_requests`` (no HTTP counter).
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
    # Builds from about b7010 to 2025-11-28 sent the page JSON-escaped (ggml-org/llama.cpp#17384).
    preprocess=unescape_quoted_body,
    feeds=(
        feed("requests_running", "llamacpp:requests_processing"),
        feed("requests_waiting", "llamacpp:requests_deferred"),  # waiting for a free slot
        feed("kv_cache_usage_ratio", "llamacpp:kv_cache_usage_ratio"),
        feed("prompt_tokens", "llamacpp:prompt_tokens_total"),
        feed("generation_tokens", "llamacpp:tokens_predicted_total"),
        # No prefix_cache_queries: where hits are counted, prompt_tokens_total counts only the
        # computed tokens, so the lookups are the sum of both rows, neither one alone.
        feed("prefix_cache_hits", "llamacpp:prompt_tokens_cached_total"),
        feed("engine_steps", "llamacpp:n_decode_total"),  # one llama_decode() per batch step
        feed("spec_decode_draft_tokens", "llamacpp:spec_decode_num_draft_tokens_total"),
        feed("spec_decode_accepted_tokens", "llamacpp:spec_decode_num_accepted_tokens_total"),
    ),
)

# The table the registry finds (collect/backends/__init__.py).
BACKEND = LLAMACPP
