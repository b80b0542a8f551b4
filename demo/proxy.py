"""A reverse proxy with a fault switch: the demo's path between the users and the server.

    python -m demo.proxy --upstream http://127.0.0.1:8000 --port 18000

Forwards every request to the upstream and streams its answer back chunk by chunk (an SSE
stream stays a stream). ``PUT /_fault`` sets what it does to the requests that follow, as
JSON: ``{"delay": 0.2}`` holds each one that many seconds before forwarding it (what a slow
network hop, an ingress queue or a slow tokenizer adds before the engine sees a request),
``{"status": 503}`` answers each one with that status without forwarding (a broken route),
either with ``"path": "/health"`` only the requests for that path (a health check that fails
while the server serves), ``{}`` passes everything through again. ``GET /_fault`` says what is
set. An upstream that refuses the connection (a dead server) gets 502, as from a real proxy.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
from aiohttp import web

FAULT = web.AppKey("fault", dict)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
# Hop-by-hop headers and those aiohttp sets for the new message.
DROPPED = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}


async def fault(request: web.Request) -> web.Response:
    if request.method == "PUT":
        body: dict[str, Any] = await request.json()
        delay, status = float(body.get("delay", 0.0)), body.get("status")
        path = body.get("path")
        if (
            delay < 0
            or (status is not None and not 400 <= int(status) <= 599)
            or (path is not None and not str(path).startswith("/"))
        ):
            raise web.HTTPBadRequest(text="delay >= 0, status 400-599, path /...\n")
        request.app[FAULT].clear()
        request.app[FAULT].update({"delay": delay, "status": status, "path": path})
    return web.json_response(request.app[FAULT])


async def forward(request: web.Request) -> web.StreamResponse:
    now = request.app[FAULT]
    if now.get("path") in (None, request.path):
        if now.get("status"):
            return web.Response(status=int(now["status"]), text="injected by demo.proxy\n")
        if now.get("delay"):
            await asyncio.sleep(now["delay"])
    headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
    try:
        async with request.app[SESSION].request(
            request.method,
            request.app[UPSTREAM] + request.path_qs,
            headers=headers,
            data=await request.read(),
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in DROPPED:
                    response.headers[name] = value
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    except aiohttp.ClientConnectorError:
        return web.Response(status=502, text="upstream refused the connection\n")


async def _session(app: web.Application):
    app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    yield
    await app[SESSION].close()


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app[FAULT] = {}
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/_fault", fault)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(make_app(args.upstream), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
