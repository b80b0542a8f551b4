"""The HTTP app: ``/metrics`` (the latest snapshot), ``/healthz`` and a landing page.

No request handler touches the backend or NVML: ``/metrics`` returns the page rendered
from the poller's latest snapshot (cached per snapshot and format, gzip when asked for),
in OpenMetrics 1.0.0 when the scrape's ``Accept`` header prefers it (Prometheus' does),
else in the text format 0.0.4.
"""

from __future__ import annotations

import asyncio
import gzip
import html
import json
import logging
import math
import os
from collections.abc import Collection
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger

from inferwatch import __version__
from inferwatch.capture.capturer import MANUAL, Capturer
from inferwatch.collect.poller import Poller
from inferwatch.logs import LogLimiter
from inferwatch.method.spec import spec_document
from inferwatch.serve.exemplars import Exemplars
from inferwatch.serve.exposition import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE, Renderer
from inferwatch.serve.listener import HEAD_TIMEOUT
from inferwatch.serve.otlp import OtlpSettings
from inferwatch.serve.otlp import install as install_otlp
from inferwatch.serve.request_checks import request_checks
from inferwatch.serve.runbook_page import RunbookPages
from inferwatch.serve.slow_requests import SlowRequests
from inferwatch.serve.verdict import VerdictHistory
from inferwatch.serve.verdict_page import render_page
from inferwatch.serve.webconfig import WebConfig
from inferwatch.urls import redact_url

log = logging.getLogger(__name__)

POLLER = web.AppKey("poller", Poller)
RENDERER = web.AppKey("renderer", Renderer)
_GZIP_CACHE = web.AppKey("gzip_cache", dict)
VERDICT = web.AppKey("verdict", VerdictHistory)
CAPTURER = web.AppKey("capturer", Capturer)
RUNBOOKS = web.AppKey("runbooks", RunbookPages)
_NO_STORE = {"Cache-Control": "no-store"}
# Every answer's: the pages run no script at all (inline, injected or fetched), load nothing,
# style themselves only, submit no form and are never framed (clickjacking).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
_CHUNK = 1 << 20  # bytes of an archive read at a time

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


class ServerLog(logging.LoggerAdapter):
    """aiohttp's server log, where a request that does not parse as HTTP is one line, no
    traceback and none of its bytes (they may hold a credential), at most one a minute per
    kind of parse error, saying how many were held back meanwhile."""

    def __init__(self) -> None:
        super().__init__(server_logger, {})
        self._limiter = LogLimiter()

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if not isinstance(error, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        kind = type(error).__name__
        held = self._limiter.allow(kind)
        if held is not None:
            log.log(
                min(level, logging.WARNING),  # aiohttp's debug stays debug
                "refused a malformed HTTP request (%s; %d more held back since the last line)",
                kind,
                held,
            )


def wants_openmetrics(accept: str) -> bool:
    """Whether an ``Accept`` header prefers OpenMetrics 1.x over the text format.

    Like prometheus_client's ``choose_encoder``, OpenMetrics is served when asked for with
    no version or a 1.x one (not 0.0.1, nor 2.x: this exporter writes 1.0.0), and the text
    format otherwise, including when nothing listed is served here. Unlike it, q-values
    count: OpenMetrics loses to a text type (``text/plain``, ``text/*``, ``*/*``) of higher
    q, and ``q=0`` refuses it; an equal q keeps OpenMetrics, which was named outright.
    Prometheus sends ``application/openmetrics-text;version=1.0.0;q=0.5,...,*/*;q=0.2``.
    """
    best_openmetrics = best_text = 0.0
    for media_range in accept.split(","):
        media, *params = (part.strip() for part in media_range.split(";"))
        options = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in params)}
        try:
            q = float(options.get("q", "1"))
        except ValueError:
            continue
        if not 0.0 <= q <= 1.0:  # NaN, or out of range: a malformed entry is ignored
            continue
        media = media.lower()
        if media == "application/openmetrics-text":
            version = options.get("version", "").strip('"') or "1"
            if version.split(".")[0] == "1":
                best_openmetrics = max(best_openmetrics, q)
        elif media in ("text/plain", "text/*", "*/*"):
            best_text = max(best_text, q)
    return best_openmetrics > 0.0 and best_openmetrics >= best_text


