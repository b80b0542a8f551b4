"""SGLang captures normalize to exactly the values on the page."""

from __future__ import annotations

import math

import pytest

from inferwatch.collect.backends import SGLANG, detect

from conftest import FIXTURES, assert_matches_oracle, fixture_text

SGLANG_FIXTURES = sorted(p.name for p in FIXTURES.glob("sglang*.prom"))

FULL = "sglang-2026-09-dev-book-translator-full.prom"
QWOPUS = (("model", "Jackrong/Qwopus3.6-27B-v2-FP8"),)
DOCS = "sglang-0.3-docs-production_metrics.prom"
LLAMA31 = (("model", "meta-llama/Llama-3.1-8B-Instruct"),)

# Values read off the captures by hand: (fixture, contract key, labels, value).
SPOT_CHECKS = [
    (FULL, "requests_running", QWOPUS, 0.0),
    (FULL, "requests_waiting", QWOPUS, 0.0),
    (FULL, "kv_cache_usage_ratio", QWOPUS, 0.0),
    (FULL, "prompt_tokens", QWOPUS, 106.0),
    (FULL, "generation_tokens", QWOPUS, 12.0),
    # prefill_effective_tokens_total: input 106 + device_hit 0 + host_hit 0 + storage_hit 0.
    (FULL, "prefix_cache_queries", QWOPUS, 106.0),
    (FULL, "prefix_cache_hits", QWOPUS, 0.0),
    # cuda_graph_passes_total: prefill_cuda_graph 2 + decode_cuda_graph 8 forward passes.
    (FULL, "engine_steps", QWOPUS, 10.0),
    # process_cpu_seconds_total{component="tokenizer"}; the detokenizer's 0.06 s is not it.
    (FULL, "frontend_cpu_seconds", QWOPUS, 0.9500000000000011),
    (DOCS, "requests_running", LLAMA31, 162.0),
    (DOCS, "requests_waiting", LLAMA31, 2826.0),
    (DOCS, "kv_cache_usage_ratio", LLAMA31, 0.28),
    (DOCS, "prompt_tokens", LLAMA31, 8.128902e06),
    (DOCS, "generation_tokens", LLAMA31, 7.557572e06),
    (
        "sglang-0.4.4-pr4444-excerpt.prom",
        "requests_running",
        (("model", "/shared/public/models/Meta-Llama-3-8B-Instruct"),),
        0.0,
    ),
    ("sglang-0.5.1-issue13485-excerpt.prom", "requests_running", (("model", "Qwen-32B"),), 1.0),
    ("sglang-0.5.1-issue13485-excerpt.prom", "kv_cache_usage_ratio", (("model", "Qwen-32B"),), 0.0),
    (
        # SMG router re-export: sglang_ prefix, extra worker_addr label dropped.
        "sglang-smg-router-2026-03-pr813-underscore-excerpt.prom",
        "engine_steps",
        (("model", "meta-llama/Llama-3.1-8B-Instruct"),),
        311.0,
    ),
]


@pytest.mark.parametrize(("fixture", "key", "labels", "value"), SPOT_CHECKS)
def test_spot_values(fixture: str, key: str, labels: tuple, value: float) -> None:
    sample = SGLANG.normalize(fixture_text(fixture))
    assert sample.values[key] == {labels: value}


def test_histograms_sum_over_is_streaming_and_keep_sglang_buckets() -> None:
    sample = SGLANG.normalize(fixture_text(FULL))
    ttft = sample.histograms["time_to_first_token_seconds"][QWOPUS]
    assert (ttft.count, ttft.sum) == (2.0, 16.60163139598444)
    buckets = dict(ttft.buckets)
    assert (buckets["6.0"], buckets["8.0"], buckets["10.0"]) == (0.0, 1.0, 2.0)
    assert ttft.buckets[0] == ("0.1", 0.0) and ttft.buckets[-1] == ("+Inf", 2.0)
    queue = sample.histograms["request_queue_time_seconds"][QWOPUS]
    assert (queue.count, queue.sum) == (2.0, 0.002095199000905268)
    # per_stage_req_latency_seconds{stage="prefill_forward"} only, not request_process.
    prefill = sample.histograms["request_prefill_time_seconds"][QWOPUS]
    assert (prefill.count, prefill.sum) == (2.0, 8.95113145900541)
    assert sample.histograms["request_prompt_tokens"][QWOPUS].sum == 106.0
    # No streaming request yet: SGLang has not created the inter-token family.
    assert "inter_token_latency_seconds" not in sample.histograms


def test_2024_per_token_histogram_is_the_inter_token_latency() -> None:
    itl = SGLANG.normalize(fixture_text(DOCS)).histograms["inter_token_latency_seconds"][LLAMA31]
    assert (itl.count, itl.sum) == (7.400757e06, 866964.5791549598)
    assert itl.buckets[-1] == ("+Inf", 7.400757e06)


def test_excerpt_histogram_without_sum_or_count_is_kept_as_written() -> None:
    sample = SGLANG.normalize(fixture_text("sglang-0.4.4-pr4444-excerpt.prom"))
    model = (("model", "/shared/public/models/Meta-Llama-3-8B-Instruct"),)
    e2e = sample.histograms["request_duration_seconds"][model]
    assert e2e.buckets[0] == ("5.0", 1.0)
    assert math.isnan(e2e.sum) and math.isnan(e2e.count)


def test_data_parallel_rank_is_the_engine() -> None:
    sample = SGLANG.normalize(
        fixture_text("sglang-0.5.x-2025-09-aibrix-issue1614-dp8-excerpt.prom")
    )
    model = ("model", "deepseek-r1")
    assert sample.values["requests_waiting"] == {
        (model, ("engine", "1")): 0.0,
        (model, ("engine", "3")): 0.0,
    }


def test_what_sglang_does_not_provide_is_absent() -> None:
    sample = SGLANG.normalize(fixture_text(FULL))
    for key in ("requests_finished", "scheduler_idle_seconds", "preemptions"):
        assert key not in sample.values, key
    for key in ("request_decode_time_seconds", "engine_step_tokens"):
        assert key not in sample.histograms, key


def test_scheduler_idle_counter_and_retractions_are_read_where_published() -> None:
    labels = 'engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"'
    sample = SGLANG.normalize(
        f"sglang:scheduler_idle_seconds_total{{{labels}}} 12.5\n"
        f"sglang:num_retracted_requests_total{{{labels}}} 3.0\n"
        f"sglang:num_retracted_reqs{{{labels}}} 1.0\n"
    )
    assert sample.values["scheduler_idle_seconds"] == {(("model", "m"),): 12.5}
    assert sample.values["preemptions"] == {(("model", "m"),): 3.0}


@pytest.mark.parametrize("fixture", SGLANG_FIXTURES)
def test_every_series_matches_an_independent_parse(fixture: str) -> None:
    assert_matches_oracle(SGLANG, fixture_text(fixture))


@pytest.mark.parametrize("fixture", SGLANG_FIXTURES)
def test_auto_detection_recognises_every_sglang_capture(fixture: str) -> None:
    assert detect(fixture_text(fixture)) is SGLANG
