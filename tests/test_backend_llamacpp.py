"""llama.cpp captures normalize to exactly the values on the page."""

from __future__ import annotations

import json

import pytest

from inferwatch.collect.backends import LLAMACPP, detect
from inferwatch.collect.textparse import ExpositionError

from conftest import FIXTURES, assert_matches_oracle, fixture_text, page_value

LLAMACPP_FIXTURES = sorted(p.name for p in FIXTURES.glob("llamacpp*.prom"))

M = (("model", "tiny"),)  # llama-server labels nothing: the model comes from /v1/models

# Values read off the captures by hand: (fixture, contract key, value).
SPOT_CHECKS = [
    ("llamacpp-2024-windows-idle-nan-proxy-fallback.prom", "engine_steps", 0.0),
    ("llamacpp-2024-windows-idle-nan-proxy-fallback.prom", "kv_cache_usage_ratio", 0.0),
    ("llamacpp-2024-windows-idle-nan-proxy-fallback.prom", "requests_waiting", 0.0),
    ("llamacpp-2025-06-pr13196-comment.prom", "prompt_tokens", 143.0),
    ("llamacpp-2025-06-pr13196-comment.prom", "generation_tokens", 673.0),
    ("llamacpp-2025-late-go-test-real-dump.prom", "prompt_tokens", 18292.0),
    ("llamacpp-2025-late-go-test-real-dump.prom", "generation_tokens", 1406.0),
    ("llamacpp-2025-late-go-test-real-dump.prom", "engine_steps", 739.0),
    ("llamacpp-2025-late-go-test-real-dump.prom", "requests_running", 0.0),
    ("llamacpp-2025-mid-zh-guide-full.prom", "prompt_tokens", 33065.0),
    ("llamacpp-2025-mid-zh-guide-full.prom", "generation_tokens", 7801.0),
    ("llamacpp-2025-mid-zh-guide-full.prom", "engine_steps", 7831.0),
    ("llamacpp-2026-b10380-rust-test-real-metrics.prom", "prompt_tokens", 25.0),
    ("llamacpp-2026-b10380-rust-test-real-metrics.prom", "generation_tokens", 200.0),
    ("llamacpp-2026-b10380-rust-test-real-metrics.prom", "engine_steps", 202.0),
    # Captured here from a real llama-server (one slot) in the middle of a burst.
    ("llamacpp-b11434-cpu-1-slot-1-deferred.prom", "requests_running", 1.0),
    ("llamacpp-b11434-cpu-1-slot-1-deferred.prom", "requests_waiting", 1.0),
    ("llamacpp-b11434-cpu-1-slot-1-deferred.prom", "generation_tokens", 6000.0),
    ("llamacpp-b11434-cpu-1-slot-1-deferred.prom", "engine_steps", 6662.0),
    ("llamacpp-b11434-cpu-1-slot-1-deferred.prom", "prompt_tokens", 22.0),
    ("llamacpp-b11434-cpu-1-slot-1-deferred.prom", "prefix_cache_hits", 68.0),
    ("llamacpp-ik_llama-fork-2025-08-pr695-comment.prom", "kv_cache_usage_ratio", 0.491063),
    ("llamacpp-ik_llama-fork-2025-08-pr695-comment.prom", "prompt_tokens", 6886.0),
    ("llamacpp-ik_llama-fork-2025-08-pr695-comment.prom", "requests_waiting", 0.0),
]


@pytest.mark.parametrize(("fixture", "key", "value"), SPOT_CHECKS)
def test_spot_values(fixture: str, key: str, value: float) -> None:
    sample = LLAMACPP.normalize(fixture_text(fixture), model_hint="tiny")
    assert sample.model == "tiny"
    assert sample.values[key] == {M: value}


def test_without_a_model_hint_the_model_is_unknown() -> None:
    sample = LLAMACPP.normalize(fixture_text("llamacpp-2025-mid-zh-guide-full.prom"))
    assert sample.model == "unknown"
    assert sample.values["engine_steps"] == {(("model", "unknown"),): 7831.0}


def test_rate_gauges_reset_by_each_scrape_are_never_read() -> None:
    # prompt_tokens_seconds 514.037 and predicted_tokens_seconds 33.6147 are on this page.
    sample = LLAMACPP.normalize(fixture_text("llamacpp-2025-late-go-test-real-dump.prom"))
    found = {v for series in sample.values.values() for v in series.values()}
    assert not found & {514.037, 33.6147}
    assert not any(s.name.endswith("tokens_seconds") for f in LLAMACPP.feeds for s in f.sources)


