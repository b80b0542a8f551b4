"""The canary (``serve --canary on``): one small streamed request at a time, timed client side.

Every ``interval`` seconds it streams one completion through the sweep's client
(:class:`inferwatch.collect.stream.Client`) to the server, or to any URL the user's traffic
goes through, and keeps each probe's TTFT, inter-token gaps and end-to-end time in
fixed-bound histograms. Never two probes in flight, each under a timeout, backing off after
failures up to ``max_backoff``; nothing runs on the scrape path. Probes are marked (``"user":
"inferwatch-canary"``, header ``X-Inferwatch-Canary: 1``) so that what sits in front of the
server can leave them out of its accounting; the server's own histograms count them.

Each probe carries a W3C ``traceparent`` of its own, sampled: a server that traces its
requests records the probe under that trace id, and the canary's histograms carry, per
bucket, the latest probe's id as an exemplar (on the OpenMetrics page). Where the server
sends no spans (TGI, SGLang, llama.cpp and Triton as inferwatch reads them), the probes are
the requests a slow bucket leads to.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from inferwatch.collect.stream import WORDS, Client, Sample, request_input
from inferwatch.logs import CauseLog, LogLimiter
from inferwatch.method.quantile import histogram_quantile, increase, sample_quantile
from inferwatch.metrics import (
    CANARY_E2E_BOUNDS,
    CANARY_ITL_BOUNDS,
    CANARY_RESULTS,
    CANARY_TTFT_BOUNDS,
)
from inferwatch.model import BackendSample, Exemplar, Histogram, Sink

log = logging.getLogger("inferwatch.canary")

MARKER_USER = "inferwatch-canary"
MARKER_HEADERS = MappingProxyType({"X-Inferwatch-Canary": "1"})


@dataclass(frozen=True)
class CanarySample:
    """What the canary measured so far (``serve --canary on``), cumulative since start.

    Histograms of its successful probes (client side, fixed bounds), probe counts by
    result, and the gap between its median TTFT and the server's own over a recent window
    (None unless both observed a first token in it).
    """

    model: str
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    probes: Mapping[str, float]
    ttft_gap_seconds: float | None = None
    problem: str = ""  # a probe that fails is counted, not a problem of the reading

    def write(self, sink: Sink, backend: str) -> None:
        """``inferwatch_canary_time_to_first_token_seconds_bucket{backend="vllm",model=
        "tiny",le="0.1"} 12.0`` and the other histograms, probes by result, the TTFT gap."""
        labels = (("backend", backend), ("model", self.model))
        sink.histograms("canary_time_to_first_token_seconds", {labels: self.ttft}, ())
        sink.histograms("canary_inter_token_latency_seconds", {labels: self.itl}, ())
        sink.histograms("canary_request_duration_seconds", {labels: self.e2e}, ())
        probes = {(*labels, ("result", r)): n for r, n in self.probes.items()}
        sink.scalars("canary_probes", probes)
        if self.ttft_gap_seconds is not None:
            sink.scalars("canary_ttft_gap_seconds", {labels: self.ttft_gap_seconds})


@dataclass(frozen=True)
class CanarySettings:
    """``url`` is the API base (``http://host:8000``; ``/v1/...`` is appended)."""

    url: str
    api: str = "completions"
    model: str | None = None  # None: the model the backend's page names
    interval: float = 15.0
    timeout: float = 10.0
    prompt_tokens: int = 8
    output_tokens: int = 8
    api_key: str | None = field(default=None, repr=False)
    max_backoff: float = 120.0  # the longest wait after failures (never below interval)
    gap_window: float | None = None  # None: 5 min, as the rules' default rate window
    # --canary auto: probe only a server whose table has no TTFT histogram.
    only_without_ttft: bool = False

    @property
    def window(self) -> float:
        """Seconds the TTFT gap is measured over: at least two probes' worth."""
        return max(300.0 if self.gap_window is None else self.gap_window, 2 * self.interval)


class Counts:
    """A cumulative histogram being filled: counts per bound (``le``), then +Inf."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.les = (*(repr(b) for b in bounds), "+Inf")
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self.latest: list[Exemplar | None] = [None] * (len(bounds) + 1)  # per bucket

    def observe(self, value: float, trace: tuple[str, float] | None = None) -> None:
        """Count ``value``; with ``trace`` (its request's trace id, when observed), that
        request becomes its bucket's exemplar."""
        bucket = bisect_left(self.bounds, value)
        self.counts[bucket] += 1
        self.sum += value
        self.count += 1
        if trace is not None:
            self.latest[bucket] = Exemplar(trace[0], value, trace[1])

    def frozen(self) -> Histogram:
        cumulative, running = [], 0
        for le, n in zip(self.les, self.counts, strict=True):
            running += n
            cumulative.append((le, float(running)))
        exemplars = tuple(self.latest) if any(self.latest) else ()
        return Histogram(tuple(cumulative), self.sum, float(self.count), exemplars)


def server_ttft(sample: BackendSample | None) -> Histogram | None:
    """The server's own TTFT histogram, its series (engines) merged by bound, or None."""
    series = sample.histograms.get("time_to_first_token_seconds") if sample else None
    hists = [h for h in (series or {}).values() if not math.isnan(h.count)]
    if not hists:
        return None
    merged: dict[str, float] = {}
    for hist in hists:
        for le, count in hist.buckets:
            merged[le] = merged.get(le, 0.0) + count
    total = math.fsum(h.sum for h in hists)
    return Histogram(tuple(merged.items()), total, math.fsum(h.count for h in hists))


class TtftGap:
    """The canary's median TTFT minus the server's over the last ``window`` seconds.

    At each poll: the TTFTs of the canary's probes since the last one, and the server's TTFT
    histogram; the server's median is read from its buckets' increase over the window, as
    ``histogram_quantile`` reads it. Medians, not means: a tail on either side (the probe's
    own process kept off the CPU a moment, another client's long prompt) leaves them be,
    while a delay on the path moves every probe alike. A server restart starts afresh.
    """

    def __init__(self, window: float) -> None:
        self.window = window
        self._points: deque[tuple[float, tuple[float, ...], Histogram]] = deque()
        self._waiting: list[float] = []  # probes seen while the server's page was missing

    def update(self, now: float, probes: Sequence[float], server: Histogram | None) -> float | None:
        self._waiting.extend(probes)
        if server is None:
            return None
        if self._points and server.count < self._points[-1][2].count:
            self._points.clear()  # the server's counters went back: it restarted
        self._points.append((now, tuple(self._waiting), server))
        self._waiting.clear()
        while len(self._points) > 1 and self._points[1][0] <= now - self.window:
            self._points.popleft()
        canary = [ttft for _, ttfts, _ in list(self._points)[1:] for ttft in ttfts]
        observed = increase(self._points[0][2], server)
        server_median = histogram_quantile(0.5, observed.buckets)
        if not canary or math.isnan(server_median):
            return None
        return sample_quantile(0.5, canary) - server_median


def prompt_input(settings: CanarySettings) -> dict[str, Any]:
    """The probe's prompt (about one token a word) and its marker, for the chosen API."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(settings.prompt_tokens))
    return {**request_input(text, settings.api), "user": MARKER_USER}


class Canary:
    """Runs the probes (:meth:`run`, its own task) and hands out immutable counts."""

    def __init__(
        self,
        settings: CanarySettings,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        self._client = Client(
            settings.url.rstrip("/"),
            settings.api,
            settings.model or "",
            timeout=settings.timeout,
            connections=1,
            api_key=settings.api_key,
            headers=MARKER_HEADERS,
        )
        self._input = prompt_input(settings)
        self._ttft = Counts(CANARY_TTFT_BOUNDS)
        self._itl = Counts(CANARY_ITL_BOUNDS)
        self._e2e = Counts(CANARY_E2E_BOUNDS)
        self._probes = dict.fromkeys(CANARY_RESULTS, 0)
        self._gap = TtftGap(settings.window)
        self._new_ttfts: list[float] = []  # since the last sample()
        self._log = CauseLog("canary probe", unit="probes")
        self._bug_log = LogLimiter()
        self._said_no_model = False
        self.in_flight = 0
        self.failures = 0  # consecutive
        self._server_up: bool | None = None  # as the last poll saw it
        self._wake = asyncio.Event()  # the server came back up: end the backoff

    @property
    def model(self) -> str:
        return self._client.model

    async def close(self) -> None:
        await self._client.close()

    def sample(self, now: float, server: BackendSample | None) -> CanarySample:
        """The counts so far, and the TTFT gap against the server's page of this poll."""
        if not self.settings.model and server is not None and server.model != "unknown":
            self._client.model = server.model  # the model the backend names
        if server is not None and self._server_up is False and self.failures:
            self._wake.set()  # probe now, not at the end of a backoff of up to max_backoff
        self._server_up = server is not None
        probes, self._new_ttfts = self._new_ttfts, []
        gap = self._gap.update(now, probes, server_ttft(server))
        return CanarySample(
            model=self.model or "unknown",
            ttft=self._ttft.frozen(),
            itl=self._itl.frozen(),
            e2e=self._e2e.frozen(),
            probes=MappingProxyType({k: float(v) for k, v in self._probes.items()}),
            ttft_gap_seconds=gap,
        )

    async def probe_once(self) -> Sample | None:
        """One probe, counted (one that raises as ``bad_stream``); None while no model is
        known to ask for."""
        if not self.model:
            if not self._said_no_model:
                log.info("canary waits for the backend to name its model (or --canary-model)")
                self._said_no_model = True
            return None
        trace_id = secrets.token_hex(16)
        traceparent = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}  # sampled
        self.in_flight += 1
        try:
            async with asyncio.timeout(self.settings.timeout):
                tokens = self.settings.output_tokens
                sample = await self._client.stream(self._input, tokens, traceparent)
        except TimeoutError:
            error = f"no complete answer within {self.settings.timeout:g} s"
            sample = Sample(error=error, kind="timeout")
        except Exception as exc:  # a request the client cannot make, or a bug: still counted
            log.debug("canary probe raised", exc_info=True)
            error = " ".join(f"the probe raised {type(exc).__name__}: {exc}".split())[:200]
            sample = Sample(error=error, kind="bad_stream")
        finally:
            self.in_flight -= 1
        self._record(sample, trace_id)
        return sample

    def _record(self, sample: Sample, trace_id: str) -> None:
        if sample.ok:
            trace = (trace_id, time.time())
            self._probes["ok"] += 1
            self._ttft.observe(sample.ttft, trace)
            self._new_ttfts.append(sample.ttft)
            for gap in sample.gaps:
                self._itl.observe(gap, trace)
            self._e2e.observe(sample.e2e, trace)
            self._log.ok()
            return
        kind = sample.kind if sample.kind in self._probes else "bad_stream"
        self._probes[kind] += 1
        if sample.status in (400, 422) and self._client.ask_exact_length:
            # ignore_eos/min_tokens may be what the server refuses: ask without them.
            self._client.ask_exact_length = False
            log.info(
                "canary: the server refused a probe (%s); asking without an exact length",
                sample.error,
            )
        self._log.failed(kind, sample.error)

    def next_delay(self, sample: Sample | None) -> float:
        """Seconds to the next probe: the interval, doubled per consecutive failure, capped."""
        interval = self.settings.interval
        if sample is None or sample.ok:
            self.failures = 0
            return interval
        self.failures += 1
        # At most half the gap window: two probes per window keep the failure ratio defined.
        cap = min(self.settings.max_backoff, self.settings.window / 2)
        return min(interval * 2.0 ** min(self.failures, 30), max(cap, interval))

    async def _pause(self, delay: float) -> None:
        """Wait ``delay`` seconds, or until the server is seen up again after failures."""
        tasks = {
            asyncio.ensure_future(self._sleep(delay)),
            asyncio.ensure_future(self._wake.wait()),
        }
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()

    async def run(self) -> None:
        """Probe forever, one at a time; a bug is logged, never raised."""
        while True:
            sample: Sample | None
            self._wake.clear()
            try:
                sample = await self.probe_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                if self._bug_log.allow("probe") is not None:
                    log.exception("canary probe failed")
                sample = Sample(error="bug", kind="bad_stream")  # back off all the same
            await self._pause(self.next_delay(sample))


def describe(settings: CanarySettings, redact: Callable[[str], str]) -> str:
    """One line for the start-up log."""
    model = settings.model or "the backend's model"
    when = (
        " if the server has no TTFT histogram (--canary auto)" if settings.only_without_ttft else ""
    )
    return (
        f"canary: one {settings.api} probe of {model} at {redact(settings.url)} every "
        f"{settings.interval:g} s (timeout {settings.timeout:g} s){when}"
    )