async def metrics(request: web.Request) -> web.Response:
    renderer = request.app[RENDERER]
    openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
    # A large page takes long to render: off the event loop, so /healthz stays fast.
    body = renderer.cached(openmetrics) or await asyncio.to_thread(renderer.render, openmetrics)
    headers = {
        "Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE,
        "Vary": "Accept, Accept-Encoding",
    }
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        cache = request.app[_GZIP_CACHE]  # format -> (page, its gzip)
        page, compressed = cache.get(openmetrics, (None, b""))
        if page is not body:
            compressed = gzip.compress(body, compresslevel=1)
            cache[openmetrics] = (body, compressed)
        headers["Content-Encoding"] = "gzip"
        body = compressed
    return web.Response(body=body, headers=headers)


async def _content_security_policy(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: :data:`CONTENT_SECURITY_POLICY` on every answer, beside a
    policy the web config sets (a browser enforces both)."""
    response.headers.add("Content-Security-Policy", CONTENT_SECURITY_POLICY)


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


def _header(poller: Poller) -> tuple[str, str, float]:
    return poller.snapshot.backend_kind, redact_url(poller.metrics_url()), poller.settings.interval


async def landing(request: web.Request) -> web.Response:
    """The verdict page; the plain landing page if it cannot be rendered (a bug)."""
    history = request.app[VERDICT]
    await history.refresh()
    backend, url, interval = _header(request.app[POLLER])
    try:
        page = render_page(history.document(), backend, url, interval, _captures(request))
    except Exception:
        log.exception("rendering the verdict page failed")
        page = _LANDING.format(
            version=__version__,
            backend=html.escape(backend),
            url=html.escape(url),
            interval=interval,
        )
    return web.Response(text=page, content_type="text/html", headers=_NO_STORE)


def _captures(request: web.Request) -> dict[str, Any] | None:
    """The capture list as JSON (None: captures are off)."""
    capturer = request.app.get(CAPTURER)
    if capturer is None:
        return None
    return {
        "running": capturer.running,
        "min_interval_seconds": capturer.settings.min_interval,
        "captures": [
            {"name": a.name, "bytes": a.bytes, "time": a.mtime, "url": f"captures/{a.name}"}
            for a in capturer.store.archives()
        ],
        "last": capturer.last,
    }


_CAPTURES_OFF = {"error": "captures are off: start inferwatch serve with --capture-dir"}


async def start_capture(request: web.Request) -> web.Response:
    """``POST /capture[?seconds=N]``: 202 and the capture's name, or why not (409 busy,
    429 too soon with Retry-After, 404 when captures are off)."""
    capturer = request.app.get(CAPTURER)
    if capturer is None:
        return web.json_response(_CAPTURES_OFF, status=404)
    seconds = None
    if "seconds" in request.query:
        try:
            seconds = float(request.query["seconds"])
        except ValueError:
            seconds = math.nan
        if not 0 < seconds <= 3600:  # NaN too
            return web.json_response({"error": "seconds: a number in (0, 3600]"}, status=400)
    decision = capturer.request(MANUAL, seconds)
    doc = {"result": decision.result, "message": decision.message, "name": decision.id}
    if decision.started:
        return web.json_response(doc, status=202)
    if decision.result == "busy":
        return web.json_response(doc, status=409)
    retry = max(1, math.ceil(capturer.seconds_until_allowed()))
    return web.json_response(doc, status=429, headers={"Retry-After": str(retry)})


async def list_captures(request: web.Request) -> web.Response:
    doc = _captures(request)
    if doc is None:
        return web.json_response(_CAPTURES_OFF, status=404)
    return web.json_response(doc, dumps=json.dumps, headers=_NO_STORE)


async def download_capture(request: web.Request) -> web.StreamResponse:
    """An archive of the store, from the file it opened (never a link's target)."""
    capturer = request.app.get(CAPTURER)
    name = request.match_info["name"]
    archive = capturer.store.open_archive(name) if capturer is not None else None
    if archive is None:
        raise web.HTTPNotFound(text="no such capture\n")
    with archive:
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/gzip",
                "Content-Disposition": f'attachment; filename="{name}"',
            }
        )
        response.content_length = os.fstat(archive.fileno()).st_size
        await response.prepare(request)
        while chunk := await asyncio.to_thread(archive.read, _CHUNK):
            await response.write(chunk)
    await response.write_eof()
    return response


