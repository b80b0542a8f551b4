"""The rendered page is valid exposition: prometheus_client parses it, promtool lints it clean;
the OpenMetrics page is valid OpenMetrics with the same samples; the exporter's own process
series are on both, and neither a failing collector nor a render bug costs the scrape."""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from test_hostile_pages import hostile_pages, poll_and_render

from inferwatch.baseline import parse as parse_baseline
from inferwatch.baseline import series as baseline_series
from inferwatch.capture.capturer import CaptureSample
from inferwatch.collect.backends import VLLM
from inferwatch.collect.canary import CanarySample, Counts
from inferwatch.collect.derive import derived
from inferwatch.collect.gpu import GpuSource
from inferwatch.collect.server_cpu import ServerCpuSample
from inferwatch.metrics import (
    ALL,
    CANARY_E2E_BOUNDS,
    CANARY_ITL_BOUNDS,
    CANARY_TTFT_BOUNDS,
    WINDOW_QUANTILES,
    Kind,
)
from inferwatch.metrics.kv_transfer import KV_TRANSFER
from inferwatch.metrics.router import ROUTER
from inferwatch.model import (
    BackendSample,
    CollectorStatus,
    Histogram,
    Snapshot,
)
from inferwatch.serve.exposition import Renderer, render, render_openmetrics
from inferwatch.serve.selfmetrics import PROCESS_FAMILIES, SelfMetrics

from conftest import capacity_entry, captures_of, fixture_text, oracle_samples
from fake_nvml import FakeGpu, FakeNvml

KEY = (("backend", "vllm"), ("model", "tiny"))
# The latency window's quantiles (collect/window.py), as a poller publishes them.
WINDOW = {
    family: {(*KEY, ("quantile", q)): value * float(q) for q in WINDOW_QUANTILES}
    for family, value in (
        ("time_to_first_token_window_seconds", 0.8),
        ("inter_token_latency_window_seconds", 0.04),
    )
}


BASELINE = parse_baseline(
    {
        "inferwatch_baseline": 1,
        "cells": [
            {
                "concurrency": 4,
                "prompt_tokens": 256,
                "output_tokens": 64,
                "requests": 40,
                "errors": 0,
                "ttft_seconds": {"p50": 0.03, "p95": 0.05, "p99": 0.06},
                "itl_seconds": {"p50": 0.01, "p95": 0.02, "p99": 0.03},
                "e2e_seconds": {"p50": 0.7, "p95": 0.9, "p99": 1.0},
                "requests_per_second": 5.0,
                "output_tokens_per_second": 320.0,
            }
        ],
        "capacity": [
            capacity_entry(
                256,
                64,
                6.0,
                concurrency=4.2,
                goodput_share=0.97,
                steps=[
                    {
                        "rate": 6.0,
                        "requests": 90,
                        "requests_per_second": 5.9,
                        "goodput_share": 0.97,
                        "concurrency": 4.2,
                        "ttft_p95": 0.2,
                        "itl_p95": 0.03,
                        "e2e_p95": 2.1,
                    }
                ],
            )
        ],
    }
)


def full_snapshot(fixture: str) -> Snapshot:
    src = GpuSource(nvml=FakeNvml([FakeGpu(0, util=80, gpm_supported=True), FakeGpu(1)]))
    src.start()
    src.sample()
    gpus, gpu_status = src.sample()
    sample = VLLM.normalize(fixture_text(fixture))
    return Snapshot(
        backend_kind="vllm",
        backend_up=True,
        backend_scrape_seconds=0.004,
        backend=sample,
        collectors={"backend": CollectorStatus(True, 0.004), "gpu": gpu_status},
        gpus=gpus,
        derived=derived(({KEY: True}, {KEY: 2.5}), {KEY: 0.0048}, WINDOW),
        baseline=baseline_series(BASELINE, sample, sample.total("requests_running") or 0.0),
        sources={
            "canary": canary_sample(),
            "capture": CaptureSample(
                {("manual", "ok"): 1.0, ("InferenceQueuedWhileIdle", "too_soon"): 2.0}, 1.8e9
            ),
            "server_cpu": ServerCpuSample(1834.2, 97.4, 131, 412.9, 3.2, 41.0),
        },
        series_dropped={"label_bytes": 3.0},
    )


def canary_sample(gap: float | None = 0.012) -> CanarySample:
    hists = []
    for bounds, values in (
        (CANARY_TTFT_BOUNDS, (0.03, 0.07)),
        (CANARY_ITL_BOUNDS, (0.004, 0.02, 0.02)),
        (CANARY_E2E_BOUNDS, (0.2, 0.3)),
    ):
        counts = Counts(bounds)
        for value in values:
            counts.observe(value)
        hists.append(counts.frozen())
    probes = {"ok": 2.0, "http_error": 0.0, "timeout": 1.0, "connect_error": 0.0}
    return CanarySample("tiny", *hists, {**probes, "bad_stream": 0.0}, gap)


