"""The server's own TTFT and inter-token latency histograms, scraped from its metrics
page (or inferwatch's) before and after each cell of the sweep; for a server that has no
inter-token histogram but times its decode steps (TGI), those steps (each gives every
running request its next token: what the rules judge its per-token latency on).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

from inferwatch.collect.backends import Backend, detect, feed
from inferwatch.collect.textparse import parse_labels, scan
from inferwatch.collect.upstream import Upstream, UpstreamError
from inferwatch.method.quantile import increase
from inferwatch.model import Histogram
from inferwatch.urls import redact_url

# A sidecar polls the server (0.5 s by default); the server records a request's TTFT when
# its first token leaves the engine. Both are caught up well within this.
SETTLE_SECONDS = 5.0
METRICS_TIMEOUT = 5.0
METRICS_MAX_BYTES = 16 * 1024 * 1024

TTFT = "time_to_first_token_seconds"
ITL = "inter_token_latency_seconds"
DECODE_STEP = "engine_step_seconds"  # its kind="decode" series
SERVER_HISTOGRAMS = (TTFT, ITL, DECODE_STEP)

# inferwatch's own page (``--metrics-url`` at the sidecar) holds the histograms already
# mapped onto the contract; this backend reads it like any server's page.
INFERWATCH_PAGE = Backend(
    name="inferwatch",
    signature=("inferwatch_",),
    labels={"model": "model", "engine": "engine", "kind": "kind"},
    feeds=tuple(feed(name, f"inferwatch_{name}") for name in SERVER_HISTOGRAMS),
)

Histograms = dict[str, Histogram]  # histogram name -> the model's histogram


class ServerHistograms:
    """The server's TTFT and inter-token latency histograms for ``model``, from a metrics page.

    The page is recognised once (a server's own page via :func:`inferwatch.collect.backends.detect`,
    or inferwatch's); ``backend`` and ``version`` name the server for the file's metadata.
    A page of no use at the start (unreadable, unknown, no TTFT histogram for the model)
    leaves the server side out of the whole sweep, ``problem`` saying why; a failed read
    later leaves out only its cell. A server without an ITL histogram gives TTFT alone, or
    its decode steps; one without a TTFT histogram (TGI) its decode steps alone.
    """

    def __init__(self, metrics_url: str, root: str, model: str, note: Callable[[str], None]):
        self._page = Upstream(metrics_url, timeout=METRICS_TIMEOUT, max_bytes=METRICS_MAX_BYTES)
        self._root = Upstream(root, timeout=METRICS_TIMEOUT, max_bytes=METRICS_MAX_BYTES)
        self._url = redact_url(metrics_url)
        self._model = model
        self._note = note
        self._backend: Backend | None = None
        self.backend = "unknown"
        self.version = ""
        self.problem = ""

    async def close(self) -> None:
        await self._page.close()
        await self._root.close()

    async def start(self) -> Histograms | None:
        """Recognise the page and name the server; the histograms now."""
        try:
            text = await self._page.get_exposition("/metrics")
            if INFERWATCH_PAGE.recognises(text):
                self._backend = INFERWATCH_PAGE
                self.backend, self.version = self._sidecar_info(text)
            else:
                self._backend = detect(text)
                self.backend = self._backend.name
                if self._backend.version_path:
                    self.version = await self._root.get_json_field(
                        self._backend.version_path, self._backend.version_field
                    )
            now = self._histograms(text)
        except (UpstreamError, ValueError) as exc:
            self.problem = f"no server-side latency: {self._url}: {exc}"
            now = None
        if not now and not self.problem:
            self.problem = (
                f"no server-side latency: no TTFT histogram or decode steps of {self._model} "
                f"on {self._url}"
            )
        if self.problem:
            self._backend = None
            return None
        return now

    def _sidecar_info(self, text: str) -> tuple[str, str]:
        """(backend, version) from inferwatch's ``inferwatch_backend_info``."""
        name = "inferwatch_backend_info"
        infos = [
            dict(parse_labels(labels)) for labels, _ in scan(text, {name}).samples.get(name, [])
        ]
        ours = [i for i in infos if i.get("model") == self._model] or infos or [{}]
        return ours[0].get("backend", "unknown"), ours[0].get("version", "")

    def _histograms(self, text: str) -> Histograms:
        """The model's histograms on the page, each summed over engines (a page without
        model labels: all of it; the steps: the decode steps); empty without a TTFT
        histogram or decode steps. Raises ValueError for a page to reject."""
        assert self._backend is not None
        out = {}
        histograms = self._backend.normalize(text).histograms
        for name in SERVER_HISTOGRAMS:
            series = {
                labels: h
                for labels, h in (histograms.get(name) or {}).items()
                if name != DECODE_STEP or dict(labels).get("kind") == "decode"
            }
            mine = [h for labels, h in series.items() if dict(labels).get("model") == self._model]
            chosen = mine or list(series.values())
            if chosen:
                out[name] = functools.reduce(Histogram.merged, chosen)
        return out if TTFT in out or DECODE_STEP in out else {}

    async def read(self) -> Histograms | None:
        """The histograms now; None when the server side is out or this read failed."""
        if self._backend is None:
            return None
        try:
            return self._histograms(await self._page.get_exposition("/metrics")) or None
        except (UpstreamError, ValueError) as exc:
            self._note(f"server-side latency left out of a cell: {self._url}: {exc}")
            return None

    async def window(
        self, before: Histograms | None, streamed: int
    ) -> tuple[Histograms | None, Histograms]:
        """(the histograms now, their increase since ``before``), once the TTFT histogram
        has counted the ``streamed`` requests of the window or :data:`SETTLE_SECONDS` have
        passed (without one, at once: a server times a decode step before it sends the
        step's tokens); the increase is empty when either read is missing."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            after = await self.read()
            if after is None or before is None:
                return after, {}
            window = {
                name: increase(before[name], after[name])
                for name in SERVER_HISTOGRAMS
                if name in before and name in after
            }
            settled = TTFT not in window or window[TTFT].count >= streamed
            if settled or time.monotonic() >= deadline:
                return after, window
            await asyncio.sleep(0.1)
