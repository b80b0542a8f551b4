"""The exporter over HTTP, in front of a loopback backend serving captures and garbage."""

from __future__ import annotations

import asyncio
import gzip
import logging

import pytest
from aiohttp import web

from inferwatch.collect.backends import VLLM
from inferwatch.collect.gpu import GpuSource
from inferwatch.serve.web import make_app

from conftest import fixture_text, page_value
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
    info = {"backend": "vllm", "model": "tiny", "version": "0.32.0"}
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
    poller = poller_for(backend.url, gpu=gpu, timeout=0.3)
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


async def test_unreachable_backend(poller_for, aiohttp_client, unused_tcp_port) -> None:
    poller = poller_for(f"http://127.0.0.1:{unused_tcp_port}")
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


def test_credentials_in_the_backend_url_never_reach_logs_or_pages() -> None:
    from inferwatch.collect.upstream import redact_url

    assert redact_url("http://user:s3cret@vllm:8000/metrics") == "http://vllm:8000/metrics"
