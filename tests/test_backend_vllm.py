"""vLLM captures normalize to exactly the values on the page."""

from __future__ import annotations

import dataclasses

import pytest

from inferwatch.collect.backends import VLLM, Backend, Mapper, detect
from inferwatch.collect.textparse import ExpositionError
from inferwatch.metrics import BACKEND

from conftest import (
    assert_matches_oracle,
    captures_of,
    fixture_text,
    oracle_samples,
    page_value,
)

VLLM_FIXTURES = captures_of("vllm")
# A real prefill/decode pair on CPU, vLLM's disk connector between them.
PD_PREFILL = "vllm-0.32.0-cpu-pd-example-connector-prefill.prom"
PD_DECODE = "vllm-0.32.0-cpu-pd-example-connector-decode.prom"

E0 = (("model", "tiny"), ("engine", "0"))

# Values read off the captures by hand: (fixture, contract key, labels, value).
SPOT_CHECKS = [
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "requests_running", E0, 4.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "requests_waiting", E0, 20.0),
    # The 20 wait for capacity (reason="capacity" 20, "deferred" 0).
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "requests_deferred", E0, 0.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "kv_cache_usage_ratio", E0, 1.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "preemptions", E0, 13.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "prompt_tokens", E0, 10116.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "generation_tokens", E0, 2872.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "requests_finished", (*E0, ("reason", "length")), 12.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "engine_steps", E0, 496.0),
    ("vllm-0.32.0-cpu-loaded-kv-full.prom", "frontend_cpu_seconds", (("model", "tiny"),), 7.87),
    # lora-a's 3 run in the one adapter slot; lora-b's 3 wait for it: deferred, not capacity.
    ("vllm-0.32.0-cpu-lora-deferred.prom", "requests_running", E0, 3.0),
    ("vllm-0.32.0-cpu-lora-deferred.prom", "requests_waiting", E0, 3.0),
    ("vllm-0.32.0-cpu-lora-deferred.prom", "requests_deferred", E0, 3.0),
    # lora_requests_info has no model or engine label: the served model's, no engine.
    ("vllm-0.32.0-cpu-lora-deferred.prom", "lora_adapters_active", (("model", "tiny"),), 1.0),
    ("vllm-0.32.0-cpu-lora-deferred.prom", "lora_adapters_max", (("model", "tiny"),), 1.0),
    ("vllm-0.32.0-cpu-after-preemptions.prom", "preemptions", E0, 46.0),
    ("vllm-0.32.0-cpu-after-preemptions.prom", "prefix_cache_queries", E0, 13018.0),
    ("vllm-0.32.0-cpu-after-preemptions.prom", "prefix_cache_hits", E0, 12320.0),
    ("vllm-0.32.0-cpu-after-preemptions.prom", "requests_waiting", E0, 0.0),
    ("vllm-0.32.0-cpu-idle-after-load.prom", "generation_tokens", E0, 6176.0),
    ("vllm-0.32.0-cpu-idle-after-load.prom", "engine_steps", E0, 803.0),
    ("vllm-0.32.0-cpu-api-server-count-2-mfu.prom", "estimated_flops", E0, 4.713978112e09),
    ("vllm-0.32.0-cpu-api-server-count-2-mfu.prom", "estimated_read_bytes", E0, 1.022783744e09),
    (
        "vllm-0.32.0-cpu-api-server-count-2-mfu.prom",
        "frontend_cpu_seconds",
        (("model", "tiny"),),
        7.86,
    ),
    (
        "vllm-0.10.0-production-stack-issue617.prom",
        "kv_cache_usage_ratio",
        (("model", "zai-org/GLM-4.5"), ("engine", "0")),
        9.75010481363281e-06,
    ),
    (
        "vllm-0.10.0-production-stack-issue617.prom",
        "prefix_cache_queries",
        (("model", "zai-org/GLM-4.5"), ("engine", "0")),
        32.0,
    ),
    (
        # One of eight API-server processes holds the value; the stale ones read 0.
        "vllm-0.11.x-pr28792-api-server-count-pid-label.prom",
        "kv_cache_usage_ratio",
        (("model", "Qwen/Qwen3-VL-8B-Instruct"), ("engine", "0")),
        0.6530455880475035,
    ),
    (
        "vllm-0.20.x-2026-gie-issue2950-dp2-two-lines.prom",
        "requests_running",
        (("model", "deepseek-v4-flash-w8a8-mtp"), ("engine", "1")),
        0.0,
    ),
    (
        "vllm-v1-0.8.x-production-stack-issue318-excerpt.prom",
        "kv_cache_usage_ratio",
        (("model", "Qwen/Qwen2.5-Coder-32B-Instruct"),),
        0.0,
    ),
    (
        "vllm-v0-0.6.x-korean-grafana-guide.prom",
        "kv_cache_usage_ratio",
        (("model", "meta-llama/Llama-3.1-8B-Instruct"),),
        0.0,
    ),
]


