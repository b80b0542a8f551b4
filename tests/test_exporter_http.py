"""The exporter over HTTP, in front of a loopback backend serving captures and garbage."""

from __future__ import annotations

import asyncio
import gc
import gzip
import logging
import platform
import socket
import time
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

from inferwatch.collect.backends import VLLM
from inferwatch.collect.gpu import GpuSource
from inferwatch.serve.selfmetrics import MAX_AGE as SELF_METRICS_MAX_AGE
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.web import wants_openmetrics

from conftest import fixture_text, page_value, thread_server
from fake_nvml import FakeGpu, FakeNvml

CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
TINY = {"backend": "vllm", "model": "tiny", "engine": "0"}


class Backend:
    """A loopback server whose /metrics answer the test can change."""

    def __init__(self) -> None:
        self.requests = 0
        self.mode = "capture"

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        mode = self.mode
        if mode == "capture":
            return web.Response(text=CAPTURE, content_type="text/plain")
        if mode == "500":
            return web.Response(status=500, text="Internal Server Error")
        if mode == "html":
            return web.Response(
                text="<html><body>It works!</body></html>", content_type="text/html"
            )
        if mode == "html-as-text":
            return web.Response(
                text="<html><body>502 Bad Gateway</body></html>\n", content_type="text/plain"
            )
        if mode == "truncated-line":
            return web.Response(text=CAPTURE[: len(CAPTURE) // 2], content_type="text/plain")
        if mode == "truncated-body":
            # Promise the whole page, send half, hang up.
            resp = web.StreamResponse(
                headers={"Content-Type": "text/plain", "Content-Length": str(len(CAPTURE))}
            )
            await resp.prepare(request)
            await resp.write(CAPTURE[: len(CAPTURE) // 2].encode())
            request.transport.close()
            return resp
        if mode == "50MB":
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            line = b'vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0\n' * 1000
            for _ in range(50 * 1024 * 1024 // len(line)):
                await resp.write(line)
            return resp
        if mode == "hang":
            await asyncio.sleep(30)
        if mode == "no-vllm":
            return web.Response(
                text='http_requests_total{handler="/health"} 4.0\n', content_type="text/plain"
            )
        raise AssertionError(mode)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/version", self.version)
        return app


@pytest.fixture
async def backend(aiohttp_server):
    fake = Backend()
    server = await aiohttp_server(fake.app())
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


async def test_serves_the_normalized_capture_without_touching_the_backend(
    poller_for, backend, aiohttp_client
) -> None:
    poller = poller_for(backend.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    polled = backend.requests
    for _ in range(5):
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        page = await resp.text()
    assert backend.requests == polled  # scrapes are served from the snapshot
    assert page_value(page, "inferwatch_requests_waiting", **TINY) == 20.0
    assert page_value(page, "inferwatch_backend_up", backend="vllm") == 1.0
    info = {"backend": "vllm", "model": "tiny", "version": "0.32.0", "server": backend.url}
    assert page_value(page, "inferwatch_backend_info", **info) == 1.0
    ttft = "inferwatch_time_to_first_token_seconds_bucket"
    assert page_value(page, ttft, le="0.04", **TINY) == 17.0
    assert page_value(page, "inferwatch_collector_success", collector="backend") == 1.0


GARBAGE = {
    "500": "HTTP 500 from",
    "html": "answered text/html, not Prometheus text",
    "html-as-text": "no vllm metrics on the page",
    "truncated-line": "exposition truncated",
    "truncated-body": "cut short",
    "50MB": "exceeds 16 MiB",
    "hang": "no answer from",
    "no-vllm": "no vllm metrics on the page",
}


@pytest.mark.parametrize("mode", sorted(GARBAGE))
async def test_bad_backend_flips_up_to_zero_logs_once_and_keeps_gpu_data(
    poller_for, mode: str, backend, aiohttp_client, caplog
) -> None:
    gpu = GpuSource(nvml=FakeNvml([FakeGpu(0, util=30)]))
    gpu.start()
    # Short, for the hanging backend; reading 16 MiB on a busy machine may take longer.
    timeout = 10.0 if mode == "50MB" else 0.3
    poller = poller_for(backend.url, gpu=gpu, timeout=timeout)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    assert poller.snapshot.backend_up
    backend.mode = mode
    with caplog.at_level(logging.WARNING, logger="inferwatch.poller"):
        for _ in range(3):
            await poller.poll_once()
    page = await (await client.get("/metrics")).text()
    assert page_value(page, "inferwatch_backend_up", backend="vllm") == 0.0
    assert page_value(page, "inferwatch_collector_success", collector="backend") == 0.0
    assert "inferwatch_requests_waiting" not in page  # no stale backend data
    assert "inferwatch_gpu_utilization_ratio{" in page  # GPU data keeps flowing
    warnings = [r.getMessage() for r in caplog.records if r.name == "inferwatch.poller"]
    assert len(warnings) == 1, warnings  # rate-limited: one line for three failed polls
    assert GARBAGE[mode] in warnings[0]
    assert "\n" not in warnings[0]
    backend.mode = "capture"
    with caplog.at_level(logging.INFO, logger="inferwatch.poller"):
        await poller.poll_once()
    assert poller.snapshot.backend_up
    assert any("recovered after 3 failed polls" in r.getMessage() for r in caplog.records)


async def test_metrics_answers_while_the_backend_hangs(poller_for, backend, aiohttp_client) -> None:
    backend.mode = "hang"
    poller = poller_for(backend.url, timeout=5.0)
    client = await aiohttp_client(make_app(poller))  # the real poll loop runs
    await asyncio.sleep(0.3)  # the loop is now stuck waiting on the backend
    assert backend.requests == 1
    for _ in range(10):
        resp = await asyncio.wait_for(client.get("/metrics"), timeout=1.0)
        assert resp.status == 200
    assert poller.snapshot.backend_up is False


async def test_unreachable_backend(poller_for, aiohttp_client) -> None:
    # A port bound and never listening refuses, and no other test's server can take it (a
    # free port can be: pytest-xdist runs the others beside this one).
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        poller = poller_for(f"http://127.0.0.1:{held.getsockname()[1]}")
        client = await aiohttp_client(make_app(poller, run_poller=False))
        await poller.poll_once()
    page = await (await client.get("/metrics")).text()
    assert page_value(page, "inferwatch_backend_up", backend="vllm") == 0.0
    assert "cannot connect to" in poller.snapshot.collectors["backend"].error


async def test_auto_detects_vllm_from_the_page(poller_for, backend, aiohttp_client) -> None:
    poller = poller_for(backend.url, backend=None)
    assert poller.snapshot.backend_kind == "unknown"
    await poller.poll_once()
    assert poller.snapshot.backend_kind == "vllm"
    assert poller.backend is VLLM


async def test_auto_detection_failure_names_the_problem(poller_for, backend) -> None:
    backend.mode = "no-vllm"
    poller = poller_for(backend.url, backend=None)
    await poller.poll_once()
    assert "cannot tell the backend" in poller.snapshot.collectors["backend"].error


async def test_full_metrics_url_is_used_as_given(poller_for, backend) -> None:
    poller = poller_for(backend.url + "/metrics")
    await poller.poll_once()
    assert poller.snapshot.backend_up and poller.snapshot.backend.version == "0.32.0"


async def test_gzip_when_asked(poller_for, backend, aiohttp_client) -> None:
    poller = poller_for(backend.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert resp.headers["Content-Encoding"] == "gzip"
    page = gzip.decompress(await resp.read()).decode()
    assert page_value(page, "inferwatch_requests_waiting", **TINY) == 20.0


async def test_healthz_and_landing_page(poller_for, backend, aiohttp_client) -> None:
    poller = poller_for(backend.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    resp = await client.get("/healthz")
    assert resp.status == 503  # no poll has completed yet
    await poller.poll_once()
    resp = await client.get("/healthz")
    assert resp.status == 200
    assert (await resp.json())["backend_up"] is True
    backend.mode = "500"
    await poller.poll_once()
    resp = await client.get("/healthz")
    assert resp.status == 200  # the sidecar is alive even when the backend is not
    assert (await resp.json())["backend_up"] is False
    landing = await (await client.get("/")).text()
    assert '<a href="metrics">' in landing and backend.url in landing


async def test_the_role_is_the_flags_else_the_pages(poller_for, backend, aiohttp_client) -> None:
    """``--role`` names the server's role where its page says none (a vLLM without a KV
    connector says none: no role label)."""
    pages = []
    for role in ("auto", "decode"):
        poller = poller_for(backend.url, role=role)
        client = await aiohttp_client(make_app(poller, run_poller=False))
        await poller.poll_once()
        pages.append(await (await client.get("/metrics")).text())
    auto, decode = pages
    assert 'role="' not in auto
    assert page_value(decode, "inferwatch_backend_info", role="decode") == 1.0


async def test_the_role_the_page_tells_is_on_the_page(poller_for, aiohttp_client) -> None:
    """A vLLM decode instance of a NIXL pair (its KV fetch count): role decode, unless
    ``--role`` says otherwise."""
    page = fixture_text("vllm-0.34.0-synthetic-nixl-decode.prom").encode()
    with thread_server(lambda _: (200, page)) as where:
        served = []
        for role in ("auto", "both"):
            poller = poller_for(f"http://{where}", role=role)
            client = await aiohttp_client(make_app(poller, run_poller=False))
            await poller.poll_once()
            served.append(await (await client.get("/metrics")).text())
    assert page_value(served[0], "inferwatch_backend_info", role="decode") == 1.0
    assert page_value(served[1], "inferwatch_backend_info", role="both") == 1.0


async def test_credentials_in_the_backend_url_never_reach_logs_or_pages(
    poller_for, backend, aiohttp_client
) -> None:
    """The page names the server the sidecar reads by its origin (what a router calls the
    worker), without the URL's ``user:password@``."""
    poller = poller_for(backend.url.replace("http://", "http://user:s3cret@"))
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    page = await (await client.get("/metrics")).text()
    assert page_value(page, "inferwatch_backend_info", server=backend.url) == 1.0
    assert "s3cret" not in page


# --- OpenMetrics on request, and the exporter's own process series ------------------------

PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"

NEGOTIATION = {
    PROMETHEUS_2: True,
    PROMETHEUS_3: True,
    "application/openmetrics-text": True,
    "Application/OpenMetrics-Text; Version=1.0.0": True,
    "application/openmetrics-text; version=1.0.0; q=0.2": True,  # the only one listed
    "text/plain;q=0.5, application/openmetrics-text;q=0.5": True,  # a tie: named outright
    "application/openmetrics-text;version=1.0.0,text/plain": True,
    "": False,
    "*/*": False,
    "text/plain": False,
    "text/plain;version=0.0.4": False,
    "application/json": False,  # nothing served here: the text format
    "application/openmetrics-text;version=0.0.1": False,  # a version not written here
    "application/openmetrics-text;version=2.0.0": False,
    "application/openmetrics-text;q=0": False,  # refused
    "application/openmetrics-text;q=0.2,text/plain;q=0.5": False,
    "application/openmetrics-text;q=0.2,*/*": False,
    "application/openmetrics-text;q=0.9,text/*;q=1": False,
    "application/openmetrics-text;q=abc": False,  # malformed entries are ignored
    "application/openmetrics-text;q=2": False,
    "application/openmetrics-text;q=nan": False,
    ",;=,;;q=": False,
}


@pytest.mark.parametrize(("accept", "openmetrics"), NEGOTIATION.items())
def test_accept_header_negotiation(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept) is openmetrics


def openmetrics_families(page: str) -> dict:
    return {f.name: f for f in parse_openmetrics(page)}  # raises on invalid OpenMetrics


@pytest.mark.parametrize("accept", [PROMETHEUS_2, PROMETHEUS_3])
async def test_openmetrics_when_the_scraper_prefers_it(
    accept: str, poller_for, backend, aiohttp_client
) -> None:
    poller = poller_for(backend.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    resp = await client.get("/metrics", headers={"Accept": accept})
    assert resp.status == 200
    assert resp.headers["Content-Type"] == OPENMETRICS
    assert "Accept" in resp.headers["Vary"]
    page = await resp.text()
    assert page.endswith("\n# EOF\n")
    families = openmetrics_families(page)
    waiting = families["inferwatch_requests_waiting"].samples
    assert [s.value for s in waiting if s.labels == TINY] == [20.0]
    finished = families["inferwatch_requests_finished"]  # counter family: no _total
    assert finished.type == "counter"
    assert {s.name for s in finished.samples} == {"inferwatch_requests_finished_total"}
    ttft = families["inferwatch_time_to_first_token_seconds"].samples
    assert [s.value for s in ttft if s.labels == {**TINY, "le": "0.04"}] == [17.0]
    assert families["inferwatch_backend_up"].samples[0].value == 1.0
    assert families["process_cpu_seconds"].type == "counter"
    # The same poll in the text format carries the same backend series.
    text = await (await client.get("/metrics")).text()
    assert page_value(text, "inferwatch_requests_waiting", **TINY) == 20.0


@pytest.mark.parametrize(
    "accept",
    [None, "*/*", "text/plain;version=0.0.4", "application/openmetrics-text;q=0.1,*/*;q=0.2"],
)
async def test_text_format_stays_the_default(
    accept: str | None, poller_for, backend, aiohttp_client
) -> None:
    poller = poller_for(backend.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    headers = {"Accept": accept} if accept is not None else {}
    resp = await client.get("/metrics", headers=headers, skip_auto_headers=["Accept"])
    assert resp.headers["Content-Type"] == TEXT
    page = await resp.text()
    assert "# EOF" not in page
    assert "# TYPE inferwatch_requests_finished_total counter" in page
    assert page_value(page, "inferwatch_requests_waiting", **TINY) == 20.0


async def test_gzip_is_kept_per_format(poller_for, backend, aiohttp_client) -> None:
    poller = poller_for(backend.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    for accept in ("text/plain", PROMETHEUS_2, "text/plain", PROMETHEUS_2):
        resp = await client.get(
            "/metrics",
            headers={"Accept": accept, "Accept-Encoding": "gzip"},
            auto_decompress=False,
        )
        assert resp.headers["Content-Encoding"] == "gzip"
        page = gzip.decompress(await resp.read()).decode()
        assert page.endswith("# EOF\n") is (accept == PROMETHEUS_2)


@pytest.mark.parametrize("mode", ["500", "html-as-text", "truncated-line"])
async def test_bad_backend_in_openmetrics_is_a_valid_page_with_up_zero(
    mode: str, poller_for, backend, aiohttp_client
) -> None:
    poller = poller_for(backend.url, timeout=0.3)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    backend.mode = mode
    await poller.poll_once()
    resp = await client.get("/metrics", headers={"Accept": PROMETHEUS_2})
    assert resp.status == 200
    families = openmetrics_families(await resp.text())
    assert families["inferwatch_backend_up"].samples[0].value == 0.0
    assert "inferwatch_requests_waiting" not in families


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="ProcessCollector reads /proc")
async def test_process_series_are_present_plausible_and_fresh_each_poll(
    poller_for, backend, aiohttp_client
) -> None:
    poller = poller_for(backend.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    first = await (await client.get("/metrics")).read()
    assert await (await client.get("/metrics")).read() == first  # one render per poll
    page = first.decode()

    def value(name: str, **labels: str) -> float:
        return page_value(page, name, **labels)

    assert value("process_start_time_seconds") <= time.time()
    assert value("process_start_time_seconds") > time.time() - 30 * 86400
    assert value("process_cpu_seconds_total") > 0.0
    assert value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes")
    assert value("process_resident_memory_bytes") > 10 * 1024 * 1024  # Python + aiohttp
    assert 3 <= value("process_open_fds") <= value("process_max_fds")
    assert value("python_info", version=platform.python_version()) == 1.0
    collections = value("python_gc_collections_total", generation="0")
    assert 0 < collections <= gc.get_stats()[0]["collections"]  # this process's, read then
    before = value("process_cpu_seconds_total")
    sum(i * i for i in range(2_000_000))  # some CPU to account for
    await asyncio.sleep(SELF_METRICS_MAX_AGE)  # they are read again once they are this old
    await poller.poll_once()  # a new poll: a new page, with the process read again
    page = (await (await client.get("/metrics")).read()).decode()
    assert value("process_cpu_seconds_total") > before
