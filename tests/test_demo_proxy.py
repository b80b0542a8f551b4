"""The demo's fault proxy (demo/proxy.py) in front of a server of the test's own."""

from __future__ import annotations

from aiohttp import web

from demo.proxy import make_app
from demo.stack import free_port


async def test_a_path_fault_fails_that_path_alone_and_a_dead_upstream_is_a_502(
    aiohttp_server, aiohttp_client
) -> None:
    """``{"status": 503, "path": "/health"}`` fails the router's health check while the
    server serves everything else; with no server behind it, the proxy answers 502."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    server = await aiohttp_server(app)
    proxy = await aiohttp_client(make_app(str(server.make_url("")).rstrip("/")))
    assert (await proxy.get("/health")).status == 200
    put = await proxy.put("/_fault", json={"status": 503, "path": "/health"})
    assert (await put.json()) == {"delay": 0.0, "status": 503, "path": "/health"}
    assert (await proxy.get("/health")).status == 503
    served = await proxy.get("/v1/models")
    assert served.status == 200 and await served.json() == {"data": []}
    assert (await proxy.put("/_fault", json={"status": 503, "path": "health"})).status == 400
    await proxy.put("/_fault", json={})
    assert (await proxy.get("/health")).status == 200
    dead = await aiohttp_client(make_app(f"http://127.0.0.1:{free_port()}"))
    refused = await dead.get("/v1/models")
    assert refused.status == 502, await refused.text()