@pytest.mark.parametrize(("fixture", "key", "labels", "value"), SPOT_CHECKS)
def test_spot_values(fixture: str, key: str, labels: tuple, value: float) -> None:
    sample = VLLM.normalize(fixture_text(fixture))
    assert sample.values[key][labels] == value


def test_histogram_keeps_backend_buckets_and_totals() -> None:
    sample = VLLM.normalize(fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom"))
    ttft = sample.histograms["time_to_first_token_seconds"][E0]
    assert ttft.count == 28.0
    assert ttft.sum == 1.0372936725616455
    bounds = [le for le, _ in ttft.buckets]
    assert bounds[:4] == ["0.001", "0.005", "0.01", "0.02"]
    assert bounds[-2:] == ["2560.0", "+Inf"]
    assert ttft.buckets[-1] == ("+Inf", 28.0)

    itl = VLLM.normalize(fixture_text("vllm-0.32.0-cpu-idle-after-load.prom"))
    hist = itl.histograms["inter_token_latency_seconds"][E0]
    assert (hist.count, hist.sum) == (6151.0, 12.12670722100006)


def test_data_parallel_histograms_are_judged_one_engine_at_a_time() -> None:
    """The excerpt's histograms are all cut (no +Inf bucket or no _sum): each engine's series
    is left out with its own cause, none is served incomplete."""
    sample = VLLM.normalize(fixture_text("vllm-0.10.x-pr22227-dp2-multiproc-excerpt.prom"))
    assert sample.histograms == {}
    causes = {d.detail.split("}: ")[0].split("engine=")[1]: d.detail for d in sample.dropped}
    assert sorted(d.detail.split("}: ")[1] for d in sample.dropped) == [
        "no +Inf bucket",
        "no +Inf bucket",
        "sum nan is not finite and >= 0",
        "sum nan is not finite and >= 0",
    ]
    assert set(causes) == {'"0"', '"1"'}


def test_v0_engine_uses_old_names_and_model_only_labels() -> None:
    sample = VLLM.normalize(fixture_text("vllm-v0-0.6.x-korean-grafana-guide.prom"))
    model = (("model", "meta-llama/Llama-3.1-8B-Instruct"),)
    assert sample.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert sample.values["requests_waiting"] == {model: 0.0}
    # v0 has only a hit-rate gauge (-1 when off), not the token counters: absent, not zero.
    assert "prefix_cache_hits" not in sample.values


def test_docs_snippet_without_inf_bucket_is_left_out() -> None:
    """The docs' histogram has no +Inf bucket: Prometheus' parser refuses it, so it is not
    served (the rest of the page is)."""
    sample = VLLM.normalize(fixture_text("vllm-docs-usage-metrics-snippet.prom"))
    assert "engine_step_tokens" not in sample.histograms
    assert [(d.family, d.detail.split(": ")[-1]) for d in sample.dropped] == [
        ("vllm:iteration_tokens_total", "no +Inf bucket")
    ]
    assert "engine_steps" not in sample.values


# Feeds the conftest oracle cannot read (it takes each sample's own value and tests `where`
# by equality): checked against the capture lines in the tests below instead.
DERIVED = ("kv_cache_capacity_tokens", "http_requests", "lora_adapters_active", "lora_adapters_max")


def without_derived(backend: Backend) -> Backend:
    return dataclasses.replace(
        backend, feeds=tuple(f for f in backend.feeds if f.key not in DERIVED)
    )


@pytest.mark.parametrize("fixture", VLLM_FIXTURES)
def test_every_series_matches_an_independent_parse(fixture: str) -> None:
    assert_matches_oracle(without_derived(VLLM), fixture_text(fixture))


def test_every_contract_key_the_feed_table_names_is_a_backend_series() -> None:
    for feed in VLLM.feeds:
        assert BACKEND[feed.key].kind is feed.kind


def test_new_name_wins_over_deprecated_one() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    sample = VLLM.normalize(text)
    assert sample.values["kv_cache_usage_ratio"] == {(("model", "m"), ("engine", "0")): 0.5}


def test_deprecated_name_used_when_alone() -> None:
    text = 'vllm:gpu_prefix_cache_hits_total{model_name="m"} 7\n'
    assert VLLM.normalize(text).values["prefix_cache_hits"] == {(("model", "m"),): 7.0}


def test_pid_label_is_dropped_and_series_merged() -> None:
    # Multiprocess mode (several API servers) gives gauges a pid label per process.
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="11"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="12"} 0.75\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m",pid="11"} 10\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m",pid="12"} 5\n'
    )
    sample = VLLM.normalize(text)
    key = (("model", "m"), ("engine", "0"))
    assert sample.values["kv_cache_usage_ratio"] == {key: 0.75}  # gauges: max
    assert sample.values["prompt_tokens"] == {key: 15.0}  # counters: sum


