"""Renders a :class:`Snapshot` as Prometheus text (format 0.0.4) or OpenMetrics 1.0.0.

Every render builds the page fresh from the immutable snapshot. Sample of a text page::

    # HELP inferwatch_requests_waiting Requests waiting to be scheduled (queue depth).
    # TYPE inferwatch_requests_waiting gauge
    inferwatch_requests_waiting{backend="vllm",model="tiny",engine="0"} 20.0

The OpenMetrics page carries the same samples, counter families named without ``_total``,
and leaves out of that page only what of a histogram it cannot carry; its latency buckets
carry exemplars where request spans are received (:mod:`inferwatch.serve.exemplars`).
Written here rather than by prometheus_client: label sets repeat from poll to poll, so their
escaped text is cached (``bench/exposition.py`` compares the two). :class:`Renderer` renders
each format at most once per poll and appends the exporter's own ``process_*``/``python_*``
series.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from itertools import pairwise

from inferwatch.logs import LogLimiter
from inferwatch.metrics import ALL, Kind
from inferwatch.model import (
    CollectorStatus,
    Histogram,
    Labels,
    Snapshot,
)
from inferwatch.serve.exemplars import Exemplars
from inferwatch.serve.families import write_snapshot
from inferwatch.serve.selfmetrics import SelfMetrics

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_MAX_CACHED = 20_000
# The most characters of label text cached (about as much again is held, in the label sets
# it is of): the label texts of a few pages of the default series budget.
_MAX_CACHED_CHARS = 4 << 20
_label_text: dict[Labels, str] = {}
_label_chars = 0  # of the texts cached
_om_bounds: dict[tuple[str, ...], tuple[tuple[str, ...], bool] | None] = {}


def _number(value: float) -> str:
    """A sample value as the text format writes it (Python's repr, but +Inf/-Inf/NaN)."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _headers(openmetrics: bool) -> dict[str, str]:
    """``# HELP``/``# TYPE`` lines of every family of the contract, by key."""
    out = {}
    for key, spec in ALL.items():
        if openmetrics:  # the family is named without _total; HELP escapes quotes too
            name, text = spec.name.removesuffix("_total"), _escape(spec.help)
        else:
            name, text = spec.name, spec.help.replace("\\", "\\\\").replace("\n", "\\n")
        out[key] = f"# HELP {name} {text}\n# TYPE {name} {spec.kind.value}\n"
    return out


_HEADERS = {False: _headers(False), True: _headers(True)}


def label_text(labels: Labels) -> str:
    """``(("a", "x"),)`` -> ``'a="x"'``, escaped, cached (label sets repeat every poll)."""
    global _label_chars
    text = _label_text.get(labels)
    if text is None:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        if len(_label_text) >= _MAX_CACHED or _label_chars + len(text) > _MAX_CACHED_CHARS:
            _label_text.clear()
            _label_chars = 0
        _label_text[labels] = text
        _label_chars += len(text)
    return text


def openmetrics_bounds(les: tuple[str, ...]) -> tuple[tuple[str, ...], bool] | None:
    """The ``le`` values OpenMetrics writes for these bucket bounds (as given, but an
    infinite bound is ``+Inf``) and whether one is negative; None when OpenMetrics cannot
    have them (not strictly increasing, or no ``+Inf`` last). Cached: bounds repeat."""
    try:
        return _om_bounds[les]
    except KeyError:
        pass
    try:
        bounds = [float(le) for le in les]
    except ValueError:  # the backends refuse such bounds before a snapshot holds them
        bounds = []
    shape = None
    if bounds and bounds[-1] == math.inf and all(a < b for a, b in pairwise(bounds)):
        written = tuple("+Inf" if b == math.inf else le for le, b in zip(les, bounds, strict=True))
        shape = (written, bounds[0] < 0)
    if len(_om_bounds) >= _MAX_CACHED:
        _om_bounds.clear()
    _om_bounds[les] = shape
    return shape


class _Page:
    def __init__(self, openmetrics: bool, exemplars: Exemplars | None = None) -> None:
        self.openmetrics = openmetrics
        self.exemplars = exemplars if openmetrics else None  # the text format has none
        self.headers = _HEADERS[openmetrics]
        self.parts: list[str] = []

    def scalars(self, key: str, series: Mapping[Labels, float], prefix: Labels = ()) -> None:
        if not series:
            return
        spec = ALL[key]
        name = spec.name
        if self.openmetrics and spec.kind is Kind.COUNTER:
            # OpenMetrics refuses a NaN or negative counter (the snapshot holds none).
            series = {k: v for k, v in series.items() if v >= 0}
            if not series:
                return
        append = self.parts.append
        append(self.headers[key])
        for labels, value in series.items():
            text = label_text(prefix + labels)
            append(f"{name}{{{text}}} {_number(value)}\n" if text else f"{name} {_number(value)}\n")

    def histograms(self, key: str, series: Mapping[Labels, Histogram], prefix: Labels) -> None:
        if self.openmetrics:
            self.openmetrics_histograms(key, series, prefix)
            return
        if not series:
            return
        name = ALL[key].name
        append = self.parts.append
        append(self.headers[key])
        for labels, hist in series.items():
            base = label_text(prefix + labels)
            sep = "," if base else ""
            for le, count in hist.buckets:
                append(f'{name}_bucket{{{base}{sep}le="{le}"}} {_number(count)}\n')
            append(f"{name}_count{{{base}}} {_number(hist.count)}\n")
            append(f"{name}_sum{{{base}}} {_number(hist.sum)}\n")

    def openmetrics_histograms(
        self, key: str, series: Mapping[Labels, Histogram], prefix: Labels
    ) -> None:
        """OpenMetrics is stricter than the text format: buckets end with +Inf, bounds
        increase, counts are whole and cumulative, _count (= the +Inf bucket) and a finite
        _sum >= 0 come together or not at all. A series the snapshot holds otherwise (a
        backend's page can: the text format allows it) leaves out what OpenMetrics cannot
        carry: its _count and _sum, or the whole series when its buckets do not fit."""
        name = ALL[key].name
        lines: list[str] = []
        append = lines.append
        # A span does not say which of several series its request is of: one series only.
        exemplars = self.exemplars if len(series) == 1 and ALL[key].exemplar else None
        for labels, hist in series.items():
            shape = openmetrics_bounds(tuple(le for le, _ in hist.buckets))
            if shape is None:
                continue
            les, negative = shape
            counts = [count for _, count in hist.buckets]
            if counts[0] < 0 or any(c % 1 for c in counts):  # negative, fractional, inf, NaN
                continue
            if any(b < a for a, b in pairwise(counts)):
                continue
            base = label_text(prefix + labels)
            sep = "," if base else ""
            marks = [""] * len(les)
            if len(hist.exemplars) == len(les):  # its own (the canary's probes)
                marks = [e.text() if e else "" for e in hist.exemplars]
            elif exemplars is not None:
                bounds = [float(le) for le in les]
                marks = [e.text() if e else "" for e in exemplars.of_buckets(key, bounds)]
            for le, count, mark in zip(les, counts, marks, strict=True):
                append(f'{name}_bucket{{{base}{sep}le="{le}"}} {_number(count)}{mark}\n')
            total = hist.sum
            if hist.count == counts[-1] and math.isfinite(total) and total >= 0 and not negative:
                append(f"{name}_count{{{base}}} {_number(hist.count)}\n")
                append(f"{name}_sum{{{base}}} {_number(total)}\n")
        if lines:
            self.parts.append(self.headers[key])
            self.parts.extend(lines)

    def bytes(self, extra: str = "") -> bytes:
        """The page, with ``extra`` (more families) at its end (before OpenMetrics' EOF)."""
        tail = "# EOF\n" if self.openmetrics else ""
        return "".join((*self.parts, extra, tail)).encode()


def _page(snap: Snapshot, openmetrics: bool, exemplars: Exemplars | None = None) -> _Page:
    page = _Page(openmetrics, exemplars)
    write_snapshot(snap, page)
    return page


def render(snap: Snapshot) -> bytes:
    """The text exposition page (0.0.4) of one snapshot."""
    return _page(snap, openmetrics=False).bytes()


def render_openmetrics(snap: Snapshot, exemplars: Exemplars | None = None) -> bytes:
    """The OpenMetrics 1.0.0 page of one snapshot, ``# EOF`` included; its latency buckets
    with ``exemplars``' requests, where given."""
    return _page(snap, openmetrics=True, exemplars=exemplars).bytes()


class Renderer:
    """Renders the current snapshot once per format, on the first request for it, and
    serves those bytes until the next poll. With ``exemplars`` (set where request spans are
    received), the OpenMetrics page's latency buckets carry the latest of them at render."""

    def __init__(
        self, current: Callable[[], Snapshot], self_metrics: SelfMetrics | None = None
    ) -> None:
        self._current = current
        self._self_metrics = SelfMetrics() if self_metrics is None else self_metrics
        self._pages: dict[bool, tuple[Snapshot | None, bytes]] = {
            False: (None, b""),
            True: (None, b""),
        }
        self._lock = threading.Lock()  # render() runs in worker threads: once per snapshot
        self._bug_log = LogLimiter()
        self.exemplars: Exemplars | None = None

    def cached(self, openmetrics: bool = False) -> bytes | None:
        """The page of the current snapshot in that format if it is rendered already."""
        rendered_for, body = self._pages[openmetrics]
        return body if self._current() is rendered_for else None

    def render(self, openmetrics: bool = False) -> bytes:
        """The current snapshot's page in that format (rendered once per snapshot)."""
        return self.page_of(self._current(), openmetrics)

    def page_of(self, snap: Snapshot, openmetrics: bool = False) -> bytes:
        """``snap``'s page: the very bytes ``/metrics`` serves while it is the current
        snapshot (the verdict records it, not a render of its own)."""
        with self._lock:
            rendered_for, body = self._pages[openmetrics]
            if snap is not rendered_for:
                body = self._render(snap, openmetrics)
                if snap is self._current():
                    self._pages[openmetrics] = (snap, body)
            return body

    def _render(self, snap: Snapshot, openmetrics: bool) -> bytes:
        extra = self._self_metrics.section(openmetrics)
        try:
            return _page(snap, openmetrics, self.exemplars).bytes(extra)
        except Exception as exc:
            # A bug, not the backend's doing (its data is valid for its kind by the time it
            # is in a snapshot): the scrape still gets a valid page, the backend marked down.
            if self._bug_log.allow("render") is not None:
                log.exception("rendering /metrics failed; serving it with the backend down")
            failed = CollectorStatus(False, 0.0, f"{type(exc).__name__}: {exc}")
            down = Snapshot(
                backend_kind=snap.backend_kind,
                backend_up=False,
                backend_scrape_seconds=snap.backend_scrape_seconds,
                backend=None,
                collectors={**snap.collectors, "exposition": failed},
            )
            return _page(down, openmetrics).bytes(extra)
