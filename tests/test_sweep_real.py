"""``inferwatch baseline`` against a real vLLM on CPU: the sweep, its file, and its TTFT
checked against the server's own histogram.

What "agrees with the server's histogram within the reported gap" means here, per cell:

1. the server's TTFT histogram grew by exactly the cell's requests over the cell's window
   (the window is the cell, nothing more, nothing less);
2. at every bucket bound, no more client TTFTs than server TTFTs lie at or below it: each
   request's server TTFT (vLLM: arrival in the API server -> first token out of the engine)
   lies inside its client TTFT (request sent -> first token event read), so the client
   distribution sits at or right of the server's everywhere;
3. the client mean TTFT is at least the server's exact mean (the histogram's sum / count:
   no bucket error);
4. the reported gap (client p50 - server p50) is at least minus the width of the bucket
   that holds the server p50: interpolating inside a bucket is the histogram's only error,
   so the client p50 can fall below the server's estimate only within that bucket.

Each is a consequence of the client seeing a token only after the server produced it, so
they hold however loaded the machine is; none is true by construction of the gap.
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import pytest

from demo.stack import Inferwatch, VllmServer, http_get, metric_value
from inferwatch.baseline import load, to_yaml
from inferwatch.cli import main
from inferwatch.collect.backends import VLLM
from inferwatch.method.quantile import sample_quantile
from inferwatch.settings import resolve
from inferwatch.tools.sweep import command, report

pytestmark = pytest.mark.vllm

MODEL = "tiny"


def server_ttft_bounds(vllm_server: VllmServer) -> list[float]:
    page = http_get(f"{vllm_server.url}/metrics")[1].decode()
    (hist,) = VLLM.normalize(page).histograms["time_to_first_token_seconds"].values()
    return [float(le) for le, _ in hist.buckets]


def test_small_sweep_agrees_with_the_servers_histogram(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    vllm_server.ensure_running()
    bounds = server_ttft_bounds(vllm_server)
    cache_hits = vllm_server.metric("vllm:prefix_cache_hits_total")
    flags = {
        "url": vllm_server.url,
        "model": MODEL,
        "out": tmp_path / "baseline.yaml",
        "concurrency": (1, 4),
        "prompt_tokens": (64, 256),
        "output_tokens": (32,),
    }
    plan = command.Plan.from_values(resolve(command.OPTIONS, flags, {}, env={}))
    progress = io.StringIO()
    started = time.monotonic()
    result = asyncio.run(command.run(plan, report.Progress(progress, plan)))
    duration = time.monotonic() - started
    print(report.table(result.results, None), f"\n{duration:.1f} s", progress.getvalue())

    assert [r.key for r in result.results] == [(1, 64, 32), (1, 256, 32), (4, 64, 32), (4, 256, 32)]
    assert (result.metadata["backend"], result.metadata["version"]) == ("vllm", "0.32.0")
    # Every prompt was new to the server: its prefix cache served no block of any of them.
    assert vllm_server.metric("vllm:prefix_cache_hits_total") == cache_hits
    for cell in result.results:
        where = f"cell {cell.key}"
        assert len(cell.ok) == 8 and not cell.errors, (where, cell.errors)
        assert all(s.output_tokens == 32 for s in cell.ok), where  # ignore_eos honoured
        assert abs(cell.mean_prompt_tokens() - cell.prompt_tokens) <= 0.1 * cell.prompt_tokens

        window = cell.server_window
        client = sorted(s.ttft for s in cell.ok)
        assert window is not None and window.count == 8, where  # 1. the window is the cell
        for le, server_count in window.buckets:  # 2. the client CDF never leads the server's
            assert sum(t <= float(le) for t in client) <= server_count, (where, le)
        assert sum(client) / 8 >= window.sum / window.count, where  # 3. exact means

        measured = cell.cell()
        server_p50 = measured.server_ttft_seconds.p50
        client_p50 = measured.ttft_seconds.p50
        assert client_p50 == pytest.approx(sample_quantile(0.5, client), abs=1e-6)
        upper = next(b for b in bounds if b >= server_p50)
        lower = max([0.0, *(b for b in bounds if b < upper)])
        gap = client_p50 - server_p50  # what the table prints
        assert gap >= -(upper - lower) - 1e-6, (where, client_p50, server_p50)  # 4.

    path = tmp_path / "baseline.yaml"
    path.write_text(to_yaml(result.baseline()))
    baseline = load(path)
    assert len(baseline.cells) == 4
    assert all(c.server_ttft_seconds is not None for c in baseline.cells)

    # serve --baseline accepts the file and exposes the cell comparable to an idle server.
    sidecar = Inferwatch(tmp_path, vllm_server.url, ["--baseline", str(path), "--gpu", "off"])
    sidecar.start()
    try:
        expected = baseline.comparable(0)
        p95 = sidecar.metric("inferwatch_baseline_time_to_first_token_seconds", 'percentile="95"')
        assert p95 == expected.ttft()[0].p95  # the server's histogram, as live TTFT is read
        assert f'prompt_tokens="{expected.prompt_tokens}"' in sidecar.page()
    finally:
        sidecar.stop()


def test_command_through_the_sidecars_page(
    vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--metrics-url`` at inferwatch: the TTFT comes from its re-exported histogram, one
    poll behind the server's, and backend and version from its backend_info."""
    vllm_server.ensure_running()
    sidecar = Inferwatch(tmp_path, vllm_server.url, ["--poll-interval", "0.5", "--gpu", "off"])
    sidecar.start()
    out = tmp_path / "b.yaml"
    try:
        status = main(
            ["baseline", "--url", vllm_server.url, "--model", MODEL, "--out", str(out),
             "--metrics-url", sidecar.url, "--concurrency", "2", "--prompt-tokens", "64",
             "--output-tokens", "16", "--gpu-name", "none (CPU)"]
        )  # fmt: skip
        observed = metric_value(sidecar.page(), "inferwatch_time_to_first_token_seconds_count")
    finally:
        sidecar.stop()
    stdout = capsys.readouterr().out
    print(stdout)
    assert status == 0
    assert stdout.splitlines()[0].split()[:3] == ["conc", "prompt", "output"]
    (cell,) = load(out).cells
    meta = load(out).metadata
    assert (meta["backend"], meta["version"], meta["gpu"]) == ("vllm", "0.32.0", "none (CPU)")
    assert meta["metrics_url"] == sidecar.url
    assert cell.requests == 8 and cell.errors == 0
    assert cell.server_ttft_seconds is not None
    assert observed >= cell.requests


def test_chat_without_a_chat_template_fails_in_one_line(
    vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The tiny model has no chat template: the probe says so and nothing is written."""
    vllm_server.ensure_running()
    out = tmp_path / "b.yaml"
    status = main(
        ["baseline", "--url", vllm_server.url, "--model", MODEL, "--out", str(out),
         "--api", "chat"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and not out.exists()
    assert err[-1].startswith(
        f"inferwatch: error: probe request to {vllm_server.url}/v1/chat/completions failed: "
        "HTTP 400: "
    )
    assert "chat template" in err[-1]
