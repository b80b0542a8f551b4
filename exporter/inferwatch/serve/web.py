"""The HTTP app: ``/metrics`` (the latest snapshot), ``/healthz`` and a landing page.

No request handler touches the backend or NVML: ``/metrics`` returns the page rendered
from the poller's latest snapshot (cached per snapshot, gzip when asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import html
import json
from collections.abc import AsyncIterator

from aiohttp import web

from inferwatch import __version__
from inferwatch.collect.poller import Poller
from inferwatch.collect.upstream import redact_url
from inferwatch.serve.exposition import CONTENT_TYPE, Renderer
from inferwatch.serve.webconfig import WebConfig

POLLER = web.AppKey("poller", Poller)
RENDERER = web.AppKey("renderer", Renderer)
_GZIP_CACHE = web.AppKey("gzip_cache", dict)

_LANDING = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>inferwatch</title></head>
<body>
<h1>inferwatch {version}</h1>
<p>Sidecar exporter for LLM inference servers: backend <b>{backend}</b> at <code>{url}</code>,
polled every {interval:g} s.</p>
<ul>
<li><a href="metrics">metrics</a></li>
<li><a href="healthz">healthz</a></li>
</ul>
</body></html>
"""


async def metrics(request: web.Request) -> web.Response:
    renderer = request.app[RENDERER]
    # A large page takes long to render: off the event loop, so /healthz stays fast.
    body = renderer.cached() or await asyncio.to_thread(renderer.render)
    headers = {"Content-Type": CONTENT_TYPE}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        cache = request.app[_GZIP_CACHE]
        if cache.get("for") is not body:
            cache["for"], cache["body"] = body, gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
        body = cache["body"]
    return web.Response(body=body, headers=headers)


async def healthz(request: web.Request) -> web.Response:
    """200 while the poll loop is alive (whatever the backend's state), else 503."""
    poller = request.app[POLLER]
    age = poller.seconds_since_poll()
    alive = age is not None and age <= poller.stale_after()
    doc = {
        "status": "ok" if alive else "stale",
        "backend_up": poller.snapshot.backend_up,
        "last_poll_age_seconds": None if age is None else round(age, 3),
    }
    return web.json_response(doc, status=200 if alive else 503, dumps=json.dumps)


async def landing(request: web.Request) -> web.Response:
    poller = request.app[POLLER]
    page = _LANDING.format(
        version=__version__,
        backend=html.escape(poller.snapshot.backend_kind),
        url=html.escape(redact_url(poller.metrics_url())),
        interval=poller.settings.interval,
    )
    return web.Response(text=page, content_type="text/html")


def make_app(
    poller: Poller, *, run_poller: bool = True, web_config: WebConfig | None = None
) -> web.Application:
    """The exporter's app; with ``run_poller`` its lifetime owns the poll loop.

    ``web_config`` (from ``--web.config.file``) adds basic auth and response headers; TLS is
    the listener's business (``ssl_context`` in :func:`inferwatch.serve.command.run`).
    """
    security = web_config or WebConfig()
    app = web.Application(middlewares=security.middlewares())
    if security.headers:
        app.on_response_prepare.append(security.add_headers)
    app[POLLER] = poller
    app[RENDERER] = Renderer(lambda: poller.snapshot)
    app[_GZIP_CACHE] = {}
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    if run_poller:
        app.cleanup_ctx.append(_poll_loop)
    return app


async def _poll_loop(app: web.Application) -> AsyncIterator[None]:
    poller = app[POLLER]
    task = asyncio.create_task(poller.run(), name="inferwatch-poller")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await poller.upstream.close()
    if poller.gpu is not None:
        poller.gpu.close()
