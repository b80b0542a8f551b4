"""Shared test helpers: the captures in tests/fixtures and an oracle built on
prometheus_client's full text parser (an independent reading of the same page)."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from demo.stack import VllmServer
from inferwatch.collect.backends import BACKENDS, VLLM, Backend
from inferwatch.collect.backends.relabel import LABEL_ORDER
from inferwatch.collect.backends.table import Source
from inferwatch.collect.gpu import GpuSource
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.upstream import Upstream
from inferwatch.collect.window import LatencyWindow
from inferwatch.method.local import Samples
from inferwatch.metrics import Kind
from inferwatch.model import CollectorStatus, Derived, GpuSample, Snapshot
from inferwatch.serve.exposition import render

FIXTURES = Path(__file__).parent / "fixtures"


def captures_of(backend: str) -> list[str]:
    """The captures of one server: named ``<backend>-...``, that backend the longest name a
    capture starts with (``vllm-router-...`` is the router's, not vLLM's)."""

    def server(name: str) -> str:
        return max((b for b in BACKENDS if name.startswith(f"{b}-")), key=len, default="")

    return sorted(p.name for p in FIXTURES.glob("*.prom") if server(p.name) == backend)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/golden/ from what the exporter serves now",
    )


ALERT_SCENARIOS = Path(__file__).parents[1] / "alerts" / "tests" / "scenarios.py"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    # A SIGTERM (a CI timeout, `kill`) tears the fixtures down like Ctrl-C, so the servers
    # they started (vLLM, Prometheus, Alertmanager...) are stopped, not orphaned.
    signal.signal(signal.SIGTERM, _interrupt)


# No real TGI /metrics capture is public (every sample found was a hand-written mock with
# names TGI never used, such as tgi_request_duration_seconds), so this page is built from
# TGI's metric names (router/src, docs/source/reference/metrics.md) in the shape its renderer,
# Rust metrics-exporter-prometheus 0.15, writes: counters without _total and with integer
# values, le last, _sum/_count after the buckets, duration buckets 0.0001 * 1.5^k. It is a
# test input, not a capture, so it is not in tests/fixtures.
TGI_PAGE = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 2048
# TYPE tgi_request_count counter
tgi_request_count 17
# TYPE tgi_request_success counter
tgi_request_success 12
# TYPE tgi_batch_inference_count counter
tgi_batch_inference_count{method="prefill"} 9
tgi_batch_inference_count{method="decode"} 1377
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="0.00015000000000000001"} 0
tgi_request_queue_duration_bucket{le="0.00022500000000000002"} 5
tgi_request_queue_duration_bucket{le="0.0003375"} 9
tgi_request_queue_duration_bucket{le="+Inf"} 12
tgi_request_queue_duration_sum 1.25
tgi_request_queue_duration_count 12
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.00015000000000000001"} 0
tgi_request_duration_bucket{le="+Inf"} 12
tgi_request_duration_sum 30.5
tgi_request_duration_count 12
# TYPE tgi_request_mean_time_per_token_duration histogram
tgi_request_mean_time_per_token_duration_bucket{le="0.0003375"} 0
tgi_request_mean_time_per_token_duration_bucket{le="+Inf"} 12
tgi_request_mean_time_per_token_duration_sum 0.42
tgi_request_mean_time_per_token_duration_count 12
# TYPE tgi_batch_inference_duration histogram
tgi_batch_inference_duration_bucket{method="prefill",le="+Inf"} 9
tgi_batch_inference_duration_sum{method="prefill"} 0.9
tgi_batch_inference_duration_count{method="prefill"} 9
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="40.96"} 2
tgi_request_input_length_bucket{le="+Inf"} 17
tgi_request_input_length_sum 4096
tgi_request_input_length_count 17
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="81.92"} 12
tgi_request_generated_tokens_bucket{le="+Inf"} 12
tgi_request_generated_tokens_sum 384
tgi_request_generated_tokens_count 12
"""


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def exporter_page(
    vllm_page: str,
    gpus: tuple[GpuSample, ...] = (),
    window: tuple[LatencyWindow, float] | None = None,
) -> str:
    """inferwatch's own /metrics page after a good poll of a vLLM server serving
    ``vllm_page`` (and NVML seeing ``gpus``); with ``window`` (the exporter's latency window
    and the poll's time) its latency quantiles over the polls that window has seen."""
    collectors = {"backend": CollectorStatus(True, 0.003)}
    if gpus:
        collectors["gpu"] = CollectorStatus(True, 0.001)
    sample = VLLM.normalize(vllm_page)
    latency = window[0].update(window[1], sample) if window is not None else {}
    snap = Snapshot(
        backend_kind="vllm",
        backend_up=True,
        backend_scrape_seconds=0.003,
        backend=sample,
        gpus=gpus,
        collectors=collectors,
        derived=Derived(latency_window=latency),
    )
    return render(snap).decode()


