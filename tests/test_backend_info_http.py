"""The new backends over loopback HTTP: servers whose series carry no model label (the
exporter asks their info endpoint once per connection: TGI ``/info``, llama.cpp
``/v1/models`` and ``/props``), auto detection, and SGLang's content negotiation."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import choose_encoder

from inferwatch.collect.backends import LLAMACPP, SGLANG, TGI, TRITON
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.upstream import Upstream
from inferwatch.serve.sidecar import make_app

from conftest import TGI_PAGE, fixture_text, page_value

LLAMA_PAGE = fixture_text("llamacpp-2025-late-go-test-real-dump.prom")


class InfoServer:
    """A loopback server: ``/metrics`` plus JSON documents, counting the requests to each."""

    def __init__(self, metrics: str, documents: dict[str, object]) -> None:
        self.metrics = metrics
        self.documents = documents
        self.hits: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        if request.path == "/metrics":
            if self.metrics == "down":
                return web.Response(status=503, text="loading")
            return web.Response(text=self.metrics, content_type="text/plain")
        if request.path in self.documents:
            return web.json_response(self.documents[request.path])
        return web.Response(status=404, text="not found")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        return app


@pytest.fixture
async def serve(aiohttp_server):
    """Starts an InfoServer and returns it with a poller for it (sessions closed at teardown)."""
    pollers: list[Poller] = []

    async def start(metrics: str, documents: dict, backend=None) -> tuple[InfoServer, Poller]:
        fake = InfoServer(metrics, documents)
        server = await aiohttp_server(fake.app())
        upstream = Upstream(str(server.make_url("")), timeout=1.0, max_bytes=1 << 20)
        pollers.append(Poller(upstream, backend, None, PollSettings(interval=0.2)))
        return fake, pollers[-1]

    yield start
    for poller in pollers:
        await poller.upstream.close()


TGI_INFO = {
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "model_sha": None,
    "max_concurrent_requests": 128,
    "version": "3.3.6",
    "sha": "db931fc",
}


async def test_tgi_model_and_version_come_from_info(serve, aiohttp_client) -> None:
    fake, poller = await serve(TGI_PAGE, {"/info": TGI_INFO}, backend=TGI)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    for _ in range(3):
        await poller.poll_once()
    page = await (await client.get("/metrics")).text()
    labels = {"backend": "tgi", "model": "meta-llama/Llama-3.1-8B-Instruct"}
    assert page_value(page, "inferwatch_requests_waiting", **labels) == 3.0
    assert page_value(page, "inferwatch_engine_steps_total", **labels) == 1386.0
    assert page_value(page, "inferwatch_backend_info", version="3.3.6", **labels) == 1.0
    assert fake.hits == {"/metrics": 3, "/info": 2}  # version and model, once per connection


async def test_llamacpp_model_from_v1_models_and_build_from_props(serve) -> None:
    documents = {
        "/v1/models": {"object": "list", "data": [{"id": "tiny", "object": "model"}]},
        "/props": {"model_alias": "tiny", "build_info": "b11434-0c1e570", "total_slots": 1},
    }
    _fake, poller = await serve(LLAMA_PAGE, documents, backend=LLAMACPP)
    await poller.poll_once()
    sample = poller.snapshot.backend
    assert (sample.model, sample.version) == ("tiny", "b11434-0c1e570")
    assert sample.values["engine_steps"] == {(("model", "tiny"),): 739.0}


async def test_info_is_asked_again_after_the_server_comes_back(serve) -> None:
    fake, poller = await serve(TGI_PAGE, {"/info": TGI_INFO}, backend=TGI)
    await poller.poll_once()
    fake.metrics = "down"
    await poller.poll_once()
    assert not poller.snapshot.backend_up
    fake.documents["/info"] = {**TGI_INFO, "model_id": "Qwen/Qwen3-8B", "version": "3.3.7"}
    fake.metrics = TGI_PAGE
    await poller.poll_once()
    assert (poller.snapshot.backend.model, poller.snapshot.backend.version) == (
        "Qwen/Qwen3-8B",
        "3.3.7",
    )


async def test_missing_info_endpoint_leaves_the_model_unknown(serve) -> None:
    _fake, poller = await serve(LLAMA_PAGE, {}, backend=LLAMACPP)
    await poller.poll_once()
    assert poller.snapshot.backend_up
    assert (poller.snapshot.backend.model, poller.snapshot.backend.version) == ("unknown", "")


async def test_a_page_of_another_server_asks_no_info(serve) -> None:
    fake, poller = await serve(fixture_text("vllm-0.32.0-cpu-idle-after-load.prom"), {}, TGI)
    await poller.poll_once()
    assert "no tgi metrics on the page" in poller.snapshot.collectors["backend"].error
    assert "/info" not in fake.hits


async def test_auto_detects_a_json_escaped_llamacpp_page(serve, aiohttp_client) -> None:
    # Builds ~b7010 until PR #17386 answered text/plain with a JSON-quoted body (#17384).
    documents = {"/v1/models": {"data": [{"id": "qwen3-0.6b"}]}}
    _fake, poller = await serve(json.dumps(LLAMA_PAGE), documents)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    assert poller.backend is LLAMACPP
    page = await (await client.get("/metrics")).text()
    labels = {"backend": "llamacpp", "model": "qwen3-0.6b"}
    assert page_value(page, "inferwatch_prompt_tokens_total", **labels) == 18292.0


async def test_auto_detects_triton_which_labels_its_models(serve) -> None:
    fake, poller = await serve(fixture_text("triton-2.51.0-pytriton-cpu-4-pending.prom"), {})
    await poller.poll_once()
    assert poller.backend is TRITON
    assert poller.snapshot.backend.values["requests_waiting"] == {(("model", "tiny"),): 4.0}
    assert set(fake.hits) == {"/metrics"}  # no info endpoint to ask


async def test_sglang_negotiation_answers_classic_text_to_the_exporter(aiohttp_server) -> None:
    # SGLang mounts prometheus_client's ASGI app: it picks the format from Accept (Prometheus
    # itself asks for OpenMetrics first) and gzips when allowed. The exporter must get text.
    registry = CollectorRegistry()
    Gauge("sglang:num_queue_reqs", "queue", ["model_name"], registry=registry).labels("m").set(3)
    seen: list[tuple[str, str]] = []

    async def metrics(request: web.Request) -> web.Response:
        accept, encoding = request.headers["Accept"], request.headers["Accept-Encoding"]
        seen.append((accept, encoding))
        encoder, content_type = choose_encoder(accept)
        body = encoder(registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    upstream = Upstream(str(server.make_url("")), timeout=1.0, max_bytes=1 << 20)
    poller = Poller(upstream, None, None, PollSettings(interval=0.2))
    try:
        await poller.poll_once()
    finally:
        await upstream.close()
    assert poller.backend is SGLANG
    assert poller.snapshot.backend.values["requests_waiting"] == {(("model", "m"),): 3.0}
    assert choose_encoder(seen[0][0])[1].startswith("text/plain")
    assert seen[0][1] == "identity"