def test_a_busy_servers_pages_map_to_their_values_and_reuse_what_did_not_move() -> None:
    # The second page leaves a layout of the whole page; the third fits it and is mapped by
    # its plan: the moved gauge reads its new value, the unmoved histogram is the very
    # object of the last page (the latency window folds only what moved).
    page = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
    mapper = Mapper(VLLM)
    pages = [page.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 20.0',
        f'vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {n}.0',
    ) for n in (20, 21, 22, 23)]  # fmt: skip
    samples = [mapper.normalize(p) for p in pages]
    assert [s.values["requests_waiting"][E0] for s in samples] == [20.0, 21.0, 22.0, 23.0]
    ttft = [s.histograms["time_to_first_token_seconds"] for s in samples]
    assert ttft[3] is ttft[2]
    assert samples[3] == VLLM.normalize(pages[3])


def test_data_parallel_engines_stay_separate() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 4\n'
    )
    sample = VLLM.normalize(text)
    assert sample.values["requests_waiting"] == {
        (("model", "m"), ("engine", "0")): 3.0,
        (("model", "m"), ("engine", "1")): 4.0,
    }
    assert sample.total("requests_waiting") == 7.0


def test_page_without_vllm_metrics_is_an_error_that_says_so() -> None:
    with pytest.raises(ExpositionError, match="no vllm metrics"):
        VLLM.normalize('http_requests_total{handler="/v1/models"} 3\n')


def test_auto_detection_recognises_every_vllm_capture() -> None:
    for name in VLLM_FIXTURES:
        assert detect(fixture_text(name)) is VLLM, name


def test_histogram_with_a_bad_bound_is_left_out_and_said_so() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="soon",model_name="m"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4\n'
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5\n'
    )
    sample = VLLM.normalize(text)
    assert sample.values["requests_waiting"] == {(("model", "m"), ("engine", "0")): 2.0}
    assert set(sample.histograms) == {"time_to_first_token_seconds"}
    assert [d.detail for d in sample.dropped] == [
        "vllm:e2e_request_latency_seconds: bucket bound le='soon' is not a number; family left out"
    ]


VLLM_032 = [name for name in VLLM_FIXTURES if name.startswith("vllm-0.32.0-")]


def cache_config(fixture: str) -> dict[str, str]:
    """The labels of the capture's one vllm:cache_config_info line."""
    [(labels, value)] = oracle_samples(fixture_text(fixture))["vllm:cache_config_info"]
    assert value == 1.0
    return labels


