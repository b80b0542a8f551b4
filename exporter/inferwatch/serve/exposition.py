"""Renders a :class:`Snapshot` as Prometheus text exposition (format 0.0.4).

Every render builds the page fresh from the immutable snapshot (no instrumented objects
updated in place). Sample of a page::

    # HELP inferwatch_requests_waiting Requests waiting to be scheduled (queue depth).
    # TYPE inferwatch_requests_waiting gauge
    inferwatch_requests_waiting{backend="vllm",model="tiny",engine="0"} 20.0
    # TYPE inferwatch_engine_step_tokens histogram
    inferwatch_engine_step_tokens_bucket{backend="vllm",model="tiny",engine="0",le="16.0"} 41.0

The page is written here rather than through prometheus_client's ``generate_latest``:
that function validates and escapes every label of every sample on each call and took
~2.8 ms for a vLLM page (``bench/exporter.py``), more than the whole poll. Label sets
repeat from poll to poll, so their escaped text is cached and a render costs a fraction of
that. The tests check every page with prometheus_client's parser and ``promtool check
metrics``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping

from inferwatch import __version__
from inferwatch.metrics import ALL
from inferwatch.model import GpuSample, Histogram, Labels, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# GpuSample fields exposed one-to-one as gauges (the busy counter and throttle map aside).
_GPU_GAUGES = (
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "memory_bandwidth_peak_bytes_per_second",
    "sm_clock_hertz",
    "power_watts",
    "temperature_celsius",
    "sm_active_ratio",
    "tensor_active_ratio",
    "dram_active_ratio",
)

_MAX_CACHED_LABEL_SETS = 20_000
_label_text: dict[Labels, str] = {}


def _number(value: float) -> str:
    """A sample value as the text format writes it (Python's repr, but +Inf/-Inf/NaN)."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_text(labels: Labels) -> str:
    """``(("a", "x"),)`` -> ``'a="x"'``, escaped, cached (label sets repeat every poll)."""
    text = _label_text.get(labels)
    if text is None:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        if len(_label_text) >= _MAX_CACHED_LABEL_SETS:
            _label_text.clear()
        _label_text[labels] = text
    return text


class _Page:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def header(self, key: str) -> str:
        spec = ALL[key]
        self.parts.append(f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} {spec.kind.value}\n")
        return spec.name

    def scalars(self, key: str, series: Mapping[Labels, float], prefix: Labels = ()) -> None:
        if not series:
            return
        name = self.header(key)
        append = self.parts.append
        for labels, value in series.items():
            append(f"{name}{{{label_text(prefix + labels)}}} {_number(value)}\n")

    def histograms(self, key: str, series: Mapping[Labels, Histogram], prefix: Labels) -> None:
        if not series:
            return
        name = self.header(key)
        append = self.parts.append
        for labels, hist in series.items():
            base = label_text(prefix + labels)
            sep = "," if base else ""
            for le, count in hist.buckets:
                append(f'{name}_bucket{{{base}{sep}le="{le}"}} {_number(count)}\n')
            if not math.isnan(hist.count):
                append(f"{name}_count{{{base}}} {_number(hist.count)}\n")
            if not math.isnan(hist.sum):
                append(f"{name}_sum{{{base}}} {_number(hist.sum)}\n")

    def gpus(self, gpus: tuple[GpuSample, ...]) -> None:
        for field in _GPU_GAUGES:
            values = {g.labels: getattr(g, field) for g in gpus}
            self.scalars(f"gpu_{field}", {k: v for k, v in values.items() if v is not None})
        self.scalars("gpu_busy_seconds", {g.labels: g.busy_seconds_total for g in gpus})
        throttled = {
            (*g.labels, ("reason", reason)): float(on)
            for g in gpus
            for reason, on in g.clock_throttled.items()
        }
        self.scalars("gpu_clock_throttled", throttled)

    def bytes(self) -> bytes:
        return "".join(self.parts).encode()


def render(snap: Snapshot) -> bytes:
    """The exposition page of one snapshot."""
    page = _Page()
    kind = (("backend", snap.backend_kind),)
    page.scalars("build_info", {(("version", __version__),): 1.0})
    page.scalars("backend_up", {kind: float(snap.backend_up)})
    page.scalars("backend_scrape_duration_seconds", {kind: snap.backend_scrape_seconds})
    status = snap.collectors
    page.scalars(
        "collector_success", {(("collector", c),): float(s.success) for c, s in status.items()}
    )
    page.scalars(
        "collector_duration_seconds",
        {(("collector", c),): s.duration_seconds for c, s in status.items()},
    )
    sample = snap.backend
    if sample is not None:
        prefix = (("backend", sample.backend),)
        info = (*prefix, ("version", sample.version), ("model", sample.model))
        page.scalars("backend_info", {info: 1.0})
        for key, series in sample.values.items():
            page.scalars(key, series, prefix)
        for key, hseries in sample.histograms.items():
            page.histograms(key, hseries, prefix)
    page.gpus(snap.gpus)
    d = snap.derived
    page.scalars("queued_while_idle", {k: float(v) for k, v in d.queued_while_idle.items()})
    page.scalars("queued_while_idle_seconds", d.queued_while_idle_seconds_total)
    page.scalars("decode_floor_seconds", d.decode_floor_seconds)
    for key, series in snap.baseline.items():
        page.scalars(key, series)
    return page.bytes()


class Renderer:
    """Renders the current snapshot once and serves the bytes until the next poll."""

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self._current = current
        self._rendered_for: Snapshot | None = None
        self._body = b""
        self._lock = threading.Lock()  # render() runs in worker threads: once per snapshot

    def cached(self) -> bytes | None:
        """The page of the current snapshot if it is rendered already."""
        return self._body if self._current() is self._rendered_for else None

    def render(self) -> bytes:
        with self._lock:
            snap = self._current()
            if snap is not self._rendered_for:
                self._body = render(snap)
                self._rendered_for = snap
            return self._body
