"""The rendered page is valid exposition: prometheus_client parses it, promtool lints it clean."""

from __future__ import annotations

import subprocess

import pytest

from inferwatch.baseline import parse as parse_baseline
from inferwatch.baseline import series as baseline_series
from inferwatch.collect.backends import VLLM
from inferwatch.collect.derive import derived
from inferwatch.collect.gpu import GpuSource
from inferwatch.metrics import ALL
from inferwatch.model import CollectorStatus, Snapshot
from inferwatch.serve.exposition import render

from conftest import FIXTURES, fixture_text, oracle_samples
from fake_nvml import FakeGpu, FakeNvml

KEY = (("backend", "vllm"), ("model", "tiny"))


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
        derived=derived(({KEY: True}, {KEY: 2.5}), {KEY: 0.0048}),
        baseline=baseline_series(BASELINE, sample),
    )


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("vllm*.prom")))
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
    # the one vLLM lacks (SGLang's own idle counter).
    assert contract - families == {"inferwatch_scheduler_idle_seconds_total"}
