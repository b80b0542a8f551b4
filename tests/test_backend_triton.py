"""Triton (and TensorRT-LLM) captures normalize to exactly the values on the page."""

from __future__ import annotations

import pytest

from inferwatch.collect.backends import TRITON, detect

from conftest import FIXTURES, assert_matches_oracle, fixture_text

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
    assert_matches_oracle(TRITON, page)


def test_what_triton_does_not_provide_is_absent() -> None:
    sample = TRITON.normalize(fixture_text(PENDING))
    assert set(sample.values) == {"requests_waiting", "engine_steps"}
    assert not sample.histograms  # µs counters are means, not histograms
    assert sample.version == ""


@pytest.mark.parametrize("fixture", TRITON_FIXTURES)
def test_every_series_matches_an_independent_parse(fixture: str) -> None:
    assert_matches_oracle(TRITON, fixture_text(fixture))


@pytest.mark.parametrize("fixture", TRITON_FIXTURES)
def test_auto_detection_recognises_every_triton_capture(fixture: str) -> None:
    assert detect(fixture_text(fixture)) is TRITON
