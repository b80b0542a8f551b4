"""The rendered page is valid exposition: prometheus_client parses it, promtool lints it clean."""

from __future__ import annotations

import subprocess

import pytest

from inferwatch.backends import VLLM
from inferwatch.derive import derived
from inferwatch.exposition import render
from inferwatch.gpu import GpuSource
from inferwatch.metrics import ALL
from inferwatch.model import CollectorStatus, Snapshot

from conftest import FIXTURES, fixture_text, oracle_samples
from fake_nvml import FakeGpu, FakeNvml

KEY = (("backend", "vllm"), ("model", "tiny"))


def full_snapshot(fixture: str) -> Snapshot:
    src = GpuSource(nvml=FakeNvml([FakeGpu(0, util=80, gpm_supported=True), FakeGpu(1)]))
    src.start()
    src.sample()
    gpus, gpu_status = src.sample()
    return Snapshot(
        backend_kind="vllm",
        backend_up=True,
        backend_scrape_seconds=0.004,
        backend=VLLM.normalize(fixture_text(fixture)),
        collectors={"backend": CollectorStatus(True, 0.004), "gpu": gpu_status},
        gpus=gpus,
        derived=derived(({KEY: True}, {KEY: 2.5}), {KEY: 0.0048}),
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
    # With a GPU, a vLLM page and the derived signals, every family but the baseline shows,
    # and the one vLLM lacks (SGLang's own idle counter).
    assert contract - families == {"inferwatch_scheduler_idle_seconds_total"}
