"""SGLang captures normalize to exactly the values on the page."""

from __future__ import annotations

import dataclasses

import pytest

from inferwatch.collect.backends import SGLANG, Backend, detect

from conftest import (
    assert_matches_oracle,
    captures_of,
    fixture_text,
    oracle_samples,
    page_value,
)

SGLANG_FIXTURES = captures_of("sglang")

FULL = "sglang-2026-09-dev-book-translator-full.prom"
QWOPUS = (("model", "Jackrong/Qwopus3.6-27B-v2-FP8"),)
DOCS = "sglang-0.3-docs-production_metrics.prom"
LLAMA31 = (("model", "meta-llama/Llama-3.1-8B-Instruct"),)

# Values read off the captures by hand: (fixture, contract key, labels, value).
SPOT_CHECKS = [
    (FULL, "requests_running", QWOPUS, 0.0),
    (FULL, "requests_waiting", QWOPUS, 0.0),
    (FULL, "requests_deferred", QWOPUS, 0.0),  # num_grammar_queue_reqs
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


def test_excerpt_histogram_cut_before_its_inf_bucket_is_left_out_and_the_page_kept() -> None:
    sample = SGLANG.normalize(fixture_text("sglang-0.4.4-pr4444-excerpt.prom"))
    assert "request_duration_seconds" not in sample.histograms
    (dropped,) = [d for d in sample.dropped if d.family == "sglang:e2e_request_latency_seconds"]
    assert dropped.detail.endswith("no +Inf bucket"), dropped
    assert sample.values  # the rest of the page


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


# The conftest oracle tests `where` by equality and keeps status codes as written: the
# HTTP feed is checked against the capture's lines below instead.
def without_http(backend: Backend) -> Backend:
    return dataclasses.replace(
        backend, feeds=tuple(f for f in backend.feeds if f.key != "http_requests")
    )


@pytest.mark.parametrize("fixture", SGLANG_FIXTURES)
def test_every_series_matches_an_independent_parse(fixture: str) -> None:
    assert_matches_oracle(without_http(SGLANG), fixture_text(fixture))


@pytest.mark.parametrize("fixture", SGLANG_FIXTURES)
def test_auto_detection_recognises_every_sglang_capture(fixture: str) -> None:
    assert detect(fixture_text(fixture)) is SGLANG


def test_kv_capacity_is_the_max_total_num_tokens_gauge() -> None:
    text = fixture_text(FULL)
    sample = SGLANG.normalize(text)
    want = page_value(text, "sglang:max_total_num_tokens")
    assert want == 125292.0
    assert sample.values["kv_cache_capacity_tokens"] == {QWOPUS: want}


def test_kv_capacity_reads_the_smg_router_prefix_too() -> None:
    sample = SGLANG.normalize('sglang_max_total_num_tokens{model_name="m",tp_rank="0"} 4096.0\n')
    assert sample.values["kv_cache_capacity_tokens"] == {(("model", "m"),): 4096.0}


def test_http_requests_count_inference_responses_by_status_class() -> None:
    text = fixture_text(FULL)
    sample = SGLANG.normalize(text)
    chat = page_value(
        text,
        "sglang:http_responses_total",
        endpoint="/v1/chat/completions",
        method="POST",
        status_code="200",
    )
    assert chat == 2.0
    # /model_info, /v1/models, /freeze_gc and /get_server_info answered 200 too: left out.
    every = sum(v for _, v in oracle_samples(text)["sglang:http_responses_total"])
    assert every == 6.0
    assert sample.values["http_requests"] == {(*QWOPUS, ("status", "2xx")): chat}


def test_http_status_codes_are_grouped_into_classes() -> None:
    text = (
        'sglang:num_queue_reqs{model_name="m"} 1.0\n'
        'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="200"} 4.0\n'
        'sglang:http_responses_total{endpoint="/v1/completions",method="POST",status_code="200"} 3.0\n'
        'sglang:http_responses_total{endpoint="/v1/completions",method="POST",status_code="201"} 1.0\n'
        'sglang:http_responses_total{endpoint="/v1/completions",method="POST",status_code="400"} 2.0\n'
        'sglang:http_responses_total{endpoint="/v1/completions",method="POST",status_code="503"} 5.0\n'
        'sglang:http_responses_total{endpoint="/health",method="GET",status_code="503"} 90.0\n'
        'sglang:http_responses_total{endpoint="/metrics",method="GET",status_code="200"} 90.0\n'
    )
    assert SGLANG.normalize(text).values["http_requests"] == {
        (("model", "m"), ("status", "2xx")): 8.0,
        (("model", "m"), ("status", "4xx")): 2.0,
        (("model", "m"), ("status", "5xx")): 5.0,
    }


@pytest.mark.parametrize("code", ["2OO", "600", "099", "OK", "2000"])
def test_http_status_code_that_is_no_status_leaves_the_family_out(code: str) -> None:
    text = (
        'sglang:num_queue_reqs{model_name="m"} 1.0\n'
        'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="200"} 4.0\n'
        f'sglang:http_responses_total{{endpoint="/generate",method="POST",status_code="{code}"}} 1\n'
    )
    sample = SGLANG.normalize(text)
    assert "http_requests" not in sample.values
    assert sample.values["requests_waiting"] == {(("model", "m"),): 1.0}
    assert [d.family for d in sample.dropped] == ["sglang:http_responses_total"]


def test_request_tpot_is_the_per_request_family_not_the_2024_per_token_one() -> None:
    # The 2024 time_per_output_token_seconds is per token (it is the ITL above).
    docs = SGLANG.normalize(fixture_text(DOCS))
    assert "inter_token_latency_seconds" in docs.histograms
    assert "request_time_per_output_token_seconds" not in docs.histograms
    # No capture has the per-request family yet (>0.5.20; the 2026 capture had only
    # non-streaming requests): its shape per the 0.5.23 metrics_collector.
    labels = 'engine_type="unified",is_streaming="true",model_name="m"'
    name = "sglang:request_time_per_output_token_seconds"
    text = (
        f'{name}_bucket{{{labels},le="0.02"}} 3.0\n'
        f'{name}_bucket{{{labels},le="+Inf"}} 4.0\n'
        f"{name}_sum{{{labels}}} 0.11\n"
        f"{name}_count{{{labels}}} 4.0\n"
    )
    tpot = SGLANG.normalize(text).histograms["request_time_per_output_token_seconds"]
    assert tpot[(("model", "m"),)].buckets == (("0.02", 3.0), ("+Inf", 4.0))
    assert (tpot[(("model", "m"),)].sum, tpot[(("model", "m"),)].count) == (0.11, 4.0)


def test_spec_decode_gauges_are_not_the_token_counters() -> None:
    text = fixture_text(FULL)
    assert "sglang:spec_accept_rate{" in text and "sglang:spec_accept_length{" in text
    sample = SGLANG.normalize(text)
    assert not {"spec_decode_draft_tokens", "spec_decode_accepted_tokens"} & set(sample.values)


def test_a_request_whose_grammar_compiles_waits_deferred() -> None:
    # SGLang keeps them in a queue of their own: waiting (3 + 2), of which 2 deferred.
    for prefix in ("sglang:", "sglang_"):
        text = (
            f'{prefix}num_queue_reqs{{model_name="m"}} 3.0\n'
            f'{prefix}num_grammar_queue_reqs{{model_name="m"}} 2.0\n'
        )
        sample = SGLANG.normalize(text)
        assert sample.values["requests_waiting"] == {(("model", "m"),): 5.0}
        assert sample.values["requests_deferred"] == {(("model", "m"),): 2.0}
    # An older SGLang without the grammar queue: the queue alone, nothing deferred.
    sample = SGLANG.normalize('sglang:num_queue_reqs{model_name="m"} 3.0\n')
    assert sample.values["requests_waiting"] == {(("model", "m"),): 3.0}
    assert "requests_deferred" not in sample.values


# Disaggregated prefill/decode: pages built from SGLang 0.5.23's own definitions (no public
# capture of a PD pair's page was found), marked synthetic in their first line.
PD_PREFILL = "sglang-0.5.23-synthetic-pd-prefill.prom"
PD_DECODE = "sglang-0.5.23-synthetic-pd-decode.prom"
QWEN3 = (("model", "Qwen/Qwen3-8B"),)


def test_pd_prefill_converts_ms_and_mib_to_seconds_and_bytes() -> None:
    text = fixture_text(PD_PREFILL)
    sample = SGLANG.normalize(text)
    seconds = sample.histograms["kv_transfer_seconds"][QWEN3]
    # kv_transfer_latency_ms: 3.2, 7.9 and 41.0 ms; its bounds in seconds (1 ms -> 0.001).
    assert seconds.count == 3.0
    assert seconds.sum == pytest.approx(
        page_value(text, "sglang:kv_transfer_latency_ms_sum") / 1000
    )
    assert seconds.buckets[:3] == (("0.001", 0.0), ("0.002", 0.0), ("0.005", 1.0))
    assert seconds.buckets[-2:] == (("5.0", 3.0), ("+Inf", 3.0))
    # kv_transfer_total_mb_sum 75 MiB (SGLang divides bytes by 1024**2).
    assert sample.values["kv_transfer_bytes"] == {QWEN3: 75 * 1024.0**2}
    boot = sample.histograms["kv_transfer_bootstrap_seconds"][QWEN3]
    assert (boot.count, boot.sum) == (3.0, pytest.approx(0.1335))
    assert sample.values["kv_transfer_failures"] == {QWEN3: 1.0}  # bootstrap 1, transfer none
    # bootstrap queue 2, inflight 1; the decode queues (0 here) are not a prefill's.
    assert sample.values["kv_transfer_requests_waiting"] == {
        (*QWEN3, ("stage", "pending")): 2.0,
        (*QWEN3, ("stage", "transferring")): 1.0,
    }
    # The disaggregation queues are not the waiting queue: num_queue_reqs alone.
    assert sample.values["requests_waiting"] == {QWEN3: 3.0}


def test_pd_decode_reads_its_queues_and_leaves_out_histograms_without_samples() -> None:
    sample = SGLANG.normalize(fixture_text(PD_DECODE))
    assert sample.values["kv_transfer_requests_waiting"] == {
        (*QWEN3, ("stage", "pending")): 4.0,  # decode prealloc queue
        (*QWEN3, ("stage", "transferring")): 2.0,  # decode transfer queue
    }
    assert sample.values["kv_transfer_failures"] == {QWEN3: 1.0}
    for key in ("kv_transfer_seconds", "kv_transfer_bootstrap_seconds"):
        assert key not in sample.histograms, key
    # No family: absent on every SGLang page.
    for key in ("kv_transfer_bytes", "kv_transfer_expired_requests", "kv_transfer_prompt_tokens"):
        assert key not in sample.values, key


def test_a_server_not_disaggregated_writes_the_pd_queues_at_zero_and_they_stay_absent() -> None:
    text = fixture_text(FULL)  # real: engine_type="unified", all four PD queue gauges 0.0
    assert page_value(text, "sglang:num_prefill_bootstrap_queue_reqs") == 0.0
    assert page_value(text, "sglang:num_decode_transfer_queue_reqs") == 0.0
    assert "kv_transfer_requests_waiting" not in SGLANG.normalize(text).values


@pytest.mark.parametrize(
    "fixture", [f for f in SGLANG_FIXTURES if f not in (PD_PREFILL, PD_DECODE)]
)
def test_without_disaggregation_families_the_transfer_series_are_absent(fixture: str) -> None:
    sample = SGLANG.normalize(fixture_text(fixture))
    found = [k for k in (*sample.values, *sample.histograms) if k.startswith("kv_transfer_")]
    assert not found, found


@pytest.mark.parametrize(
    ("capture", "role"),
    [
        ("sglang-0.5.23-synthetic-pd-prefill.prom", "prefill"),
        ("sglang-0.5.23-synthetic-pd-decode.prom", "decode"),
        # engine_type="unified": a server that runs both phases.
        ("sglang-0.5.1-issue13485-excerpt.prom", "both"),
    ],
)
def test_engine_type_says_the_servers_role(capture: str, role: str) -> None:
    assert SGLANG.role_of is not None and SGLANG.role_of(fixture_text(capture)) == role