@pytest.mark.parametrize("fixture", captures_of("vllm"))
def test_page_parses_and_passes_promtool_check_metrics(fixture: str) -> None:
    page = render(full_snapshot(fixture)).decode()
    samples = oracle_samples(page)  # raises on malformed exposition
    assert samples["inferwatch_queued_while_idle_seconds_total"] == [(dict(KEY), 2.5)]
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=page, capture_output=True, text=True, timeout=60
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_every_exposed_family_is_in_the_contract() -> None:
    page = render(full_snapshot("vllm-0.32.0-cpu-api-server-count-2-mfu.prom")).decode()
    families = {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}
    contract = {d.name for d in ALL.values()}
    assert families <= contract
    # With a GPU, a vLLM page, the derived signals and a baseline, every family shows but
    # those vLLM lacks (SGLang's own idle counter, TGI's step durations and token budget),
    # this server did not use (speculative decoding and LoRA were off) or an H100 has not
    # (page retirement is for GPUs before Ampere); a router's series are a router's, and
    # the KV transfer's a disaggregated pair's (but the tokens by transfer, 0, that vLLM
    # writes on every page).
    kv_transfer = {d.name for d in KV_TRANSFER.values()} - {
        "inferwatch_kv_transfer_prompt_tokens_total"
    }
    assert contract - families - {d.name for d in ROUTER.values()} - kv_transfer == {
        "inferwatch_gpu_retired_pages_pending",
        "inferwatch_lora_adapters_active",
        "inferwatch_lora_adapters_max",
        "inferwatch_scheduler_idle_seconds_total",
        "inferwatch_engine_step_seconds",
        "inferwatch_batch_reserved_tokens",
        "inferwatch_batch_token_budget",
        "inferwatch_spec_decode_draft_tokens_total",
        "inferwatch_spec_decode_accepted_tokens_total",
    }


# --- OpenMetrics ------------------------------------------------------------------------

HISTOGRAM_NAMES = {d.name for d in ALL.values() if d.kind is Kind.HISTOGRAM}


def samples_of(page: str, parse: Callable) -> set[tuple]:
    """Every sample on a page as (name, sorted labels, value); ``le`` read as a number (the
    OpenMetrics page spells an infinite bound +Inf however the backend wrote it)."""
    out = set()
    for family in parse(page):
        for s in family.samples:
            labels = {k: (repr(float(v)) if k == "le" else v) for k, v in s.labels.items()}
            value = "NaN" if math.isnan(s.value) else s.value
            out.add((s.name, tuple(sorted(labels.items())), value))
    return out


def assert_openmetrics_agrees(snap: Snapshot) -> set[tuple]:
    """The OpenMetrics page is valid and carries the text page's samples, but for those of
    histogram series OpenMetrics cannot carry (cut before +Inf, _count without _sum...)."""
    page = render_openmetrics(snap).decode()
    assert page.endswith("\n# EOF\n") and page.count("# EOF") == 1
    om = samples_of(page, parse_openmetrics)  # raises on invalid OpenMetrics
    text = samples_of(render(snap).decode(), parse_text)
    assert om <= text
    missing = {name for name, _, _ in text - om}
    assert all(name.rsplit("_", 1)[0] in HISTOGRAM_NAMES for name in missing), missing
    return text - om


@pytest.mark.parametrize("fixture", captures_of("vllm"))
def test_openmetrics_page_of_every_capture_is_valid(fixture: str) -> None:
    left_out = assert_openmetrics_agrees(full_snapshot(fixture))
    if fixture.startswith("vllm-0.32.0-"):  # whole pages of a real server: all of it
        assert not left_out
    else:  # the mapping leaves out what neither format can carry (a histogram cut short)
        assert not left_out


def test_openmetrics_names_counter_families_without_total() -> None:
    page = render_openmetrics(full_snapshot("vllm-0.32.0-cpu-loaded-kv-full.prom")).decode()
    families = {f.name: f for f in parse_openmetrics(page)}
    assert families["inferwatch_prompt_tokens"].type == "counter"
    assert {s.name for s in families["inferwatch_prompt_tokens"].samples} == {
        "inferwatch_prompt_tokens_total"
    }
    assert "# TYPE inferwatch_prompt_tokens counter\n" in page
    assert families["inferwatch_time_to_first_token_seconds"].type == "histogram"
    assert families["inferwatch_queued_while_idle_seconds"].samples[0].value == 2.5
    contract = {d.name.removesuffix("_total"): d.kind.value for d in ALL.values()}
    assert {name: f.type for name, f in families.items()}.items() <= contract.items()


