"""The composition root: the one place that builds the sidecar from its parts.

The poller reads the backend and NVML and knows its other sources only as
:class:`~inferwatch.collect.poller.Source` (the canary's probes, the captures' counts);
the verdict records the rendered pages and tells its listeners (the capture's triggers);
the capturer is given the verdict's document and the renderer's page. Nothing below this
module imports what sits above it (``lint-imports`` checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection

from aiohttp import web

from inferwatch.capture.capturer import Capturer, CaptureSettings, capture_upstream
from inferwatch.collect.canary import Canary, CanarySettings
from inferwatch.collect.poller import Poller
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.serve.exposition import Renderer
from inferwatch.serve.listener import HEAD_TIMEOUT
from inferwatch.serve.otlp import OtlpSettings
from inferwatch.serve.verdict import VerdictHistory
from inferwatch.serve.web import CAPTURER, POLLER, VERDICT, http_app
from inferwatch.serve.webconfig import WebConfig

log = logging.getLogger("inferwatch")

_CANARY = web.AppKey("canary_settings", CanarySettings)


def make_app(
    poller: Poller,
    *,
    run_poller: bool = True,
    web_config: WebConfig | None = None,
    spec: Spec | None = None,
    capture: CaptureSettings | None = None,
    canary: CanarySettings | None = None,
    allowed_hosts: Collection[str] = (),
    head_timeout: float = HEAD_TIMEOUT,
    listen_host: str = "",
    otlp: OtlpSettings | None = None,
) -> web.Application:
    """The exporter's app over ``poller``; with ``run_poller`` its lifetime owns the poll
    loop (and the verdict's, which records the polls; without, it records on request).

    ``spec`` (thresholds, rate window, runbook links) is the verdict's; the defaults when
    None. ``capture`` turns evidence capture on (``POST /capture``, ``GET /captures``, and
    the triggers of ``capture.on`` on the verdict); its connection to the server is its own.
    ``canary`` runs the canary's probe loop for the app's lifetime, on its own task.
    ``head_timeout`` (the seconds a connection has to send a request's head), ``allowed_hosts``
    (or, without them, the names of ``listen_host``: the Host names answered) and ``otlp``
    (the OTLP trace receiver): :func:`inferwatch.serve.web.http_app`'s.
    """
    spec = spec_from_config({}) if spec is None else spec
    renderer = Renderer(lambda: poller.snapshot)
    verdict = VerdictHistory(poller, spec, page=renderer.page_of)
    capturer = None
    if capture is not None:
        upstream = poller.upstream
        capturer = Capturer(
            capture,
            poller,
            verdict.document,
            renderer.render,
            spec,
            capture_upstream(upstream.base_url, upstream.headers, upstream.max_bytes),
        )
        poller.register("capture", capturer)
        verdict.listeners.append(capturer.observe)
    app = http_app(
        poller,
        renderer,
        verdict,
        capturer,
        web_config=web_config,
        allowed_hosts=allowed_hosts,
        head_timeout=head_timeout,
        listen_host=listen_host,
        otlp=otlp,
    )
    if capturer is not None:
        app.cleanup_ctx.append(_capture_lifetime)
    if canary is not None:
        app[_CANARY] = canary
        app.cleanup_ctx.append(_canary_lifetime)
    if run_poller:
        app.cleanup_ctx.append(_poll_loop)
        app.cleanup_ctx.append(_verdict_loop)
    return app


async def _canary_lifetime(app: web.Application) -> AsyncIterator[None]:
    """The canary's probe loop for the app's lifetime, on its own task; each poll reads it."""
    task = asyncio.create_task(run_canary(app[_CANARY], app[POLLER]), name="inferwatch-canary")
    yield
    await _stop(task)


async def run_canary(settings: CanarySettings, poller: Poller) -> None:
    """Probe until cancelled; with ``--canary auto``, only once the server is known to have
    no TTFT histogram of its own (else the canary never starts, and no canary series is
    served)."""
    if settings.only_without_ttft:
        backend = await poller.recognised()
        if not backend.serves_inference:
            log.info("canary off (--canary auto): %s is read on its metrics port", backend.name)
            return
        if backend.measures_ttft:
            log.info("canary off (--canary auto): %s measures TTFT itself", backend.name)
            return
        log.info("canary on (--canary auto): %s has no TTFT histogram", backend.name)
    canary = Canary(settings)  # made in the app's loop: its client session belongs there
    poller.register("canary", canary)
    try:
        await canary.run()
    finally:
        await canary.close()


async def _capture_lifetime(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[CAPTURER].close()  # a capture under way is cancelled; its profiler stopped


async def _poll_loop(app: web.Application) -> AsyncIterator[None]:
    poller = app[POLLER]
    task = asyncio.create_task(poller.run(), name="inferwatch-poller")
    yield
    await _stop(task)
    await poller.upstream.close()
    if poller.gpu is not None:
        poller.gpu.close()


async def _verdict_loop(app: web.Application) -> AsyncIterator[None]:
    history = app[VERDICT]
    every = max(history.step / 2, history.poller.settings.interval)

    async def record() -> None:
        while True:
            await asyncio.sleep(every)
            await history.refresh()  # never raises

    task = asyncio.create_task(record(), name="inferwatch-verdict")
    yield
    await _stop(task)


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