@pytest.mark.parametrize("fixture", VLLM_032)
def test_kv_capacity_is_the_cache_configs_kv_cache_size_tokens(fixture: str) -> None:
    labels = cache_config(fixture)
    want = float(labels["kv_cache_size_tokens"])
    # The 0.32 label agrees with blocks x block size (so the fallback reads the same).
    assert want == float(labels["num_gpu_blocks"]) * float(labels["block_size"])
    sample = VLLM.normalize(fixture_text(fixture))
    assert sample.values["kv_cache_capacity_tokens"] == {E0: want}


def test_kv_capacity_of_the_overridden_cache_is_its_1024_tokens() -> None:
    # --num-gpu-blocks-override 32 --block-size 32: kv_cache_size_tokens="1024".
    sample = VLLM.normalize(fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom"))
    assert sample.values["kv_cache_capacity_tokens"] == {E0: 1024.0}


def test_kv_capacity_of_v0_is_gpu_blocks_times_block_size() -> None:
    # v0 has no kv_cache_size_tokens: num_gpu_blocks="2375" x block_size="16".
    fixture = "vllm-v0-0.6.x-korean-grafana-guide.prom"
    labels = cache_config(fixture)
    assert "kv_cache_size_tokens" not in labels
    assert (labels["num_gpu_blocks"], labels["block_size"]) == ("2375", "16")
    sample = VLLM.normalize(fixture_text(fixture))
    model = (("model", "meta-llama/Llama-3.1-8B-Instruct"),)
    assert sample.values["kv_cache_capacity_tokens"] == {model: 2375.0 * 16.0}


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        ('kv_cache_size_tokens="None",num_gpu_blocks="10",block_size="16"', 160.0),
        ('num_gpu_blocks="10",block_size="16"', 160.0),
        ('kv_cache_size_tokens="2048",num_gpu_blocks="None",block_size="16"', 2048.0),
    ],
)
def test_kv_capacity_falls_back_past_absent_labels(labels: str, want: float) -> None:
    text = f'vllm:cache_config_info{{engine="0",{labels}}} 1.0\n'
    sample = VLLM.normalize(text)
    assert sample.values["kv_cache_capacity_tokens"] == {
        (("model", "unknown"), ("engine", "0")): want
    }
    assert sample.dropped == ()


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        # vLLM 0.8.x: num_gpu_blocks="None" (vllm#16560); nothing to say, just absent.
        ('block_size="16",num_gpu_blocks="None"', False),
        ('block_size="16"', False),
        ("", False),
        ('block_size="16",num_gpu_blocks="many"', True),
        ('kv_cache_size_tokens="1k"', True),
        ('kv_cache_size_tokens="-1"', True),
        ('kv_cache_size_tokens="NaN"', True),
        ('kv_cache_size_tokens="+Inf"', True),
        ('block_size="1e200",num_gpu_blocks="1e200"', True),  # the product overflows
    ],
)
def test_kv_capacity_from_unusable_labels_is_absent(labels: str, said: bool) -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
        f'vllm:cache_config_info{{engine="0"{"," if labels else ""}{labels}}} 1.0\n'
    )
    sample = VLLM.normalize(text)
    assert "kv_cache_capacity_tokens" not in sample.values
    assert sample.values["requests_waiting"] == {(("model", "m"), ("engine", "0")): 2.0}
    assert [d.family for d in sample.dropped] == (["vllm:cache_config_info"] if said else [])


@pytest.mark.parametrize("fixture", VLLM_032)
def test_request_tpot_is_the_per_request_histogram(fixture: str) -> None:
    text = fixture_text(fixture)
    name = "vllm:request_time_per_output_token_seconds"
    tpot = VLLM.normalize(text).histograms["request_time_per_output_token_seconds"][E0]
    assert tpot.count == page_value(text, f"{name}_count")
    assert tpot.sum == page_value(text, f"{name}_sum")
    assert tpot.buckets[-1] == ("+Inf", page_value(text, f"{name}_bucket", le="+Inf"))