@settings(
    max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(hostile_pages())
def test_openmetrics_page_of_a_mutated_capture_is_valid_and_agrees_with_the_text_page(
    named: tuple[str, str],
) -> None:
    assert_openmetrics_agrees(poll_and_render(*named)[0])


def _hist(buckets: tuple[tuple[str, float], ...], total: float, count: float) -> Histogram:
    return Histogram(buckets, total, count)


# engine label -> (histogram, what OpenMetrics keeps: "all", "buckets" or "none")
OPENMETRICS_CASES: dict[str, tuple[Histogram, str]] = {
    "valid": (_hist((("0.1", 1.0), ("+Inf", 3.0)), 0.5, 3.0), "all"),
    "+inf spelled so": (_hist((("0.1", 1.0), ("+inf", 3.0)), 0.5, 3.0), "all"),
    "no sum nor count": (_hist((("0.1", 1.0), ("+Inf", 3.0)), math.nan, math.nan), "buckets"),
    "count without sum": (_hist((("0.1", 1.0), ("+Inf", 3.0)), math.nan, 3.0), "buckets"),
    "count is not the +Inf bucket": (_hist((("0.1", 1.0), ("+Inf", 3.0)), 0.5, 4.0), "buckets"),
    "negative sum": (_hist((("0.1", 1.0), ("+Inf", 3.0)), -0.5, 3.0), "buckets"),
    "infinite sum": (_hist((("0.1", 1.0), ("+Inf", 3.0)), math.inf, 3.0), "buckets"),
    "negative bound": (_hist((("-1", 0.0), ("+Inf", 3.0)), 0.5, 3.0), "buckets"),
    "no +Inf bucket": (_hist((("0.1", 1.0), ("1.0", 3.0)), 0.5, 3.0), "none"),
    "bounds that coincide": (_hist((("0.1", 1.0), ("0.10", 1.0), ("+Inf", 1.0)), 0.0, 1.0), "none"),
    "counts that decrease": (_hist((("0.1", 3.0), ("+Inf", 2.0)), 0.5, 2.0), "none"),
    "a fractional count": (_hist((("0.1", 1.5), ("+Inf", 3.0)), 0.5, 3.0), "none"),
    "an infinite count": (_hist((("0.1", 1.0), ("+Inf", math.inf)), 0.5, math.inf), "none"),
}


def test_openmetrics_leaves_out_what_it_cannot_carry_and_the_text_page_keeps_it() -> None:
    ttft = "time_to_first_token_seconds"
    sample = BackendSample(
        "vllm",
        "m",
        values={
            "requests_waiting": {(("model", "m"),): 1.0},
            # A counter OpenMetrics refuses (a snapshot never holds one: the renderer's guard).
            "prompt_tokens": {(("model", "m"),): 5.0, (("model", "bad"),): -1.0},
        },
        histograms={
            ttft: {(("model", "m"), ("engine", e)): h for e, (h, _) in OPENMETRICS_CASES.items()}
        },
    )
    snap = Snapshot("vllm", True, 0.01, sample, {"backend": CollectorStatus(True, 0.01)})
    text = oracle_samples(render(snap).decode())
    page = render_openmetrics(snap).decode()
    om = {f.name: f.samples for f in parse_openmetrics(page)}  # raises on invalid OpenMetrics
    name = f"inferwatch_{ttft}"
    for engine, (_, kept) in OPENMETRICS_CASES.items():
        suffixes = {s.name.removeprefix(name) for s in om[name] if s.labels["engine"] == engine}
        want = {"all": {"_bucket", "_count", "_sum"}, "buckets": {"_bucket"}, "none": set()}
        assert suffixes == want[kept], engine
        in_text = {
            n
            for n, series in text.items()
            for labels, _ in series
            if labels.get("engine") == engine
        }
        assert f"{name}_bucket" in in_text, engine  # the text format carries every one
    infinite = [
        s
        for s in om[name]
        if s.labels["engine"] == "+inf spelled so" and s.name.endswith("_bucket")
    ]
    assert [s.labels["le"] for s in infinite] == ["0.1", "+Inf"]
    assert [(s.labels, s.value) for s in om["inferwatch_prompt_tokens"]] == [
        ({"backend": "vllm", "model": "m"}, 5.0)
    ]
    assert len(text["inferwatch_prompt_tokens_total"]) == 2


# --- the Renderer: process_*/python_* series, and a page whatever happens ----------------

ON_LINUX = Path("/proc/self/stat").exists()


def snapshots() -> Iterator[Snapshot]:
    """A new snapshot each call (a new poll), so each render is a fresh one."""
    base = full_snapshot("vllm-0.32.0-cpu-loaded-kv-full.prom")
    while True:
        yield dataclasses.replace(base)


@pytest.mark.skipif(not ON_LINUX, reason="ProcessCollector reads /proc")
def test_renderer_adds_process_and_python_series_in_both_formats() -> None:
    polls = snapshots()
    snap = next(polls)
    renderer = Renderer(lambda: snap)
    text = oracle_samples(renderer.render().decode())
    assert renderer.cached() is renderer.render()  # rendered once per poll
    assert page_value_of(text, "inferwatch_backend_up") == 1.0
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "process_max_fds",
        "python_info",
    ):
        assert len(text[name]) == 1, name
    assert {labels["generation"] for labels, _ in text["python_gc_collections_total"]} == {
        "0",
        "1",
        "2",
    }
    page = renderer.render(openmetrics=True).decode()
    assert page.endswith("\n# EOF\n") and page.count("# EOF") == 1
    families = {f.name: f for f in parse_openmetrics(page)}
    assert families["process_cpu_seconds"].type == "counter"
    assert families["process_cpu_seconds"].samples[0].name == "process_cpu_seconds_total"
    assert families.keys() >= PROCESS_FAMILIES
    assert families["inferwatch_backend_up"].samples[0].value == 1.0


