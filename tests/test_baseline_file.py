"""The baseline file: strict parsing, the comparable cell, exposed series, derived thresholds."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from inferwatch.baseline import Baseline, load, parse, series, to_yaml
from inferwatch.calibration import thresholds_from
from inferwatch.collect.backends import VLLM
from inferwatch.collect.load import WindowedLoad, WindowedShape
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.upstream import Upstream
from inferwatch.settings import ConfigError

from conftest import capacity_entry


def cell(concurrency: int, prompt: int, ttft_p95: float, itl_p95: float = 0.02) -> dict:
    return {
        "concurrency": concurrency,
        "prompt_tokens": prompt,
        "output_tokens": 64,
        "requests": 40,
        "errors": 0,
        "ttft_seconds": {"p50": ttft_p95 / 2, "p95": ttft_p95, "p99": ttft_p95 * 1.2},
        "itl_seconds": {"p50": itl_p95 / 2, "p95": itl_p95, "p99": itl_p95 * 1.5},
        "e2e_seconds": {"p50": 0.5, "p95": 0.8, "p99": 0.9},
        "requests_per_second": 5.0,
        "output_tokens_per_second": 320.0,
    }


DOC = {
    "inferwatch_baseline": 1,
    "metadata": {"backend": "vllm", "model": "tiny"},
    "cells": [
        cell(1, 128, 0.02),
        cell(1, 512, 0.05),
        cell(4, 128, 0.04),
        cell(4, 512, 0.09),
        cell(4, 2048, 0.30),
        cell(16, 128, 0.15, itl_p95=0.05),
        cell(16, 512, 0.40, itl_p95=0.06),
    ],
}


def test_round_trip() -> None:
    baseline = parse(DOC)
    assert parse(yaml.safe_load(to_yaml(baseline))) == baseline


@pytest.mark.parametrize(
    ("running", "concurrency", "prompt"),
    [(0, 1, 128), (1, 1, 128), (3, 4, 512), (10, 16, 128), (2.5, 4, 512), (100, 16, 128)],
)
def test_comparable_cell_is_the_nearest_concurrency_and_median_prompt(
    running: float, concurrency: int, prompt: int
) -> None:
    chosen = parse(DOC).comparable(running)
    assert (chosen.concurrency, chosen.prompt_tokens) == (concurrency, prompt)


def test_series_for_the_windows_load() -> None:
    sample = VLLM.normalize(
        'vllm:num_requests_running{engine="0",model_name="tiny"} 3\n'
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0\n'
    )
    out = series(parse(DOC), sample, 3.0)
    labels = (
        ("backend", "vllm"),
        ("model", "tiny"),
        ("concurrency", "4"),
        ("prompt_tokens", "512"),
        ("output_tokens", "64"),
        ("percentile", "95"),
    )
    assert out["baseline_time_to_first_token_seconds"][labels] == 0.09
    assert out["baseline_inter_token_latency_seconds"][labels] == 0.02
    assert len(out["baseline_request_duration_seconds"]) == 3


def test_series_compare_with_the_servers_histograms_where_the_sweep_read_them() -> None:
    doc = copy.deepcopy(DOC)
    doc["cells"][3]["server_ttft_seconds"] = {"p50": 0.03, "p95": 0.06, "p99": 0.07}
    sample = VLLM.normalize('vllm:num_requests_running{engine="0",model_name="tiny"} 3\n')
    out = series(parse(doc), sample, 3.0)
    p95 = {labels: v for labels, v in out["baseline_time_to_first_token_seconds"].items()}
    assert [v for labels, v in p95.items() if ("percentile", "95") in labels] == [0.06]
    itl = out["baseline_inter_token_latency_seconds"]  # no server ITL: the client's
    assert [v for labels, v in itl.items() if ("percentile", "95") in labels] == [0.02]


def test_thresholds_from_the_busiest_cells() -> None:
    found = thresholds_from(parse(DOC), 1.5, window_seconds=300)
    assert {name: d.value for name, d in found.items()} == {
        "ttft_p95_seconds": pytest.approx(0.6),
        "itl_p95_seconds": pytest.approx(0.09),
        "itl_p99_seconds": pytest.approx(0.135),
        "min_request_rate": pytest.approx(0.05),  # 15 requests per 5 m window
        "min_token_rate": pytest.approx(0.05 * 64),
    }
    assert found["ttft_p95_seconds"].source == (
        "1.5 x 0.4 s, the client's TTFT p95 at concurrency 16 (prompt 512, output 64)"
    )
    assert thresholds_from(Baseline({}, ()), 1.5, 300) == {}


def test_the_itl_tail_bound_is_a_server_bucket_above_its_p99() -> None:
    doc = copy.deepcopy(DOC)
    # The server's ITL at concurrency 16: a p99 of 49 ms at most; its buckets as vLLM's.
    doc["cells"][-2]["server_itl_seconds"] = {"p50": 0.004, "p95": 0.02, "p99": 0.03}
    doc["cells"][-1]["server_itl_seconds"] = {"p50": 0.005, "p95": 0.03, "p99": 0.049}
    doc["metadata"]["server_bucket_bounds"] = {"itl": [0.01, 0.025, 0.05, 0.075, 0.1]}
    found = thresholds_from(parse(doc), 1.5, window_seconds=300)
    assert found["itl_tail_bound_seconds"].value == 0.075  # the first >= 73.5 ms
    assert found["itl_tail_bound_seconds"].source == (
        "the server's smallest ITL bucket bound at or above 1.5 x 0.049 s, its ITL p99 at "
        "concurrency 16 (prompt 512, output 64)"
    )
    # No bound without the server's buckets, or when none is above the p99's margin.
    assert "itl_tail_bound_seconds" not in thresholds_from(parse(DOC), 1.5, window_seconds=300)
    doc["metadata"]["server_bucket_bounds"] = {"itl": [0.01, 0.025, 0.05]}
    assert "itl_tail_bound_seconds" not in thresholds_from(parse(doc), 1.5, window_seconds=300)


def test_thresholds_prefer_the_servers_histograms_and_a_slow_service_is_still_judged() -> None:
    doc = copy.deepcopy(DOC)
    for c in doc["cells"]:
        c["server_ttft_seconds"] = {"p50": 0.1, "p95": 0.2, "p99": 0.3}
        c["server_itl_seconds"] = {"p50": 0.01, "p95": 0.04, "p99": 0.08}
        c["requests_per_second"] = 0.02  # one request every 50 s
        c["output_tokens_per_second"] = 1.28
    found = thresholds_from(parse(doc), 2.0, window_seconds=300)
    assert found["ttft_p95_seconds"].value == pytest.approx(0.4)
    assert found["ttft_p95_seconds"].source.startswith("2 x 0.2 s, the server's TTFT p95")
    assert found["itl_p99_seconds"].value == pytest.approx(0.16)
    assert found["min_request_rate"].value == pytest.approx(0.01)  # half of 0.02/s
    assert found["min_token_rate"].value == pytest.approx(0.01 * 64)


@pytest.mark.parametrize(("client_p50", "expected"), [(0.2, 0.285), (0.03, None)])
def test_a_slow_measured_path_raises_the_client_gap_threshold(
    client_p50: float, expected: float | None
) -> None:
    doc = copy.deepcopy(DOC)
    for c in doc["cells"]:
        c["server_ttft_seconds"] = {"p50": 0.01, "p95": 0.02, "p99": 0.03}
    doc["cells"][1]["ttft_seconds"]["p50"] = client_p50  # concurrency 1, prompt 512
    found = thresholds_from(parse(doc), 1.5, window_seconds=300)
    if expected is None:  # 1.5 x 0.02 s stays under the default's 0.1 s
        assert "client_gap_seconds" not in found
        return
    assert found["client_gap_seconds"].value == pytest.approx(expected)
    assert found["client_gap_seconds"].source == (
        "1.5 x 0.19 s, client TTFT p50 - server TTFT p50 at concurrency 1 (prompt 512, output 64)"
    )


def broken(path: str, value: object) -> dict:
    doc = copy.deepcopy(DOC)
    target = doc
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"cells": []}, "not an inferwatch baseline"),
        (broken("cells", []), "cells: expected a non-empty list"),
        (broken("cells.0.concurrency", 0), r"cells\[0\].concurrency: must be at least 1"),
        (broken("cells.1.ttft_seconds", {"p50": 1}), r"cells\[1\].ttft_seconds: expected"),
        (broken("cells.2.requests_per_second", "fast"), "is not a non-negative number"),
        (broken("cells.2.errors", KeyError), r"cells\[2\]: missing 'errors'"),
        (broken("cells.3.ttft", 1), r"cells\[3\]: unknown key 'ttft'"),
    ],
)
def test_bad_documents_name_the_problem(doc: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(doc)


def test_duplicate_cells_are_rejected() -> None:
    doc = copy.deepcopy(DOC)
    doc["cells"].append(cell(4, 128, 0.04))
    with pytest.raises(ValueError, match="same concurrency"):
        parse(doc)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("cells: [\n")
    with pytest.raises(ConfigError, match=f"baseline {path}: not YAML"):
        load(path)
    path.write_text(yaml.safe_dump(broken("cells.0.requests", -1)))
    with pytest.raises(ConfigError, match=r"cells\[0\].requests: -1 is not a non-negative integer"):
        load(path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inferwatch", *args], capture_output=True, text=True, timeout=60
    )


def test_generate_derives_latency_thresholds_from_a_baseline(tmp_path: Path) -> None:
    path = tmp_path / "baseline.yaml"
    path.write_text(to_yaml(parse(DOC)))
    out = run("generate", "--out", str(tmp_path), "--baseline", str(path))
    assert out.returncode == 0, out.stderr
    rules = (tmp_path / "alerts" / "inferwatch-rules.yaml").read_text()
    assert 'quantile="0.95"}) > 0.6' in rules  # TTFT: 1.5 x 0.40 s at concurrency 16
    assert "<= 0.09" in rules  # ITL: 1.5 x 0.06 s


def test_a_baseline_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "baseline.yaml"
    path.write_bytes(b"inferwatch_baseline: 1\nmetadata: {model: \xff}\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 41\)"):
        load(path)


def test_serve_with_a_bad_baseline_exits_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "baseline.yaml"
    path.write_text("inferwatch_baseline: 2\n")
    out = run("serve", "--baseline", str(path), "--gpu", "off")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"inferwatch: error: baseline {path}: not an inferwatch baseline "
        "(expected `inferwatch_baseline: 1`)"
    )


def running_page(running: int) -> str:
    return (
        f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}\n'
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0\n'
    )


def test_windowed_load_is_time_weighted_and_forgets_what_left_the_window() -> None:
    load = WindowedLoad(window=10.0)
    pages = [VLLM.normalize(running_page(n)) for n in (1, 1, 2, 2)]
    means = [load.update(float(t), page) for t, page in enumerate(pages)]
    assert means == [1.0, 1.0, 1.0, pytest.approx(4 / 3)]  # 1 s at 1, 1 s at 1, 1 s at 2
    assert load.update(4.0, None) == pytest.approx(4 / 3)  # a failed poll changes nothing
    for t in range(5, 20):
        mean = load.update(float(t), VLLM.normalize(running_page(4)))
    assert mean == 4.0


async def poller_over(aiohttp_server, pages: list[str], baseline: Baseline) -> tuple:
    """(upstream, poller) of a server that answers ``pages`` in turn, polled one second
    apart with the baseline and a 15 s rate window."""
    answers = iter(pages)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=next(answers), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    upstream = Upstream(str(server.make_url("")), timeout=2.0, max_bytes=1 << 20)
    clock = iter(float(t) for t in range(100))
    settings = PollSettings(baseline=baseline, latency_window=15.0)
    return upstream, Poller(upstream, VLLM, None, settings, clock=lambda: next(clock))


async def test_a_flickering_running_count_keeps_the_cell_of_the_windows_load(
    aiohttp_server,
) -> None:
    # Each poll sees 1 or 8 running, in turn: the last count's cell would flip between the
    # cells of 1 and 4 at every poll; the window's load (4.5) keeps the cell of 4.
    baseline = parse(DOC)
    assert baseline.comparable(1).concurrency == 1 and baseline.comparable(8).concurrency == 4
    pages = [running_page(8 if i % 2 else 1) for i in range(40)]
    upstream, poller = await poller_over(aiohttp_server, pages, baseline)
    chosen = []
    try:
        for _ in range(40):
            snapshot = await poller.poll_once()
            ttft = snapshot.baseline["baseline_time_to_first_token_seconds"]
            chosen.append(next(dict(labels)["concurrency"] for labels in ttft))
    finally:
        await upstream.close()
    assert chosen[:2] == ["1", "1"]  # the first polls: 1 running so far
    assert set(chosen[4:]) == {"4"}


def lengths_page(requests: int, prompt_tokens: int, output_tokens: int) -> str:
    """A vLLM page whose finished requests' lengths add up to the given totals."""
    lines = []
    for name, total in (("prompt", prompt_tokens), ("generation", output_tokens)):
        family = f"vllm:request_{name}_tokens"
        labels = 'engine="0",model_name="tiny"'
        lines += [
            f"# TYPE {family} histogram",
            f'{family}_bucket{{{labels},le="+Inf"}} {requests}.0',
            f"{family}_sum{{{labels}}} {total}.0",
            f"{family}_count{{{labels}}} {requests}.0",
        ]
    return "\n".join(lines) + "\n"