def test_request_tpot_is_absent_before_0_11_not_taken_from_the_per_token_histogram() -> None:
    text = fixture_text("vllm-0.10.0-production-stack-issue617.prom")
    assert "vllm:time_per_output_token_seconds_bucket" in text
    # The excerpt ends before the histogram's +Inf bucket, _count and _sum: completed here.
    labels = 'engine="0",model_name="zai-org/GLM-4.5"'
    text += (
        f'vllm:time_per_output_token_seconds_bucket{{{labels},le="+Inf"}} 1182.0\n'
        f"vllm:time_per_output_token_seconds_count{{{labels}}} 1182.0\n"
        f"vllm:time_per_output_token_seconds_sum{{{labels}}} 96.5\n"
    )
    sample = VLLM.normalize(text)
    assert "inter_token_latency_seconds" in sample.histograms
    assert "request_time_per_output_token_seconds" not in sample.histograms


def test_spec_decode_token_counters_of_a_real_ngram_run() -> None:
    # 9 drafts of 3 tokens proposed, none accepted (a random-weight model); the per-position
    # counters are not the contract's.
    text = fixture_text("vllm-0.32.0-cpu-ngram-spec-decode.prom")
    sample = VLLM.normalize(text)
    key = (("model", "tiny"), ("engine", "0"))
    drafted = page_value(text, "vllm:spec_decode_num_draft_tokens_total")
    assert drafted == 27.0
    assert sample.values["spec_decode_draft_tokens"] == {key: drafted}
    assert sample.values["spec_decode_accepted_tokens"] == {
        key: page_value(text, "vllm:spec_decode_num_accepted_tokens_total")
    }


def test_spec_decode_accepted_and_draft_are_not_swapped() -> None:
    labels = 'engine="0",model_name="m"'
    text = (
        f"vllm:spec_decode_num_drafts_total{{{labels}}} 40.0\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} 120.0\n"
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} 75.0\n"
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} 35.0\n'
    )
    sample = VLLM.normalize(text)
    key = (("model", "m"), ("engine", "0"))
    assert sample.values["spec_decode_draft_tokens"] == {key: 120.0}
    assert sample.values["spec_decode_accepted_tokens"] == {key: 75.0}


def test_spec_decode_is_absent_without_a_draft_model() -> None:
    sample = VLLM.normalize(fixture_text("vllm-0.32.0-cpu-idle-after-load.prom"))
    assert not {"spec_decode_draft_tokens", "spec_decode_accepted_tokens"} & set(sample.values)


def test_http_requests_by_status_class_from_the_instrumentator() -> None:
    # Two API servers; 20 requests refused with 4xx, 21 answered.
    text = fixture_text("vllm-0.32.0-cpu-api-server-count-2-mfu.prom")
    sample = VLLM.normalize(text)
    handler = {"handler": "/v1/completions", "method": "POST"}
    assert sample.values["http_requests"] == {
        (("model", "tiny"), ("status", "2xx")): page_value(
            text, "http_requests_total", **handler, status="2xx"
        ),
        (("model", "tiny"), ("status", "4xx")): page_value(
            text, "http_requests_total", **handler, status="4xx"
        ),
    }
    assert sample.values["http_requests"][(("model", "tiny"), ("status", "4xx"))] == 20.0


def test_http_requests_count_the_inference_api_only_summed_over_handler_and_method() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
        'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 5.0\n'
        'http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 7.0\n'
        'http_requests_total{handler="/v1/chat/completions",method="POST",status="5xx"} 1.0\n'
        'http_requests_total{handler="/invocations",method="POST",status="2xx"} 2.0\n'
        'http_requests_total{handler="/v1/models",method="GET",status="2xx"} 900.0\n'
        'http_requests_total{handler="/metrics",method="GET",status="2xx"} 900.0\n'
        'http_requests_total{handler="/health",method="GET",status="5xx"} 900.0\n'
        'http_requests_total{handler="/version",method="GET",status="2xx"} 900.0\n'
        'http_requests_total{handler="none",method="GET",status="4xx"} 900.0\n'
        'http_requests_total{method="GET",status="4xx"} 900.0\n'
    )
    sample = VLLM.normalize(text)
    assert sample.values["http_requests"] == {
        (("model", "m"), ("status", "2xx")): 14.0,
        (("model", "m"), ("status", "5xx")): 1.0,
    }