async def verdict_json(request: web.Request) -> web.Response:
    history = request.app[VERDICT]
    await history.refresh()
    return web.json_response(history.document(), dumps=json.dumps, headers=_NO_STORE)


async def spec_json(request: web.Request) -> web.Response:
    """What the exporter judges with (thresholds, windows, ``for``s, objectives), as config
    sections: ``diagnose --exporter`` reads it to judge alike."""
    doc = spec_document(request.app[VERDICT].spec)
    return web.json_response(doc, dumps=json.dumps, headers=_NO_STORE)


async def runbook(request: web.Request) -> web.Response:
    page = request.app[RUNBOOKS].page(request.match_info["name"])
    if page is None:
        raise web.HTTPNotFound(text="no such runbook\n")
    return web.Response(text=page, content_type="text/html")


def http_app(
    poller: Poller,
    renderer: Renderer,
    verdict: VerdictHistory,
    capturer: Capturer | None = None,
    *,
    web_config: WebConfig | None = None,
    allowed_hosts: Collection[str] = (),
    head_timeout: float = HEAD_TIMEOUT,
    listen_host: str = "",
    otlp: OtlpSettings | None = None,
) -> web.Application:
    """The routes over the sidecar's parts (built by :func:`inferwatch.serve.sidecar.
    make_app`, the one place that wires them).

    ``web_config`` (from ``--web.config.file``) adds basic auth and response headers; TLS is
    the listener's business (``ssl_context`` in :func:`inferwatch.serve.command.run`).
    ``allowed_hosts`` (``--web.allowed-host``): the Host names answered; without them, the
    names of the listen address (``listen_host``, every interface when empty) are; requests
    from another origin that change state are refused either way
    (:func:`inferwatch.serve.request_checks.request_checks`). Without ``capturer`` the capture
    routes answer 404 with why. A connection that takes longer than ``head_timeout`` seconds
    to send a request's head, counted from its accept or its last answer, is closed
    (:mod:`inferwatch.serve.listener`): aiohttp's keep-alive timeout closes one that waits
    for a head, half-sent or not. ``otlp`` turns on ``POST /v1/traces``
    (:mod:`inferwatch.serve.otlp`): the slowest requests of the verdict's window from the
    server's spans, in the verdict's document.
    """
    security = web_config or WebConfig()
    app = web.Application(
        middlewares=[*request_checks(allowed_hosts, listen_host), *security.middlewares()],
        handler_args={"logger": ServerLog(), "keepalive_timeout": head_timeout},
    )
    if security.headers:
        app.on_response_prepare.append(security.add_headers)
    app.on_response_prepare.append(_content_security_policy)
    app[POLLER] = poller
    app[RENDERER] = renderer
    app[_GZIP_CACHE] = {}
    app[VERDICT] = verdict
    app[RUNBOOKS] = RunbookPages(verdict.spec)
    if capturer is not None:
        app[CAPTURER] = capturer
    app.router.add_post("/capture", start_capture)
    if otlp is not None:
        verdict.slow_requests = SlowRequests(verdict.window, otlp.most)
        renderer.exemplars = Exemplars(verdict.window)
        install_otlp(app, (verdict.slow_requests, renderer.exemplars), otlp.max_bytes)
    app.router.add_get("/captures", list_captures)
    app.router.add_get("/captures/{name}", download_capture)
    app.router.add_get("/", landing)
    app.router.add_get("/verdict.json", verdict_json)
    app.router.add_get("/spec.json", spec_json)
    app.router.add_get("/runbooks/{name}", runbook)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app