def test_high_water_mark_and_busy_slot_average_are_not_mapped() -> None:
    # n_tokens_max 8156 (n_past_max in Aug-Oct 2025 builds), n_busy_slots_per_decode 1.
    for name in ("n_tokens_max", "n_past_max", "n_busy_slots_per_decode"):
        page = f"llamacpp:n_decode_total 7\nllamacpp:{name} 8156\n"
        assert set(LLAMACPP.normalize(page).values) == {"engine_steps"}


def test_2026_cached_prompt_tokens_are_prefix_cache_hits_without_queries() -> None:
    page = "llamacpp:prompt_tokens_total 4\nllamacpp:prompt_tokens_cached_total 32485\n"
    sample = LLAMACPP.normalize(page, model_hint="tiny")
    assert sample.values["prefix_cache_hits"] == {M: 32485.0}
    assert sample.values["prompt_tokens"] == {M: 4.0}
    assert "prefix_cache_queries" not in sample.values


@pytest.mark.parametrize("fixture", LLAMACPP_FIXTURES)
def test_json_escaped_body_of_late_2025_builds_reads_like_the_plain_page(fixture: str) -> None:
    # Builds ~b7010 until PR #17386 (ggml-org/llama.cpp#17384) sent the page through
    # json::dump: one quoted string, newlines as \n.
    plain = fixture_text(fixture)
    escaped = json.dumps(plain, ensure_ascii=False)
    assert escaped.startswith('"# source:') and "\n" not in escaped
    got = LLAMACPP.normalize(escaped, model_hint="tiny")
    want = LLAMACPP.normalize(plain, model_hint="tiny")
    assert got.values == want.values
    assert detect(escaped) is LLAMACPP
    assert_matches_oracle(LLAMACPP, escaped, model_hint="tiny")


def test_quoted_body_that_is_not_a_json_string_is_an_error() -> None:
    with pytest.raises(ExpositionError, match="starts with a quote but is not a JSON string"):
        LLAMACPP.normalize('"llamacpp:n_decode_total 3\n')


@pytest.mark.parametrize("fixture", LLAMACPP_FIXTURES)
def test_every_series_matches_an_independent_parse(fixture: str) -> None:
    assert_matches_oracle(LLAMACPP, fixture_text(fixture), model_hint="tiny")


@pytest.mark.parametrize("fixture", LLAMACPP_FIXTURES)
def test_auto_detection_recognises_every_llamacpp_capture(fixture: str) -> None:
    assert detect(fixture_text(fixture)) is LLAMACPP


def test_spec_decode_token_counters_of_a_2026_build() -> None:
    text = fixture_text("llamacpp-b11434-cpu-1-slot-1-deferred.prom")
    sample = LLAMACPP.normalize(text, model_hint="tiny")
    draft = page_value(text, "llamacpp:spec_decode_num_draft_tokens_total")
    accepted = page_value(text, "llamacpp:spec_decode_num_accepted_tokens_total")
    assert sample.values["spec_decode_draft_tokens"] == {M: draft}
    assert sample.values["spec_decode_accepted_tokens"] == {M: accepted}
    # With a draft model (same names, counting): draft and accepted are not swapped.
    sample = LLAMACPP.normalize(
        "llamacpp:spec_decode_num_draft_tokens_total 160\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 97\n"
        "llamacpp:spec_decode_num_drafts_total 40\n",
        model_hint="tiny",
    )
    assert sample.values["spec_decode_draft_tokens"] == {M: 160.0}
    assert sample.values["spec_decode_accepted_tokens"] == {M: 97.0}


def test_kv_cache_tokens_in_use_are_not_the_capacity() -> None:
    # ik_llama.cpp: llamacpp:kv_cache_tokens 31428 counts tokens in the cache, not its size.
    text = fixture_text("llamacpp-ik_llama-fork-2025-08-pr695-comment.prom")
    assert page_value(text, "llamacpp:kv_cache_tokens") == 31428.0
    sample = LLAMACPP.normalize(text, model_hint="tiny")
    for key in ("kv_cache_capacity_tokens", "http_requests", "spec_decode_draft_tokens"):
        assert key not in sample.values, key