@pytest.mark.parametrize("status", ["teapot", "", "6xx", "2XX", "20"])
def test_http_requests_with_a_status_that_is_no_http_status_are_left_out(status: str) -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
        'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 5.0\n'
        f'http_requests_total{{handler="/v1/completions",method="POST",status="{status}"}} 1.0\n'
    )
    sample = VLLM.normalize(text)
    assert "http_requests" not in sample.values
    assert sample.values["requests_waiting"] == {(("model", "m"), ("engine", "0")): 3.0}
    assert [d.family for d in sample.dropped] == ["http_requests_total"]


def test_lora_info_is_read_from_its_newest_series() -> None:
    # vLLM keeps one lora_requests_info series per label set it has had, each valued at the
    # time it was last set: only the newest says the present.
    info = "vllm:lora_requests_info"
    text = (
        'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0\n'
        f'{info}{{max_lora="1",running_lora_adapters="a",waiting_lora_adapters="a"}} 1.7e9\n'
        f'{info}{{max_lora="1",running_lora_adapters="a,b",waiting_lora_adapters="b"}} 1.9e9\n'
        f'{info}{{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""}} 1.8e9\n'
    )
    sample = VLLM.normalize(text)
    assert sample.values["lora_adapters_active"] == {(("model", "tiny"),): 2.0}
    assert sample.values["lora_adapters_max"] == {(("model", "tiny"),): 1.0}
    # Nothing running now: the newest series names no adapter.
    idle = text.replace(" 1.8e9", " 2.0e9")
    assert VLLM.normalize(idle).values["lora_adapters_active"] == {(("model", "tiny"),): 0.0}


# Disaggregated prefill/decode: pages built from vLLM 0.34.0's own definitions (no public
# capture of a NIXL or Mooncake page was found), marked synthetic in their first line.
NIXL = "vllm-0.34.0-synthetic-nixl-decode.prom"
MOONCAKE = "vllm-0.34.0-synthetic-mooncake-prefill.prom"
QWEN = (("model", "Qwen/Qwen3-8B"), ("engine", "0"))


def test_nixl_decode_reads_its_pulls_failures_and_the_requests_waiting_for_their_kv() -> None:
    text = fixture_text(NIXL)
    sample = VLLM.normalize(text)
    seconds = sample.histograms["kv_transfer_seconds"][QWEN]
    # Five reads: 0.012, 0.018, 0.031, 0.047, 0.22 s; the page's own buckets kept.
    assert (seconds.count, seconds.sum) == (
        5.0,
        page_value(text, "vllm:nixl_xfer_time_seconds_sum"),
    )
    assert seconds.sum == pytest.approx(0.328)
    assert dict(seconds.buckets)["0.025"] == 2.0 and seconds.buckets[-1] == ("+Inf", 5.0)
    # The per-transfer size histogram's sum: 2 x 4 MiB + 2 x 8 MiB + 16 MiB.
    assert sample.values["kv_transfer_bytes"] == {QWEN: 41943040.0}
    # nixl_num_failed_transfers (2) already counts the failed notification (1): not added.
    assert sample.values["kv_transfer_failures"] == {QWEN: 2.0}
    # Tracked on the prefill instance: zero here, as the page says, not absent.
    assert sample.values["kv_transfer_expired_requests"] == {QWEN: 0.0}
    assert sample.values["kv_transfer_requests_waiting"] == {
        (*QWEN, ("stage", "pending")): 1.0,  # waiting_to_start
        (*QWEN, ("stage", "transferring")): 3.0,  # in_progress
        (*QWEN, ("stage", "received")): 2.0,  # completed_waiting
    }
    # prompt_tokens_by_source{source="external_kv_transfer"} only, not local_compute's 120.
    assert sample.values["kv_transfer_prompt_tokens"] == {QWEN: 4096.0}
    assert sample.values["requests_waiting"] == {QWEN: 6.0}