def test_the_windowed_shape_is_the_mean_length_of_what_finished_in_the_window() -> None:
    shape = WindowedShape(window=10.0)
    assert shape.update(0.0, VLLM.normalize(lengths_page(10, 1280, 640))) is None  # one poll
    # 10 more requests of 100 prompt and 200 output tokens each.
    assert shape.update(5.0, VLLM.normalize(lengths_page(20, 2280, 2640))) == (100.0, 200.0)
    assert shape.update(6.0, None) == (100.0, 200.0)  # a failed poll changes nothing
    # The first poll leaves the window; then the server restarts: the window starts again.
    assert shape.update(16.0, VLLM.normalize(lengths_page(30, 2580, 2940))) == (30.0, 30.0)
    assert shape.update(17.0, VLLM.normalize(lengths_page(1, 50, 10))) is None


async def test_the_capacity_series_is_the_nearest_shapes_scaled_to_the_live_outputs(
    aiohttp_server,
) -> None:
    # Measured: 8 req/s at 128/64 and 2 req/s at 2048/64. Live requests of 100 prompt and
    # 128 output tokens: the 128/64 shape, at half its rate.
    doc = copy.deepcopy(DOC)
    doc["capacity"] = [capacity_entry(128, 64, 8.0), capacity_entry(2048, 64, 2.0)]
    pages = [lengths_page(10 * (i + 1), 1000 * (i + 1), 1280 * (i + 1)) for i in range(5)]
    upstream, poller = await poller_over(aiohttp_server, pages, parse(doc))
    try:
        first = (await poller.poll_once()).baseline["baseline_capacity_requests_per_second"]
        later = (await poller.poll_once()).baseline["baseline_capacity_requests_per_second"]
    finally:
        await upstream.close()
    shape = (("backend", "vllm"), ("model", "tiny"))
    # Before two polls saw requests finish: the lowest capacity measured, as measured.
    assert first == {(*shape, ("prompt_tokens", "2048"), ("output_tokens", "64")): 2.0}
    assert later == {(*shape, ("prompt_tokens", "128"), ("output_tokens", "64")): 4.0}


