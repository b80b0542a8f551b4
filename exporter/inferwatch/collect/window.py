"""Each pod's TTFT and inter-token latency quantiles over the rate window, computed here.

The rules copy these summaries rather than run ``histogram_quantile`` over every replica's
buckets, the costliest part of the recording rules at fleet size (``bench/fleet.py``)::

    inferwatch_time_to_first_token_window_seconds{backend="vllm",model="m",quantile="0.95"} 0.41
    inferwatch_inter_token_latency_window_seconds{backend="vllm",model="m",quantile="0.5"} 0.021

Each value is what ``histogram_quantile(q, sum without (engine) (rate(h_bucket[window])))``
gives over the polls folded in, counter resets counted as ``rate`` counts them; NaN when
nothing was observed. Absent until the exporter has polled for :data:`MIN_SPAN` seconds. The
window's start moves in steps of 1/:data:`STEPS`, histograms are folded at most once per
:data:`FOLD_SECONDS`, and the quantiles are computed when first read, whatever the poll
interval.
"""

from __future__ import annotations

import logging
import math
import operator
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from inferwatch.logs import LogLimiter
from inferwatch.method.quantile import histogram_quantile, went_back
from inferwatch.metrics import WINDOW_QUANTILES
from inferwatch.model import BackendSample, Histogram, Labels

log = logging.getLogger("inferwatch.poller")

# The histograms summarized: the contract key of each and of its window family.
SUMMARIZED = {
    "time_to_first_token_seconds": "time_to_first_token_window_seconds",
    "inter_token_latency_seconds": "inter_token_latency_window_seconds",
}
STEPS = 100
MIN_SPAN = 60.0
FOLD_SECONDS = 1.0

# One histogram series: (contract key, backend, the series' labels).
Key = tuple[str, str, Labels]


class LatencyWindow:
    """Reset-corrected running totals of the summarized histograms and their recent past."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last: dict[Key, Histogram] = {}  # as the page last showed it
        self._totals: dict[Key, Histogram] = {}  # what it observed since first seen
        self._past: deque[tuple[float, dict[Key, Histogram]]] = deque()
        self._since: float | None = None  # the first poll
        self._fold_every = min(FOLD_SECONDS, seconds / STEPS)
        self._folded_at = -math.inf
        self._version = 0  # bumped whenever a total changes
        self._quantiles: tuple[tuple[int, float], Quantiles] | None = None

    def update(
        self, now: float, sample: BackendSample | None
    ) -> Mapping[str, Mapping[Labels, float]]:
        """Fold in one poll; each window family's quantiles by backend, model (the series'
        labels but ``engine``) and quantile. While the backend is down the totals stay, and
        the window spans the gap."""
        if self._since is None:
            self._since = now
        if sample is not None and now - self._folded_at >= self._fold_every:
            self._fold(sample)
            self._folded_at = now
        if not self._past or now - self._past[-1][0] >= self.seconds / STEPS:
            self._past.append((now, dict(self._totals)))
        while now - self._past[0][0] > self.seconds:
            self._past.popleft()
        start, then = self._past[0]
        if now <= start or now - self._since < min(MIN_SPAN, self.seconds):
            return {}
        if self._quantiles is not None and self._quantiles[0] == (self._version, start):
            return self._quantiles[1]
        out = Quantiles(dict(self._totals), dict(then))
        self._quantiles = ((self._version, start), out)
        return out

    def _fold(self, sample: BackendSample) -> None:
        seen = set()
        for name in SUMMARIZED:
            for labels, hist in (sample.histograms.get(name) or {}).items():
                key = (name, sample.backend, labels)
                seen.add(key)
                last, total = self._last.get(key), self._totals.get(key)
                if hist is last and total is not None:
                    continue  # reused unchanged by the mapping: nothing observed
                self._version += 1
                if last is None or total is None:  # first seen: from its first poll
                    self._totals[key] = Histogram(
                        tuple((le, 0.0) for le, _ in hist.buckets), 0.0, 0.0
                    )
                else:
                    grown = _grown(total, last, hist)
                    if grown is None:  # other bounds: a new series, from zero
                        grown = hist
                        self._forget(key)
                    self._totals[key] = grown
                self._last[key] = hist
        # A series the page no longer shows is gone (a renamed model leaves nothing behind).
        for key in [k for k in self._totals if k not in seen]:
            del self._totals[key], self._last[key]
            self._forget(key)
            self._version += 1

    def _forget(self, key: Key) -> None:
        for _, past in self._past:
            past.pop(key, None)


def _grown(total: Histogram, last: Histogram, hist: Histogram) -> Histogram | None:
    """``total`` plus what ``hist`` observed since ``last``: all of ``hist`` where it went
    back (a restart, counted from zero as Prometheus' ``rate`` counts a counter reset, as
    :func:`~inferwatch.method.quantile.increase` does); None where the bounds changed."""
    les = hist.les
    if les != last.les:
        return None
    counts = hist.counts
    if went_back(last, hist):
        grown, observed, summed = counts, hist.count, hist.sum
    else:
        grown = tuple(map(operator.sub, counts, last.counts))
        observed, summed = hist.count - last.count, hist.sum - last.sum
    return Histogram(
        tuple(zip(les, map(operator.add, total.counts, grown), strict=True)),
        total.sum + summed,
        total.count + observed,
    )


class Quantiles(Mapping[str, Mapping[Labels, float]]):
    """Each window family's quantiles over the growth of ``totals`` since ``then`` (a
    window's two ends), computed when first read: a poll hands them over, a scrape or the
    verdict reads them. A bug in computing them leaves them out, nothing else."""

    _bugs = LogLimiter()

    def __init__(self, totals: dict[Key, Histogram], then: dict[Key, Histogram]) -> None:
        self._totals = totals
        self._then = then
        self._lock = threading.Lock()  # read by a scrape's thread and the verdict's
        self._out: dict[str, Mapping[Labels, float]] | None = None

    def __getitem__(self, family: str) -> Mapping[Labels, float]:
        return self._computed()[family]

    def __iter__(self) -> Iterator[str]:
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())

    def _computed(self) -> dict[str, Mapping[Labels, float]]:
        with self._lock:
            if self._out is None:
                try:
                    self._out = _window_quantiles(self._totals, self._then)
                except Exception:
                    if self._bugs.allow("latency window") is not None:
                        log.exception(
                            "computing the latency window failed; its series are left out"
                        )
                    self._out = {}
            return self._out


def _window_quantiles(
    totals: dict[Key, Histogram], then: dict[Key, Histogram]
) -> dict[str, Mapping[Labels, float]]:
    """Each window family's quantiles over the growth of ``totals`` since ``then``."""
    pooled: dict[tuple[str, Labels], list[tuple[str, float]]] = {}
    for (name, backend, labels), total in totals.items():
        before = then.get((name, backend, labels))
        unit = (("backend", backend), *(kv for kv in labels if kv[0] != "engine"))
        pooled.setdefault((SUMMARIZED[name], unit), []).extend(
            (le, count - (before.buckets[i][1] if before else 0.0))
            for i, (le, count) in enumerate(total.buckets)
        )
    out: dict[str, dict[Labels, float]] = {}
    for (family, unit), buckets in pooled.items():
        series = out.setdefault(family, {})
        for q in WINDOW_QUANTILES:
            series[(*unit, ("quantile", q))] = histogram_quantile(float(q), buckets)
    return {family: MappingProxyType(series) for family, series in out.items()}
