"""The live verdict: the method evaluated by the exporter over its own recent polls.

:class:`VerdictHistory` keeps the pages the exporter serves (``/metrics``' bytes, compressed,
at most :data:`PAGE_BYTES`, thinned where they lie closest together) over the rate window,
and a bounded ring of sparkline points. Each new page yields the verdict over the window, the
report ``diagnose --exporter`` builds (:func:`~inferwatch.method.findings.exporter_report`),
and one point of each sparkline. Every number comes from :mod:`inferwatch.method.local`;
pages of more than :data:`INLINE_SERIES` series are judged off the event loop; requests only
format the result (:mod:`inferwatch.serve.verdict_page`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferwatch.collect.poller import Poller
from inferwatch.collect.textparse import PageReader
from inferwatch.logs import LogLimiter
from inferwatch.method.alerts import Cond
from inferwatch.method.findings import Finding, exporter_labels, exporter_report, fmt, phase_of
from inferwatch.method.local import Samples, Window
from inferwatch.method.signals import SIGNALS
from inferwatch.method.spec import Spec, seconds
from inferwatch.model import Snapshot
from inferwatch.serve.exposition import render
from inferwatch.serve.slow_requests import SlowRequests, spans_say

log = logging.getLogger(__name__)

KEEP_SECONDS = 900.0
MAX_POINTS = 360
DEFAULT_STEP = 5.0
# The most bytes of compressed pages kept over the window: the window of a page of the
# default series budget, about forty times a real vLLM page's.
PAGE_BYTES = 8 << 20
# The most backend series a snapshot may hold for its verdict to be computed on the event
# loop: about four times the samples the largest real capture in tests/fixtures maps (244).
# Handing a usual verdict to a worker thread cost more than computing it (the thread's
# wake-ups and the GIL's hand-overs); a bigger snapshot's verdict is computed in one, so
# that /metrics and /healthz keep answering meanwhile.
INLINE_SERIES = 1_000
# The sparklines: signals by name, in display order.
SERIES = (
    "ttft_p95",
    "itl_p95",
    "queue_share",
    "running",
    "kv_usage",
    "gpu_busy",
    "queued_while_idle_ratio",
    "canary_ttft_gap",
)
# A router's sparklines (a sidecar next to it: no engine, no canary), the router whole.
ROUTER_SERIES = (
    "router_request_rate",
    "router_failure_share",
    "router_retry_rate",
    "router_duration_p95",
    "router_workers_active",
)
PHASE_CODES = {
    "prefill": "prefill",
    "decode": "decode",
    "prefill and decode": "prefill+decode",
}


@dataclass(frozen=True)
class Point:
    """One recorded page: when (poller clock and wall clock) and the series values over the
    window from the previous point (None: no data)."""

    at: float
    wall: float
    backend_up: bool
    values: dict[str, float | None]
    read: dict[str, str] = field(default_factory=dict)  # the signal read, where a fallback


@dataclass(frozen=True)
class Verdict:
    state: str  # "collecting" (fewer than two pages), "healthy" or "findings"
    backend_up: bool | None
    window_seconds: float | None
    phase: str  # prefill, decode, prefill+decode, none; "" while collecting
    phase_detail: str
    phase_signals: dict[str, float | None] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    updated: float | None = None  # wall clock of the newest page


COLLECTING = Verdict("collecting", None, None, "", "waiting for two polls")


def _finding_key(finding: Finding) -> tuple[str, tuple[tuple[str, str], ...]]:
    return finding.alert.name, tuple(sorted(finding.labels.items()))


def _series(snap: Snapshot) -> int:
    """How many series of the backend a snapshot holds (a histogram counts as one)."""
    if snap.backend is None:
        return 0
    return sum(map(len, snap.backend.values.values())) + sum(
        map(len, snap.backend.histograms.values())
    )


def _thin(pages: deque[tuple[float, bytes]], most: int) -> None:
    """Drop pages until they hold at most ``most`` bytes together: the one whose neighbours
    lie closest together, else (two left) the older, else the last."""
    held = sum(len(page) for _, page in pages)
    while held > most:
        gaps = range(1, len(pages) - 1)
        drop = min(gaps, key=lambda i: pages[i + 1][0] - pages[i - 1][0]) if gaps else 0
        held -= len(pages[drop][1])
        del pages[drop]


def number(value: float | None) -> float | None:
    """A value for JSON: None for no data (NaN and infinities included)."""
    return value if value is not None and math.isfinite(value) else None


def compute_verdict(before: Samples, after: Samples, seconds: float, spec: Spec) -> Verdict:
    """The verdict over two pages ``seconds`` apart, as ``diagnose --exporter`` reads them."""
    report = exporter_report("self", before, after, seconds, spec)
    phase_signals = report.phase_signals
    phase, detail = phase_of(phase_signals, spec)
    up = [value for _, value in after.get("inferwatch_backend_up", [])]
    return Verdict(
        state="findings" if report.findings else "healthy",
        backend_up=bool(up) and all(v == 1.0 for v in up),
        window_seconds=seconds,
        phase=PHASE_CODES.get(phase, "none"),
        phase_detail=detail,
        phase_signals=phase_signals,
        findings=tuple(report.findings),
        labels=exporter_labels(after),
    )


def evidence(finding: Finding, spec: Spec) -> list[dict[str, Any]]:
    """Each condition of a finding: the measured value against its threshold."""
    alert = finding.alert

    def role(cond: Cond) -> str:
        return "unless" if cond in alert.unless else ("any_of" if alert.any_of else "when")

    out = []
    for cond, value in finding.evidence:
        signal = SIGNALS[cond.measured]
        bound = cond.bound(spec)
        out.append(
            {
                "signal": cond.measured,
                "label": signal.label,
                "value": number(value),
                "op": cond.op,
                "threshold": bound,
                "threshold_name": cond.threshold if isinstance(cond.threshold, str) else None,
                "unit": signal.unit,
                "role": role(cond),
                "holds": value is not None and cond.holds(value, spec),
                "text": f"{signal.label} {fmt(value, signal.unit)} {cond.op} "
                f"{fmt(bound, signal.unit)}",
            }
        )
    return out


class VerdictHistory:
    """The recent pages of one exporter and the verdict over them; see the module doc."""

    def __init__(
        self,
        poller: Poller,
        spec: Spec,
        *,
        keep_seconds: float = KEEP_SECONDS,
        max_points: int = MAX_POINTS,
        step: float | None = None,
        wall: Callable[[], float] = time.time,
        page: Callable[[Snapshot], bytes] = render,
        page_bytes: int = PAGE_BYTES,
    ) -> None:
        self.poller = poller
        self.spec = spec
        self.window = spec.window_seconds
        self.keep_seconds = max(keep_seconds, self.window)
        # At most the rules' evaluation interval apart, so that a finding's pending time is
        # counted as finely as Prometheus counts an alert's.
        every = min(DEFAULT_STEP, seconds(spec.timing.evaluation_interval))
        self.step = max(poller.settings.interval, every) if step is None else step
        self._points: deque[Point] = deque(maxlen=max_points)
        # The pages (compressed) as old as a window at most: the verdict's first page is
        # the oldest inside it; older ones are never read again.
        self._pages: deque[tuple[float, bytes]] = deque()
        self.page_bytes = page_bytes  # at most, of the pages together
        self._last: tuple[Snapshot | None, Samples] = (None, {})  # newest recorded, parsed
        self._wall = wall
        self._page = page  # a snapshot's /metrics page (the renderer's, in the sidecar)
        self._lock = asyncio.Lock()
        self._reader = PageReader()  # used by _compute only, one at a time (the lock)
        self._bug_log = LogLimiter()
        self.verdict = COLLECTING
        # Called with each new verdict, on the event loop (evidence capture's trigger).
        self.listeners: list[Callable[[Verdict], None]] = []
        # The slowest requests of the window, from the server's spans (None: not received).
        self.slow_requests: SlowRequests | None = None
        # Since when (the poller's clock) each finding of the verdict has held, verdict after
        # verdict: one that has not held for its alert's ``for`` is pending, as in Prometheus.
        self._since: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    @property
    def sparklines(self) -> tuple[str, ...]:
        """The signals drawn: a server's, or a router's next to a router (known once
        ``--backend auto`` has recognised it)."""
        backend = self.poller.backend
        return SERIES if backend is None or backend.serves_inference else ROUTER_SERIES

    async def refresh(self) -> None:
        """Record the poller's snapshot if it is new and ``step`` has passed; never raises."""
        snap, at = self.poller.snapshot, self.poller.last_poll_at
        if at is None or snap is self._last[0]:
            return
        if self._points and at - self._points[-1].at < self.step:
            return
        async with self._lock:
            if snap is self._last[0]:
                return
            try:
                args = (snap, at, tuple(self._points), tuple(self._pages), self._last[1])
                if _series(snap) <= INLINE_SERIES:
                    point, page, parsed, verdict = self._compute(*args)
                else:
                    point, page, parsed, verdict = await asyncio.to_thread(self._compute, *args)
            except Exception:  # a bug must not reach the request path or stop the task
                if self._bug_log.allow("verdict") is not None:
                    log.exception("computing the verdict failed")
                return
            self._points.append(point)
            while self._points and point.at - self._points[0].at > self.keep_seconds:
                self._points.popleft()
            self._pages.append((at, page))
            while at - self._pages[0][0] > self.window:
                self._pages.popleft()
            _thin(self._pages, self.page_bytes)
            self._last = (snap, parsed)
            self._since = {
                key: self._since.get(key, point.at) for key in map(_finding_key, verdict.findings)
            }
            self.verdict = verdict
            for listener in self.listeners:
                try:
                    listener(verdict)
                except Exception:
                    if self._bug_log.allow("listener") is not None:
                        log.exception("a verdict listener failed")

    def _compute(
        self,
        snap: Snapshot,
        at: float,
        points: tuple[Point, ...],
        pages: tuple[tuple[float, bytes], ...],
        previous: Samples,
    ) -> tuple[Point, bytes, Samples, Verdict]:
        text = self._page(snap)
        page = self._reader.read(text.decode())
        values: dict[str, float | None] = dict.fromkeys(self.sparklines)
        read: dict[str, str] = {}
        if points and at > points[-1].at:
            window = Window(previous, page, at - points[-1].at, self.spec)
            readings = {name: window.reading(name) for name in self.sparklines}
            values = {name: value for name, (_, value) in readings.items()}
            read = {name: signal for name, (signal, _) in readings.items() if signal != name}
        point = Point(at, self._wall(), snap.backend_up, values, read)
        first = next(((t, p) for t, p in pages if at - t <= self.window and t < at), None)
        if first is None and points and at > points[-1].at:
            first = (points[-1].at, b"")  # none kept (too big): the last one, parsed
        if first is None:
            verdict = COLLECTING
        else:
            first_at, first_page = first
            if first_at == points[-1].at:
                before = previous
            else:
                before = self._reader.read(zlib.decompress(first_page).decode())
            verdict = compute_verdict(before, page, at - first_at, self.spec)
        verdict = Verdict(**{**verdict.__dict__, "updated": point.wall})
        return point, zlib.compress(text, 1), page, verdict

    def _held(self, finding: Finding) -> dict[str, Any]:
        """How long the finding has held, and whether that is still short of its alert's
        ``for`` (pending: Prometheus would not fire it yet)."""
        since = self._since.get(_finding_key(finding))
        if since is None or not self._points:
            return {"holding_seconds": None, "pending": True}
        holding = self._points[-1].at - since
        wait = seconds(self.spec.timing.for_alert(finding.alert))
        return {"holding_seconds": round(holding, 1), "pending": holding < wait}

    def series(self) -> dict[str, list[tuple[float, float | None]]]:
        """Each sparkline signal's points: (wall-clock time, value or None), oldest first.

        Spaced by the poller's clock (the windows' own), placed on the wall clock by the
        newest point."""
        points = list(self._points)
        if not points:
            return {name: [] for name in self.sparklines}
        anchor = points[-1].wall - points[-1].at
        return {
            name: [(p.at + anchor, p.values.get(name)) for p in points[1:]]  # [0]: no window
            for name in self.sparklines
        }

    def document(self) -> dict[str, Any]:
        """The verdict as JSON (``/verdict.json``); the page shows the same."""
        v, spec = self.verdict, self.spec
        slow = None if self.slow_requests is None else self.slow_requests.document()
        read = self._points[-1].read if self._points else {}
        return {
            "state": v.state,
            "backend_up": v.backend_up,
            "latest_poll_backend_up": self.poller.snapshot.backend_up
            if self.poller.last_poll_at is not None
            else None,
            "updated": v.updated,
            "window_seconds": v.window_seconds,
            "rate_window": spec.timing.window,
            "labels": v.labels,
            "router": self.sparklines == ROUTER_SERIES,  # no engine: no phase of its own
            "phase": v.phase,
            "phase_detail": v.phase_detail,
            "phase_signals": {k: number(x) for k, x in v.phase_signals.items()},
            "findings": [
                {
                    "alert": f.alert.name,
                    "labels": dict(f.labels),  # the exporter's, and a router's worker
                    "severity": f.severity,
                    "phase": f.alert.phase,
                    "layer": f.alert.layer,
                    "for": spec.timing.for_alert(f.alert),
                    **self._held(f),
                    "explained_by": f.explained_by,
                    "inhibited": f.inhibited,
                    "depth": f.depth,
                    "evidence": evidence(f, spec),
                    "runbook": spec.runbook_url(f.alert.name, ""),
                    # The slowest requests' spans, for or against where it says they waited.
                    "requests": spans_say(f.alert, slow),
                }
                for f in v.findings
            ],
            "keep_seconds": self.keep_seconds,
            "series_window_step_seconds": self.step,
            "series": {
                name: [[round(t, 3), number(value)] for t, value in points]
                for name, points in self.series().items()
            },
            # Each sparkline named by the signal its newest point read (a fallback: TGI's).
            "series_info": {
                name: {"label": SIGNALS[read.get(name, name)].label, "unit": SIGNALS[name].unit}
                for name in self.sparklines
            },
            "slow_requests": slow,
        }
