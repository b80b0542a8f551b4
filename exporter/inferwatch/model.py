"""The normalized, immutable data model a poll produces and every consumer reads.

A backend turns one server's exposition into a :class:`BackendSample`; the GPU source
produces :class:`GpuSample` values; the poller combines both with the derived signals into
a :class:`Snapshot`. Nothing here is mutated after construction, so the HTTP app can serve
a snapshot while the poller builds the next one.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType
from typing import Protocol

# Label pairs in a fixed order, e.g. (("model", "llama"), ("engine", "0")).
Labels = tuple[tuple[str, str], ...]

EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Exemplar:
    """A traced request observed in a histogram's bucket: its W3C trace id (32 hex digits),
    its value, and when it was observed (Unix seconds, this machine's clock)."""

    trace_id: str
    value: float
    at: float

    def text(self) -> str:
        """The exemplar as OpenMetrics writes it after a bucket's value."""
        return f' # {{trace_id="{self.trace_id}"}} {self.value!r} {self.at:.3f}'


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram with the backend's own bucket bounds.

    ``buckets`` holds ``(le, cumulative_count)`` pairs in increasing order, the bound kept
    as the backend wrote it (``"0.001"``) so it is re-exported unchanged; the last is
    ``"+Inf"``. A histogram a snapshot holds passes :meth:`defect`: the backends leave out
    a family whose page breaks it.
    """

    buckets: tuple[tuple[str, float], ...]
    sum: float
    count: float
    # Where its observer knows the requests (the canary's probes): per bucket, the latest.
    exemplars: tuple[Exemplar | None, ...] = ()

    def defect(self) -> str:
        """Why this is not a histogram Prometheus can take, or '' when it is one.

        What the exposition format requires of a histogram of non-negative observations
        (every contract histogram is one: seconds, tokens): bounds that increase and end
        with ``+Inf``; cumulative counts, finite and >= 0; a ``_count`` equal to the
        ``+Inf`` bucket; a finite ``_sum`` >= 0. A valid one (every poll's common case) is
        told by a few passes in C; only a defect is looked for bucket by bucket.
        """
        if not self.buckets:
            return "no buckets"
        problem = _bounds_defect(self.les)
        if problem:
            return problem
        counts = self.counts
        if (
            counts[0] >= 0
            and all(map(operator.le, counts, counts[1:]))  # False for a NaN
            and math.isfinite(counts[-1])
            and self.count == counts[-1]
            and math.isfinite(self.sum)
            and self.sum >= 0
        ):
            return ""
        previous = 0.0
        for le, cumulative in self.buckets:
            if not (math.isfinite(cumulative) and cumulative >= 0):
                return f"bucket le={le!r} count {cumulative} is not finite and >= 0"
            if cumulative < previous:
                return f"buckets are not cumulative (le={le!r} holds {cumulative} < {previous})"
            previous = cumulative
        if self.count != previous:
            return f"count {self.count} differs from the +Inf bucket's {previous}"
        return f"sum {self.sum} is not finite and >= 0"

    @functools.cached_property
    def les(self) -> tuple[str, ...]:
        """The bucket bounds as written (told once: a poll's checks and folds ask again)."""
        return tuple(map(_FIRST, self.buckets))

    @functools.cached_property
    def counts(self) -> tuple[float, ...]:
        """The cumulative counts, in the order of the bounds (told once)."""
        return tuple(map(_SECOND, self.buckets))

    def merged(self, other: Histogram) -> Histogram:
        """Sum of two histograms with the same bounds (e.g. two processes of one server)."""
        les = self.les
        if les != other.les:
            raise ValueError("histograms with different bucket bounds cannot be merged")
        return Histogram(
            tuple(zip(les, map(operator.add, self.counts, other.counts), strict=True)),
            self.sum + other.sum,
            self.count + other.count,
        )

    def scaled(self, factor: float, rename_le: bool = True) -> Histogram:
        """The same distribution in another unit (e.g. milliseconds to seconds)."""
        if factor == 1.0:
            return self
        buckets = tuple(
            (_format_bound(float(le) * factor) if rename_le else le, c) for le, c in self.buckets
        )
        return Histogram(buckets, self.sum * factor, self.count)


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


@functools.lru_cache(maxsize=1024)
def _bounds_defect(les: tuple[str, ...]) -> str:
    """Why these bounds cannot be a histogram's, or '' (a server's few layouts, memoized)."""
    bounds = [bucket_bound(le) for le in les]
    if bounds[-1] != math.inf:
        return "no +Inf bucket"
    if any(not b > a for a, b in pairwise(bounds)):
        return "bucket bounds do not increase"
    return ""


def bucket_bound(le: str) -> float:
    """A bucket's bound as a number (NaN for text that is not one)."""
    try:
        return float(le)
    except ValueError:
        return math.nan


def _format_bound(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return repr(round(value, 12))


SeriesValues = Mapping[Labels, float]
HistogramValues = Mapping[Labels, Histogram]


@dataclass(frozen=True)
class Dropped:
    """Part of a page left out of a sample, and why.

    ``family`` is the server's family (or sample) name, ``kind`` the kind of defect
    (``"malformed"``, ``"invalid value"``, ``"duplicate"``...; logs are rate limited per
    family and kind) and ``detail`` a one-line cause.
    """

    family: str
    kind: str
    detail: str


@dataclass(frozen=True)
class BackendSample:
    """One successful scrape of a backend, mapped onto the metric contract.

    ``values`` maps a contract key (``"requests_waiting"``) to its series and
    ``histograms`` holds the histograms; a key is absent when the backend does not provide
    that signal (absent, never zero). Every value is valid for its kind (counters finite
    and >= 0, ratios in [0, 1]), and no series appears twice. ``dropped`` lists what of the
    page was left out to make it so; ``oversized`` counts the series left out for a label
    set longer than the bound (``--backend-max-label-bytes``).
    """

    backend: str
    model: str
    version: str = ""
    values: Mapping[str, SeriesValues] = field(default_factory=lambda: EMPTY)
    histograms: Mapping[str, HistogramValues] = field(default_factory=lambda: EMPTY)
    dropped: Sequence[Dropped] = ()
    oversized: int = 0
    role: str = ""  # what the page says of its role (metrics.ROLES), "" where nothing

    def total(self, key: str) -> float | None:
        """Sum of a signal over all its series, or None when not provided."""
        series = self.values.get(key)
        if not series:
            return None
        return math.fsum(series.values())


@dataclass(frozen=True)
class GpuHealth:
    """A GPU's reliability at one poll (:mod:`inferwatch.collect.gpu_health`); None or
    absent from a map: not available on this GPU."""

    ecc_errors_total: Mapping[tuple[str, str], float] = field(default_factory=lambda: EMPTY)
    remapped_rows: Mapping[str, float] = field(default_factory=lambda: EMPTY)  # by kind
    row_remap_pending: float | None = None  # 1 or 0
    row_remap_failed: float | None = None
    retired_pages_pending: float | None = None
    pcie_replays_total: float | None = None
    xid_errors_total: Mapping[str, float] = field(default_factory=lambda: EMPTY)  # by XID


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one poll. ``None`` means NVML could not provide the value on this GPU."""

    index: int
    uuid: str
    name: str
    utilization_ratio: float | None = None
    busy_seconds_total: float = 0.0
    busy_ratio: float | None = None  # busy share of the last poll interval
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    memory_bandwidth_peak_bytes_per_second: float | None = None
    # The table's gauges (inferwatch.gpu_gauges) by name; one is absent where NVML could not
    # provide it.
    gauges: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    clock_throttled: Mapping[str, bool] = field(default_factory=lambda: EMPTY)
    # Communication: by direction ("tx": from the GPU, "rx": to it); a direction is absent
    # when NVML could not provide it, the whole map is empty without the link.
    pcie_bytes_per_second: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    pcie_peak_bytes_per_second: float | None = None  # per direction
    nvlink_bytes_total: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    nvlink_peak_bytes_per_second: float | None = None  # per direction, active links
    health: GpuHealth = field(default_factory=GpuHealth)

    @property
    def labels(self) -> Labels:
        return (("gpu", str(self.index)), ("uuid", self.uuid), ("name", self.name))


@dataclass(frozen=True)
class CollectorStatus:
    success: bool
    duration_seconds: float
    error: str = ""


@dataclass(frozen=True)
class Derived:
    """Signals the poller computes from backend and GPU samples together.

    Keyed by ``(("backend", ...), ("model", ...))`` labels.
    """

    queued_while_idle: Mapping[Labels, bool] = field(default_factory=lambda: EMPTY)
    queued_while_idle_seconds_total: Mapping[Labels, float] = field(default_factory=lambda: EMPTY)
    decode_floor_seconds: Mapping[Labels, float] = field(default_factory=lambda: EMPTY)
    # Window family (``time_to_first_token_window_seconds``) -> quantile series.
    latency_window: Mapping[str, Mapping[Labels, float]] = field(default_factory=lambda: EMPTY)


class Sink(Protocol):
    """Where a snapshot's families go: the page writer (serve/families.py), or another
    encoder (``bench/exposition.py`` feeds prometheus_client's families the same way)."""

    def scalars(self, key: str, series: Mapping[Labels, float], prefix: Labels = ()) -> None: ...

    def histograms(self, key: str, series: Mapping[Labels, Histogram], prefix: Labels) -> None: ...


class SourceSample(Protocol):
    """A registered source's state in a snapshot; ``problem``: what it could not read
    (empty when it read everything)."""

    @property
    def problem(self) -> str: ...

    def write(self, sink: Sink, backend: str) -> None:
        """Its series (``backend``: the backend's kind, for series that name it)."""
        ...


@dataclass(frozen=True)
class Snapshot:
    """Everything one poll saw; the HTTP app renders the latest one."""

    backend_kind: str
    backend_up: bool
    backend_scrape_seconds: float
    backend: BackendSample | None
    collectors: Mapping[str, CollectorStatus]
    gpus: tuple[GpuSample, ...] = ()
    derived: Derived = field(default_factory=Derived)
    baseline: Mapping[str, Mapping[Labels, float]] = field(default_factory=lambda: EMPTY)
    # The registered sources' states by collector name (collect/poller.py's Source).
    sources: Mapping[str, SourceSample] = field(default_factory=lambda: EMPTY)
    # Backend series left out since start, by reason (metrics.SERIES_DROPPED_REASONS).
    series_dropped: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    # The backend's origin (``scheme://host:port``, never its credentials): the server a
    # router names as its worker, on ``inferwatch_backend_info``'s ``server`` label.
    server: str = ""
    # Its role in a disaggregated deployment (metrics.ROLES; "" unknown): ``--role``, else
    # what the page says.
    role: str = ""