def test_the_load_searchs_curve_is_exposed_at_the_shape_the_capacity_is_read_at() -> None:
    # Two rates measured at 128/64; the live requests are that shape.
    steps = [
        {
            "rate": r,
            "requests": 16,
            "requests_per_second": got,
            "goodput_share": good,
            "concurrency": c,
            "ttft_p95": ttft,
            "itl_p95": 0.02,
            "e2e_p95": e2e,
        }
        for r, got, good, c, ttft, e2e in (
            (2.0, 1.9, 1.0, 0.5, 0.05, 1.3),
            (4.5, 4.1, 0.9, 2.2, 0.4, 2.0),
        )
    ]
    doc = copy.deepcopy(DOC)
    doc["capacity"] = [capacity_entry(128, 64, 4.0, steps=steps)]
    sample = VLLM.normalize(lengths_page(1, 128, 64))
    out = series(parse(doc), sample, running=1.0, shape=(128.0, 64.0))
    at = (("backend", "vllm"), ("model", "tiny"), ("prompt_tokens", "128"), ("output_tokens", "64"))
    assert out["baseline_step_requests_per_second"] == {
        (*at, ("rate", "2")): 1.9,
        (*at, ("rate", "4.5")): 4.1,
    }
    assert out["baseline_step_goodput_ratio"][(*at, ("rate", "4.5"))] == 0.9
    latency = out["baseline_step_latency_seconds"]
    assert latency[(*at, ("rate", "4.5"), ("latency", "ttft"))] == 0.4
    assert latency[(*at, ("rate", "2"), ("latency", "e2e"))] == 1.3
    assert len(latency) == 6
