"""Triton (and TensorRT-LLM) captures normalize to exactly the values on the page."""

from __future__ import annotations

import dataclasses

import pytest

from inferwatch.collect.backends import TRITON, Backend, detect

from conftest import FIXTURES, assert_matches_oracle, fixture_text, page_value

TRITON_FIXTURES = sorted(p.name for p in FIXTURES.glob("triton*.prom"))

TRTLLM = "triton-trtllm-23.11-readme.prom"
T = (("model", "tensorrt_llm"),)
PENDING = "triton-2.51.0-pytriton-cpu-4-pending.prom"
TINY = (("model", "tiny"),)

# Values read off the captures by hand: (fixture, contract key, series).
SPOT_CHECKS = [
    (TRTLLM, "requests_waiting", {T: 1.0}),
    (TRTLLM, "requests_running", {T: 0.0}),
    (TRTLLM, "kv_cache_usage_ratio", {T: 0.4875}),
    (TRTLLM, "engine_steps", {T: 0.0}),
    # Plain Triton (a Python model): Triton's own queue and model executions.
    (PENDING, "requests_waiting", {TINY: 4.0}),
    (PENDING, "engine_steps", {TINY: 1.0}),
    (
        # One series per model of the ensemble; decoupled postprocessing runs per token.
        "triton-trtllm-2024-12-tensorrtllm_backend-issue667-excerpt.prom",
        "engine_steps",
        {
            (("model", "ensemble"),): 232.0,
            (("model", "postprocessing"),): 11041.0,
            (("model", "preprocessing"),): 232.0,
            (("model", "tensorrt_llm_bls"),): 0.0,
            (("model", "tensorrt_llm"),): 232.0,
        },
    ),
]


@pytest.mark.parametrize(("fixture", "key", "series"), SPOT_CHECKS)
def test_spot_values(fixture: str, key: str, series: dict) -> None:
    assert TRITON.normalize(fixture_text(fixture)).values[key] == series


def test_trt_llm_queue_wins_over_tritons_own() -> None:
    # Both on one page: the executor's queue is the LLM queue (a decoupled TRT-LLM model
    # takes requests off Triton's queue at once).
    sample = TRITON.normalize(fixture_text(TRTLLM))
    assert sample.values["requests_waiting"] == {T: 1.0}  # not pending_request_count 0
    assert sample.model == "tensorrt_llm"


def test_trt_llm_build_without_a_waiting_label_leaves_the_queue_absent() -> None:
    page = (
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 3\n'
        'nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 0\n'
    )
    sample = TRITON.normalize(page)
    assert sample.values["requests_running"] == {T: 3.0}
    assert "requests_waiting" not in sample.values


def test_first_response_histogram_becomes_ttft_in_seconds() -> None:
    # Shape of Triton's opt-in histogram (--metrics-config histogram_latencies=true).
    labels = 'model="tensorrt_llm",version="1"'
    page = (
        "# TYPE nv_inference_first_response_histogram_ms histogram\n"
        f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="100"}} 8\n'
        f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="500"}} 30\n'
        f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="+Inf"}} 37\n'
        f"nv_inference_first_response_histogram_ms_sum{{{labels}}} 10771\n"
        f"nv_inference_first_response_histogram_ms_count{{{labels}}} 37\n"
    )
    ttft = TRITON.normalize(page).histograms["time_to_first_token_seconds"][T]
    assert ttft.buckets == (("0.1", 8.0), ("0.5", 30.0), ("+Inf", 37.0))
    assert (ttft.sum, ttft.count) == (10.771, 37.0)
    assert_matches_oracle(without_capacity(TRITON), page)


def test_what_triton_does_not_provide_is_absent() -> None:
    sample = TRITON.normalize(fixture_text(PENDING))
    assert set(sample.values) == {"requests_waiting", "engine_steps"}
    assert not sample.histograms  # µs counters are means, not histograms
    assert sample.version == ""


# The conftest oracle reads each sample's own value; the KV capacity is a product of two
# series, checked against the capture's lines below instead.
def without_capacity(backend: Backend) -> Backend:
    return dataclasses.replace(
        backend, feeds=tuple(f for f in backend.feeds if f.key != "kv_cache_capacity_tokens")
    )


@pytest.mark.parametrize("fixture", TRITON_FIXTURES)
def test_every_series_matches_an_independent_parse(fixture: str) -> None:
    assert_matches_oracle(without_capacity(TRITON), fixture_text(fixture))


@pytest.mark.parametrize("fixture", TRITON_FIXTURES)
def test_auto_detection_recognises_every_triton_capture(fixture: str) -> None:
    assert detect(fixture_text(fixture)) is TRITON


def test_kv_capacity_is_max_blocks_times_tokens_per_block() -> None:
    text = fixture_text(TRTLLM)
    family = "nv_trt_llm_kv_cache_block_metrics"
    blocks = page_value(text, family, kv_cache_block_type="max")
    per_block = page_value(text, family, kv_cache_block_type="tokens_per")
    assert (blocks, per_block) == (6239.0, 64.0)
    sample = TRITON.normalize(text)
    assert sample.values["kv_cache_capacity_tokens"] == {T: blocks * per_block}


def test_kv_capacity_is_absent_without_both_factors() -> None:
    for fixture in (PENDING, "triton-trtllm-2024-12-tensorrtllm_backend-issue667-excerpt.prom"):
        assert "kv_cache_capacity_tokens" not in TRITON.normalize(fixture_text(fixture)).values
    labels = 'model="tensorrt_llm",version="1"'
    page = f'nv_trt_llm_kv_cache_block_metrics{{{labels},kv_cache_block_type="max"}} 6239\n'
    sample = TRITON.normalize(page)
    assert "kv_cache_capacity_tokens" not in sample.values
    assert sample.dropped == ()


@pytest.mark.parametrize(
    ("blocks", "per_block"), [("NaN", "64"), ("6239", "-64"), ("+Inf", "64"), ("1e200", "1e200")]
)
def test_kv_capacity_from_unusable_values_is_absent(blocks: str, per_block: str) -> None:
    labels = 'model="tensorrt_llm",version="1"'
    page = (
        f'nv_trt_llm_request_metrics{{{labels},request_type="waiting"}} 2\n'
        f'nv_trt_llm_kv_cache_block_metrics{{{labels},kv_cache_block_type="max"}} {blocks}\n'
        f'nv_trt_llm_kv_cache_block_metrics{{{labels},kv_cache_block_type="tokens_per"}} '
        f"{per_block}\n"
    )
    sample = TRITON.normalize(page)
    assert "kv_cache_capacity_tokens" not in sample.values
    assert sample.values["requests_waiting"] == {T: 2.0}
    assert [d.kind for d in sample.dropped] == ["invalid value"]


def test_kv_capacity_pairs_the_factors_of_each_model() -> None:
    factors = [("a", "max", 10), ("b", "tokens_per", 32), ("a", "tokens_per", 64)]
    factors += [("b", "max", 100), ("c", "max", 5)]  # model c has no block size: absent
    page = "".join(
        f'nv_trt_llm_kv_cache_block_metrics{{model="{m}",version="1",kv_cache_block_type="{t}"}}'
        f" {v}\n"
        for m, t, v in factors
    )
    assert TRITON.normalize(page).values["kv_cache_capacity_tokens"] == {
        (("model", "a"),): 640.0,
        (("model", "b"),): 3200.0,
    }