def page_value_of(samples: dict[str, list], name: str) -> float:
    ((_, value),) = samples[name]
    return value


class Raises:
    def collect(self) -> list:
        raise RuntimeError("no /proc here")


class Garbage:
    def collect(self) -> list:
        return [object()]  # not a metric family: the encoder fails on it


@pytest.mark.parametrize("broken", [Raises(), Garbage()], ids=["raises", "garbage"])
def test_a_failing_self_metrics_collector_is_left_out_and_logged_once(broken, caplog) -> None:
    polls = snapshots()
    snap = next(polls)
    renderer = Renderer(lambda: snap, SelfMetrics([broken, GCCollector(CollectorRegistry())]))
    with caplog.at_level(logging.WARNING, logger="inferwatch.serve.selfmetrics"):
        for _ in range(3):
            snap = next(polls)
            text = oracle_samples(renderer.render().decode())
            om = {f.name for f in parse_openmetrics(renderer.render(openmetrics=True).decode())}
            assert page_value_of(text, "inferwatch_backend_up") == 1.0
            assert "python_gc_collections_total" in text and "python_gc_collections" in om
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"{type(broken).__name__} left out"), lines


@pytest.mark.skipif(not ON_LINUX, reason="the check applies where /proc exists")
def test_a_process_collector_that_cannot_read_its_files_logs_what_it_left_out(
    tmp_path: Path, caplog
) -> None:
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")  # no pid directory
    collector = ProcessCollector(proc=str(tmp_path), registry=CollectorRegistry())
    polls = snapshots()
    snap = next(polls)
    renderer = Renderer(lambda: snap, SelfMetrics([collector]))
    with caplog.at_level(logging.WARNING, logger="inferwatch.serve.selfmetrics"):
        for _ in range(2):
            snap = next(polls)
            text = oracle_samples(renderer.render().decode())
            assert not [name for name in text if name.startswith("process_")]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "process_resident_memory_bytes" in lines[0], lines


def test_a_render_bug_still_serves_a_valid_page_with_the_backend_down(caplog) -> None:
    good = full_snapshot("vllm-0.32.0-cpu-loaded-kv-full.prom")
    assert good.backend is not None
    # A label value that is not a string: no backend produces one; a bug could.
    values = {**good.backend.values, "requests_waiting": {(("model", 7),): 1.0}}
    snap = dataclasses.replace(good, backend=dataclasses.replace(good.backend, values=values))
    renderer = Renderer(lambda: snap, SelfMetrics([]))
    with caplog.at_level(logging.ERROR, logger="inferwatch.serve.exposition"):
        text = oracle_samples(renderer.render().decode())
        om = {f.name: f.samples for f in parse_openmetrics(renderer.render(True).decode())}
    assert page_value_of(text, "inferwatch_backend_up") == 0.0
    assert (({"collector": "exposition"}, 0.0)) in text["inferwatch_collector_success"]
    assert "inferwatch_requests_running" not in text
    assert om["inferwatch_backend_up"][0].value == 0.0
    assert [r.getMessage() for r in caplog.records] == [
        "rendering /metrics failed; serving it with the backend down"
    ]


def test_process_series_are_read_at_most_once_a_max_age() -> None:
    """At 10 Hz a page is rendered ten times a second; /proc is read once."""
    now = [0.0]
    reads = []

    class Counting(Collector):
        def collect(self):
            reads.append(now[0])
            yield GaugeMetricFamily("process_thing", "a process value", value=len(reads))

    metrics = SelfMetrics([Counting()], clock=lambda: now[0])
    pages = []
    for step in range(25):
        now[0] = step * 0.1
        pages.append(metrics.section(openmetrics=False))
    assert reads == [0.0, 1.0, 2.0]
    assert pages[9].endswith("process_thing 1.0\n") and pages[10].endswith("process_thing 2.0\n")