def promtool_series(pages: Sequence[Samples], target: Mapping[str, str]) -> list[dict[str, str]]:
    """Parsed pages as promtool input series, one sample per page (``_`` where a series is
    missing), the target labels Prometheus would attach added."""
    series: dict[str, list[str]] = {}
    for step, page in enumerate(pages):
        for name, samples in page.items():
            for labels, value in samples:
                text = ",".join(
                    f"{k}={json.dumps(v)}" for k, v in sorted({**labels, **target}.items())
                )
                series.setdefault(f"{name}{{{text}}}", ["_"] * len(pages))[step] = repr(value)
    return [{"series": name, "values": " ".join(values)} for name, values in series.items()]


@contextmanager
def thread_server(answer: Callable[[BaseHTTPRequestHandler], tuple[int, bytes]]) -> Iterator[str]:
    """A plain HTTP server in a thread, for a process other than the test's to read (an
    exporter, Prometheus): each GET is ``answer(request)`` -> (status, text/plain body).
    Yields its ``host:port``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(self)
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def oracle_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample on the page by its name on the wire, as prometheus_client reads it."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    # prometheus_client rejects the "-nan(ind)" MSVC prints for 0/0 (llama.cpp on Windows).
    text = text.replace(" -nan(ind)\n", " NaN\n")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            # The parser appends _total to counters that lack it (TGI, Triton); undo that.
            if name.endswith("_total") and not _on_page(text, name):
                name = name.removesuffix("_total")
            out.setdefault(name, []).append((dict(sample.labels), sample.value))
    return out


def _on_page(text: str, name: str) -> bool:
    return text.startswith(name) or f"\n{name}{{" in text or f"\n{name} " in text


@asynccontextmanager
async def auto_poller(url: str, interval: float) -> AsyncIterator[Poller]:
    """A poller of a real server at ``url`` as ``--backend auto`` runs it; closed on exit."""
    poller = Poller(
        Upstream(url, timeout=5.0, max_bytes=1 << 20), None, None, PollSettings(interval=interval)
    )
    try:
        yield poller
    finally:
        await poller.upstream.close()


def page_value(page: str, metric: str, **labels: str) -> float:
    """The value of the one sample ``metric`` whose labels include ``labels``."""
    matches = [
        value
        for sample_labels, value in oracle_samples(page).get(metric, [])
        if all(sample_labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, f"{metric}{labels}: {len(matches)} samples"
    return matches[0]


def same_number(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def oracle_mapping(backend: Backend, text: str, model_hint: str = "") -> tuple[dict, dict]:
    """What ``backend.normalize`` should give, from prometheus_client's parse of the page
    and the backend's feed table: (values, histograms); a histogram is a dict of
    ``buckets`` ({bound in the contract's unit: count}), ``sum`` and ``count``."""
    if text.lstrip().startswith('"'):  # a body sent JSON-escaped (llama.cpp, late 2025)
        text = json.loads(text)
    samples = oracle_samples(text)
    model_keys = [k for k, v in backend.labels.items() if v == "model"]
    model = next(
        (
            labels[k]
            for series in samples.values()
            for labels, _ in series
            for k in model_keys
            if k in labels
        ),
        model_hint or "unknown",
    )

    def contract_labels(labels: dict[str, str], source: Source) -> tuple:
        names = {**backend.labels, **source.labels}  # the source's own kept labels too
        renamed = {names[k]: v for k, v in labels.items() if k in names}
        for label, values in source.values.items():  # server values in the contract's terms
            if label in renamed:
                renamed[label] = values.get(renamed[label], renamed[label])
        renamed |= source.constant
        key = tuple((k, renamed[k]) for k in LABEL_ORDER if k in renamed)
        return key if key and key[0][0] == "model" else (("model", model), *key)

    def kept(labels: dict[str, str], where) -> bool:
        return all(
            k in labels and (v(labels[k]) if callable(v) else labels[k] == v)
            for k, v in where.items()
        )

    values: dict = {}
    histograms: dict = {}
    for feed in backend.feeds:
        for source in feed.sources:
            if feed.kind is Kind.HISTOGRAM:
                buckets = samples.get(f"{source.name}_bucket")
                if not buckets:
                    continue
                series: dict = {}
                for labels, value in buckets:
                    if not kept(labels, source.where):
                        continue
                    key = contract_labels(labels, source)
                    hist = series.setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
                    bound = float(labels["le"]) * source.scale
                    hist["buckets"][bound] = hist["buckets"].get(bound, 0.0) + value
                for suffix in ("sum", "count"):
                    seen = set()
                    for labels, value in samples.get(f"{source.name}_{suffix}", []):
                        key = contract_labels(labels, source)
                        if key in series and kept(labels, source.where):
                            scale = source.scale if suffix == "sum" else 1.0
                            series[key][suffix] += value * scale
                            seen.add(key)
                    for key in series.keys() - seen:
                        series[key][suffix] = math.nan
                series = {k: h for k, h in series.items() if _complete(h)}
                if series:
                    histograms[feed.key] = series
                break
            if source.name in samples:
                # Series that coincide once extra labels (pid, tp_rank...) are dropped:
                # gauges take the max (stale per-process copies read 0), counters add up.
                merge = max if feed.kind is Kind.GAUGE else (lambda a, b: a + b)
                # A feed that adds its sources (feed_sum) goes on to the next one.
                series = values.pop(feed.key, {}) if feed.adds else {}
                for labels, value in samples[source.name]:
                    if kept(labels, source.where):
                        key = contract_labels(labels, source)
                        value *= source.scale
                        series[key] = merge(series[key], value) if key in series else value
                if series:
                    values[feed.key] = series
                if not feed.adds:
                    break
    return values, histograms


def _complete(hist: dict) -> bool:
    """Whether the exposition format lets this histogram be served: a +Inf bucket, counts
    cumulative, a sum (finite, >= 0) and a count equal to the +Inf bucket (taken from it
    when the page has none). Fills in the count."""
    counts = [count for _, count in sorted(hist["buckets"].items())]
    if math.inf not in hist["buckets"] or counts != sorted(counts):
        return False
    if math.isnan(hist["count"]):
        hist["count"] = counts[-1]
    return hist["count"] == counts[-1] and math.isfinite(hist["sum"]) and hist["sum"] >= 0


def assert_matches_oracle(backend: Backend, text: str, model_hint: str = "") -> None:
    """``backend.normalize`` agrees with :func:`oracle_mapping` on every series."""
    want_values, want_histograms = oracle_mapping(backend, text, model_hint)
    sample = backend.normalize(text, model_hint)
    assert {k: dict(v) for k, v in sample.values.items()} == want_values
    assert set(sample.histograms) == set(want_histograms)
    for key, series in want_histograms.items():
        got = sample.histograms[key]
        assert set(got) == set(series), key
        for labels, want in series.items():
            hist = got[labels]
            wanted = sorted(want["buckets"].items())
            assert [count for _, count in hist.buckets] == [count for _, count in wanted], key
            # Bounds converted to seconds are rounded to 12 significant digits on output.
            for (le, _), (bound, _) in zip(hist.buckets, wanted, strict=True):
                assert math.isclose(float(le), bound, rel_tol=1e-12), (key, le, bound)
            assert same_number(hist.sum, want["sum"]) or math.isclose(hist.sum, want["sum"])
            assert same_number(hist.count, want["count"]), key


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One real vLLM (CPU) for the session, started on first use (~1-2 min on 2 cores).

    Tests that stop it leave it stopped; the next user's ``ensure_running()`` restarts it.
    """
    server = VllmServer(tmp_path_factory.mktemp("vllm"), traced=True)
    yield server
    server.stop()


@pytest.fixture
async def backend_url(aiohttp_server) -> str:
    """A loopback vLLM whose /metrics answers a real capture (its KV cache full)."""
    page = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def poller_for():
    """Builds pollers and closes their HTTP sessions at teardown, even when a test fails.

    ``settings`` are PollSettings fields (interval 0.2 s unless given)."""
    made: list[Poller] = []

    def make(
        url: str,
        *,
        backend: Backend | None = VLLM,
        gpu: GpuSource | None = None,
        timeout: float = 0.5,
        **settings: float | str,
    ) -> Poller:
        upstream = Upstream(url, timeout=timeout, max_bytes=16 * 1024 * 1024)
        made.append(Poller(upstream, backend, gpu, PollSettings(**{"interval": 0.2, **settings})))
        return made[-1]

    yield make
    for poller in made:
        await poller.upstream.close()


def alert_scenarios() -> ModuleType:
    """``alerts/tests/scenarios.py``: the promtool scenarios and their series builder."""
    spec = importlib.util.spec_from_file_location("scenarios", ALERT_SCENARIOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scenarios"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class CliResult:
    """What one ``inferwatch`` command gave: as :class:`subprocess.CompletedProcess` names it."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Callable[..., CliResult]]:
    """Runs ``inferwatch ARGS`` in this process: ``inferwatch.cli.main``, its exit code (an
    argparse usage error's included) and what it printed, with no ``INFERWATCH_*`` variable
    but those given in ``env``.

    For input that must be refused before anything starts: a ``serve`` that gets as far as
    serving fails the test at once (it would not return), and the logging that ``serve``
    sets up is undone afterwards. Whatever needs the process itself (serving, signals,
    ``python -m``) runs the real command in a subprocess instead.
    """
    from inferwatch import cli as inferwatch_cli  # the command's imports, for its tests only
    from inferwatch.serve import command as serve_command

    def started(config: object) -> None:
        raise AssertionError("serve started: the input was accepted")

    monkeypatch.setattr(serve_command, "run", started)
    for name in [k for k in os.environ if k.startswith("INFERWATCH_")]:
        monkeypatch.delenv(name)
    loggers = [logging.getLogger(), logging.getLogger("aiohttp")]
    saved = [(logger.handlers[:], logger.level) for logger in loggers]

    def run(*args: str, env: dict[str, str] | None = None) -> CliResult:
        with monkeypatch.context() as scoped:
            for name, value in (env or {}).items():
                scoped.setenv(name, value)
            capsys.readouterr()
            try:
                code = inferwatch_cli.main(list(args))
            except SystemExit as exc:  # argparse: usage errors, --help, --version
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            out, err = capsys.readouterr()
        return CliResult(code, out, err)

    yield run
    for logger, (handlers, level) in zip(loggers, saved, strict=True):
        logger.handlers[:] = handlers
        logger.setLevel(level)


def capacity_entry(prompt: int, output: int, rate: float, **changes: object) -> dict:
    """An entry of a baseline file's capacity section (``inferwatch.capacity``): ``rate``
    requests/s carried at the goodput target at this prompt and output length."""
    return {
        "prompt_tokens": prompt,
        "output_tokens": output,
        "requests_per_second": rate,
        "concurrency": 2.0,
        "goodput_share": 1.0,
        "target_share": 0.95,
        "arrivals": "poisson",
        "tolerance": 0.1,
        "ended": "converged",
        "steps": [],
    } | changes
