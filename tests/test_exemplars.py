"""Exemplars on the latency buckets: each bucket of the OpenMetrics page carries the latest
traced request of the window that falls in it, read back by prometheus_client's OpenMetrics
parser and stored by a real Prometheus 2.42 (``--enable-feature=exemplar-storage``) from a
real sidecar fed vLLM 0.32's real ``llm_request`` span."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from test_otlp import EXPECTED, PROTOBUF, export_request, request_span

from demo.alerting import Prometheus
from demo.stack import Inferwatch
from inferwatch.collect.backends import VLLM
from inferwatch.model import CollectorStatus, Snapshot
from inferwatch.serve.exemplars import (
    CELLS_PER_OCTAVE,
    FIELDS,
    HIGHEST_OCTAVE,
    LOWEST_OCTAVE,
    Exemplars,
)
from inferwatch.serve.exposition import render, render_openmetrics
from inferwatch.serve.otlp import request_of
from inferwatch.serve.slow_requests import Request

from conftest import fixture_text, thread_server

CAPTURE = "vllm-0.32.0-cpu-loaded-kv-full.prom"
# vLLM 0.32's TTFT bucket bounds, as on the capture.
TTFT_BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5]
TTFT_BOUNDS += [5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf]


class Clock:
    def __init__(self) -> None:
        self.now = 1.8e9

    def __call__(self) -> float:
        return self.now


def trace(n: int) -> str:
    return f"{n:032x}"


def test_each_bucket_shows_its_latest_request_of_the_window() -> None:
    clock = Clock()
    exemplars = Exemplars(window=60.0, clock=clock)
    exemplars.add([Request(trace_id=trace(1), ttft=0.3)])
    clock.now += 1
    exemplars.add([Request(trace_id=trace(2), ttft=0.45), Request(trace_id=trace(3), ttft=3.0)])
    exemplars.add([Request(trace_id=trace(4), ttft=0.25)])  # on a bound: that bound's bucket
    exemplars.add([Request(trace_id=trace(5), ttft=9000.0)])  # past every finite bound
    got = exemplars.of_buckets("time_to_first_token_seconds", TTFT_BOUNDS)
    held = {TTFT_BOUNDS[i]: (e.trace_id, e.value) for i, e in enumerate(got) if e is not None}
    assert held == {
        0.25: (trace(4), 0.25),
        0.5: (trace(2), 0.45),  # the later of the two in (0.25, 0.5]
        5.0: (trace(3), 3.0),
        math.inf: (trace(5), 9000.0),
    }
    # The other histograms file the fields they observe, and these requests told only TTFT.
    assert FIELDS["request_duration_seconds"] == "e2e"
    assert not any(exemplars.of_buckets("request_duration_seconds", TTFT_BOUNDS))
    clock.now += 60.5  # the first arrivals are out of the window, the last ones not yet
    exemplars.add([Request(trace_id=trace(6), ttft=0.02)])
    assert [
        e.trace_id for e in exemplars.of_buckets("time_to_first_token_seconds", TTFT_BOUNDS) if e
    ] == [trace(6)]


def test_a_request_without_a_w3c_trace_id_gives_none() -> None:
    exemplars = Exemplars(window=60.0)
    exemplars.add(
        [
            Request(trace_id=None, ttft=0.3),
            Request(trace_id="0" * 32, ttft=0.3),  # the invalid id
            Request(trace_id="ab" * 40, ttft=0.3),  # 40 bytes: over OpenMetrics' 128 chars
            Request(trace_id=trace(7), ttft=math.nan),
        ]
    )
    assert not any(exemplars.of_buckets("time_to_first_token_seconds", TTFT_BOUNDS))


def test_memory_is_bounded_whatever_the_values() -> None:
    exemplars = Exemplars(window=60.0)
    rng = random.Random(53)
    for n in range(20_000):
        value = 10 ** rng.uniform(-12, 9)
        exemplars.add([Request(trace_id=trace(n + 1), ttft=value, e2e=0.0)])
    cells = exemplars._cells["time_to_first_token_seconds"]
    assert len(cells) <= (HIGHEST_OCTAVE - LOWEST_OCTAVE) * CELLS_PER_OCTAVE + 1
    assert len(exemplars._cells["request_duration_seconds"]) == 1  # every e2e was zero


def _snapshot(sample) -> Snapshot:
    return Snapshot(
        backend_kind="vllm",
        backend_up=True,
        backend_scrape_seconds=0.004,
        backend=sample,
        collectors={"backend": CollectorStatus(True, 0.004)},
    )


def _exemplars_on(page: str) -> dict[tuple[str, str], tuple[str, float]]:
    """(sample name, le) -> (trace id, value) of every exemplar on a valid OpenMetrics page."""
    return {
        (s.name, s.labels["le"]): (s.exemplar.labels["trace_id"], s.exemplar.value)
        for family in parse_openmetrics(page)  # raises on invalid OpenMetrics
        for s in family.samples
        if s.exemplar is not None
    }


def test_the_openmetrics_page_carries_the_real_spans_request_on_its_buckets() -> None:
    exemplars = Exemplars(window=60.0)
    exemplars.add([request_of(request_span())])
    snap = _snapshot(VLLM.normalize(fixture_text(CAPTURE)))
    page = render_openmetrics(snap, exemplars).decode()
    tid = EXPECTED["trace_id"]
    assert _exemplars_on(page) == {
        ("inferwatch_time_to_first_token_seconds_bucket", "0.01"): (tid, EXPECTED["ttft_seconds"]),
        ("inferwatch_request_duration_seconds_bucket", "0.3"): (tid, EXPECTED["e2e_seconds"]),
        ("inferwatch_request_queue_time_seconds_bucket", "0.3"): (tid, EXPECTED["queue_seconds"]),
        ("inferwatch_request_prefill_time_seconds_bucket", "0.3"): (
            tid,
            EXPECTED["prefill_seconds"],
        ),
        ("inferwatch_request_decode_time_seconds_bucket", "0.3"): (tid, EXPECTED["decode_seconds"]),
        ("inferwatch_inter_token_latency_seconds_bucket", "0.01"): (
            tid,
            EXPECTED["per_token_seconds"],
        ),
    }
    # The text format has no exemplars; its samples are the same either way.
    assert render(snap) == render(snap) and " # {" not in render(snap).decode()


def test_with_several_series_no_request_is_put_on_one() -> None:
    sample = VLLM.normalize(fixture_text(CAPTURE))
    ttft = sample.histograms["time_to_first_token_seconds"]
    ((labels, hist),) = ttft.items()
    other = tuple((k, "1" if k == "engine" else v) for k, v in labels)
    two_engines = {**sample.histograms, "time_to_first_token_seconds": {labels: hist, other: hist}}
    snap = _snapshot(dataclasses.replace(sample, histograms=two_engines))
    exemplars = Exemplars(window=60.0)
    exemplars.add([request_of(request_span())])
    on_page = _exemplars_on(render_openmetrics(snap, exemplars).decode())
    assert on_page and not [name for name, _ in on_page if "first_token" in name]


def test_a_real_prometheus_stores_them_from_a_real_sidecar(tmp_path: Path) -> None:
    # The real span, posted to a real sidecar (a subprocess) polling the real vLLM capture;
    # a real Prometheus with exemplar storage scrapes it as it scrapes any target
    # (OpenMetrics first): /api/v1/query_exemplars returns the span's trace id on the TTFT
    # bucket of its value, the id that the sidecar's slowest-request list shows.
    page = fixture_text(CAPTURE).encode()
    with thread_server(lambda request: (200, page)) as server:
        sidecar = Inferwatch(
            tmp_path,
            f"http://{server}",
            ["--backend", "vllm", "--gpu", "off", "--otlp-traces", "on"],
        ).start()
        prometheus = None
        try:
            started = time.time()
            body = export_request(request_span()).SerializeToString()
            post = urllib.request.Request(
                f"{sidecar.url}/v1/traces", data=body, headers=PROTOBUF, method="POST"
            )
            with urllib.request.urlopen(post, timeout=10) as answer:
                assert answer.status == 200
            prometheus = Prometheus(tmp_path, [sidecar.url.removeprefix("http://")]).start()
            deadline = time.monotonic() + 60  # a guard against hanging, not a bound
            stored: list[dict] = []
            while not stored:
                assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
                time.sleep(1)
                stored = prometheus.exemplars(
                    "inferwatch_time_to_first_token_seconds_bucket", started - 60, time.time()
                )
            with urllib.request.urlopen(f"{sidecar.url}/verdict.json", timeout=10) as answer:
                listed = json.load(answer)["slow_requests"]["ttft"]
        finally:
            if prometheus is not None:
                prometheus.stop()
            sidecar.stop()
    ((series,),) = [stored]
    assert series["seriesLabels"]["le"] == "0.01" and series["seriesLabels"]["job"] == "inferwatch"
    (exemplar,) = series["exemplars"]
    assert exemplar["labels"] == {"trace_id": EXPECTED["trace_id"]}
    assert float(exemplar["value"]) == pytest.approx(EXPECTED["ttft_seconds"])
    assert started - 1 <= float(exemplar["timestamp"]) <= time.time()  # when it was received
    assert [r["trace_id"] for r in listed] == [exemplar["labels"]["trace_id"]]
