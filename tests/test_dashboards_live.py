"""Every dashboard query against a real Prometheus scraping inferwatch in front of a real vLLM.

The rules are the generated ones (evaluated every second instead of 30 s so the test is
short; names and expressions are unchanged). Each panel's queries run with the variables
substituted; a query that errors or returns nothing fails, except on GPU-only panels and the
speculative-decoding panel, which must return nothing (no GPU here, no speculative decoding
on the test's vLLM) without an error.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest

from demo.calibration import kv_cache, tokens_per_word
from demo.stack import Inferwatch, Prometheus, VllmServer, tiny_model
from demo.traffic import Burst, burst
from inferwatch.baseline import parse, to_yaml
from inferwatch.dashboards import dashboards
from inferwatch.dashboards.queries import (
    GPU_ONLY_PANELS,
    LORA_PANELS,
    POOL_PANELS,
    ROUTER_PANELS,
    SPEC_DECODE_PANELS,
    STEP_TIMED_PANELS,
)
from inferwatch.method.spec import spec_from_config
from inferwatch.panels import Panel
from inferwatch.tools.generate import write

from conftest import capacity_entry

pytestmark = pytest.mark.vllm

# The generated rules, evaluated every second; InferenceLatencyRegression fires after one
# evaluation (against the baseline below, the bursts' TTFT regressed), so that the firing
# alerts table has a real alert to show.
SPEC = spec_from_config(
    {"alerting": {"evaluation_interval": "1s", "for": {"InferenceLatencyRegression": "1s"}}}
)


def baseline_file(path: Path) -> Path:
    quantiles = {"p50": 0.01, "p95": 0.02, "p99": 0.03}
    cells = [
        {
            "concurrency": c,
            "prompt_tokens": 64,
            "output_tokens": 64,
            "requests": 20,
            "errors": 0,
            "ttft_seconds": quantiles,
            "itl_seconds": quantiles,
            "e2e_seconds": quantiles,
            "requests_per_second": 10.0,
            "output_tokens_per_second": 640.0,
        }
        for c in (1, 8)
    ]
    # A capacity from the load search, so the capacity row has a line to draw, and the
    # search's steps, the rows of its latency-vs-load table.
    steps = [
        {
            "rate": rate,
            "requests": 60,
            "requests_per_second": rate * 0.98,
            "goodput_share": good,
            "concurrency": rate * 1.5,
            "ttft_p95": 0.02 * rate,
            "itl_p95": 0.02,
            "e2e_p95": 1.3 * rate,
        }
        for rate, good in ((2.0, 1.0), (4.0, 0.96), (8.0, 0.4))
    ]
    capacity = capacity_entry(64, 64, 4.0, concurrency=6.0, steps=steps)
    doc = {"inferwatch_baseline": 1, "cells": cells, "capacity": [capacity]}
    path.write_text(to_yaml(parse(doc)))
    return path


@pytest.fixture
def stack(vllm_server: VllmServer, tmp_path: Path):
    vllm_server.ensure_running()
    write(tmp_path, SPEC)
    iw = Inferwatch(
        tmp_path,
        vllm_server.url,
        [
            "--backend", "vllm",
            "--baseline", str(baseline_file(tmp_path / "baseline.yaml")),
            "--model-path", str(tiny_model()),
            "--peak-memory-bandwidth", "2e10",  # ~DDR4 dual channel: a floor on CPU too
            "--canary", "on", "--canary-interval", "1",  # the client's-path panels
        ],
    ).start()  # fmt: skip
    prometheus = Prometheus(
        tmp_path,
        [f"127.0.0.1:{iw.port}"],
        rule_files=[tmp_path / "alerts" / "inferwatch-rules.yaml"],
    ).start()
    yield vllm_server, iw, prometheus
    prometheus.stop()
    iw.stop()


def substitute(expr: str, instance: str) -> str:
    for name, value in {
        "$namespace": ".*",
        "$cluster": ".*",
        "$backend": "vllm",
        "$model": "tiny",
        "$instance": instance,
        "$__rate_interval": "1m",
        "$__range": "5m",
        "$__interval": "15s",
    }.items():
        expr = expr.replace(name, value)
    return expr


def wait_for(prometheus: Prometheus, expr: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not prometheus.query(expr):
        assert time.monotonic() < deadline, f"{expr} never returned data"
        time.sleep(1)


def test_every_panel_query_returns_data(stack) -> None:
    vllm, iw, prometheus = stack
    # rate() sees only what moves after Prometheus' first sample: wait for it.
    wait_for(prometheus, "inferwatch_prefix_cache_queries_total")
    # Load: a burst that overflows the KV cache, then the same prompts twice, each longer
    # than two KV blocks (only whole blocks are cached): prefix-cache hits by construction.
    asyncio.run(burst(vllm.url, Burst(requests=24, max_tokens=200), salt=7))
    _, block = kv_cache(vllm.url)
    words = math.ceil(2 * block / asyncio.run(tokens_per_word(vllm.url))) + 1
    for _ in range(2):
        asyncio.run(burst(vllm.url, Burst(requests=4, prompt_words=words, max_tokens=16), salt=8))
    wait_for(prometheus, "instance:inferwatch_time_to_first_token_seconds:quantile_rate5m")
    wait_for(prometheus, "rate(inferwatch_prefix_cache_hits_total[5m]) > 0")
    wait_for(prometheus, 'ALERTS{alertname="InferenceLatencyRegression", alertstate="firing"}')
    instance = f"127.0.0.1:{iw.port}"
    failures = []
    checked = 0
    for name, board in dashboards(SPEC).items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = substitute(target["expr"], instance)
                try:
                    result = prometheus.query(expr)
                except Exception as exc:  # the error text is the finding
                    failures.append(f"{name} / {panel['title']}: {exc}")
                    continue
                checked += 1
                empty_here = (
                    panel["title"]
                    in GPU_ONLY_PANELS
                    | SPEC_DECODE_PANELS
                    | STEP_TIMED_PANELS
                    | LORA_PANELS
                    | ROUTER_PANELS
                    | POOL_PANELS
                )
                if empty_here and result:
                    failures.append(f"{name} / {panel['title']}: returned data, none expected")
                if not empty_here and not result:
                    failures.append(f"{name} / {panel['title']}: no data for {expr}")
    assert not failures, "\n".join(failures)
    assert checked > 50
    # The latency-vs-load table: a row per rate the baseline's search measured, each query
    # one value per row (the merge joins them on the same labels).
    (curve,) = [
        p
        for p in dashboards(SPEC)["inferwatch-triage.json"]["panels"]
        if p["title"] == Panel.LOAD_CURVE
    ]
    for target in curve["targets"]:
        rows = prometheus.query(substitute(target["expr"], instance))
        assert sorted(r["metric"]["rate"] for r in rows) == ["2", "4", "8"], target["expr"]
        assert {frozenset(r["metric"]) for r in rows} == {
            frozenset({"model", "prompt_tokens", "output_tokens", "rate"})
        }