def test_mooncake_prefill_reads_its_pushes_and_adds_both_failure_counters() -> None:
    sample = VLLM.normalize(fixture_text(MOONCAKE))
    seconds = sample.histograms["kv_transfer_seconds"][QWEN]
    assert (seconds.count, seconds.sum) == (3.0, pytest.approx(0.073))
    assert seconds.buckets[0] == ("0.005", 1.0)  # Mooncake's buckets, not NIXL's
    assert sample.values["kv_transfer_bytes"] == {QWEN: 10485760.0}  # 2 + 2 + 6 MiB
    # failed_transfers 1 + failed_recvs 0.
    assert sample.values["kv_transfer_failures"] == {QWEN: 1.0}
    assert sample.values["kv_transfer_expired_requests"] == {QWEN: 3.0}
    assert sample.values["kv_transfer_prompt_tokens"] == {QWEN: 0.0}
    # A KV producer has no KV fetch gauge: absent, not zero.
    assert "kv_transfer_requests_waiting" not in sample.values


@pytest.mark.parametrize(
    "fixture", [f for f in VLLM_FIXTURES if f not in (NIXL, MOONCAKE, PD_PREFILL, PD_DECODE)]
)
def test_without_a_kv_connector_the_transfer_series_are_absent(fixture: str) -> None:
    sample = VLLM.normalize(fixture_text(fixture))
    found = [k for k in (*sample.values, *sample.histograms) if k.startswith("kv_transfer_")]
    # Except the tokens: vLLM 0.16+ always writes prompt_tokens_by_source, its
    # external_kv_transfer source 0 without a connector (the server's own zero, kept).
    assert found in ([], ["kv_transfer_prompt_tokens"]), found
    if found:
        assert set(sample.values["kv_transfer_prompt_tokens"].values()) == {0.0}


def test_the_tokens_by_transfer_are_the_servers_own_zero_without_a_connector() -> None:
    sample = VLLM.normalize(fixture_text("vllm-0.32.0-cpu-after-preemptions.prom"))
    assert sample.values["kv_transfer_prompt_tokens"] == {E0: 0.0}


def test_a_real_pd_pair_on_cpu_tells_what_arrived_by_transfer_on_the_decode_side() -> None:
    # vLLM's disk connector (ExampleConnector) times no transfer and counts no bytes: what
    # tells the transfer is the decode side's prompt tokens by source. Of its 4,578 prompt
    # tokens, 4,416 arrived by transfer: each prompt's 23 whole blocks of 32; only the last
    # 27 tokens of each of the six were computed there.
    decode = VLLM.normalize(fixture_text(PD_DECODE))
    assert decode.values["kv_transfer_prompt_tokens"] == {E0: 4416.0}
    assert decode.values["prompt_tokens"] == {E0: 4578.0}
    assert set(decode.values["kv_transfer_requests_waiting"].values()) == {0.0}
    assert not [k for k in decode.histograms if k.startswith("kv_transfer_")]
    assert "kv_transfer_bytes" not in decode.values and "kv_transfer_failures" not in decode.values
    prefill = VLLM.normalize(fixture_text(PD_PREFILL))
    assert prefill.values["kv_transfer_prompt_tokens"] == {E0: 0.0}
    assert prefill.values["prompt_tokens"] == {E0: 4578.0}  # every prompt computed here
    assert "kv_transfer_requests_waiting" not in prefill.values


@pytest.mark.parametrize(
    ("capture", "role"),
    [
        # A KV consumer counts the requests fetching their KV: the decode side.
        ("vllm-0.34.0-synthetic-nixl-decode.prom", "decode"),
        ("vllm-0.32.0-cpu-pd-example-connector-decode.prom", "decode"),  # a real pair
        # The disk connector's producer writes no family of its own: its page cannot tell
        # it from a server without a connector (docs/backends.md: give it --role prefill).
        ("vllm-0.32.0-cpu-pd-example-connector-prefill.prom", ""),
        # A connector's families without that count: the producer, the prefill side.
        ("vllm-0.34.0-synthetic-mooncake-prefill.prom", "prefill"),
        # No connector: the page says nothing of a role.
        ("vllm-0.32.0-cpu-loaded-kv-full.prom", ""),
    ],
)
def test_the_page_says_the_servers_role(capture: str, role: str) -> None:
    assert VLLM.role_of is not None and VLLM.role_of(fixture_text(capture)) == role
