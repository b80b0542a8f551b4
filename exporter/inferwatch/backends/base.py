"""The backend seam: a table that maps one server's families onto the metric contract.

A backend module declares a :class:`Backend` with one :class:`Feed` per contract key it can
provide. A feed lists :class:`Source` families in order of preference (current name first,
then the names older releases used); the first one present on the page wins, so a server
that exposes both a new and a deprecated name is never counted twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from inferwatch.metrics import BACKEND, Kind
from inferwatch.model import BackendSample, Histogram, HistogramValues, Labels, SeriesValues
from inferwatch.textparse import ExpositionError, PageScanner, parse_labels

log = logging.getLogger(__name__)

# The contract keys the poll loop needs on every poll (queued-while-idle and the page's
# model); everything else is mapped when a scrape asks for it.
SIGNAL_KEYS = frozenset(
    {"requests_waiting", "requests_running", "engine_steps", "scheduler_idle_seconds"}
)

# Contract labels in the order they are exposed; a backend maps its own label names onto them.
LABEL_ORDER = ("model", "engine", "reason")


@dataclass(frozen=True)
class Source:
    """One backend family feeding a contract key.

    ``name`` is the sample name for gauges and counters (``vllm:prompt_tokens_total``) and
    the family name for histograms (``vllm:time_to_first_token_seconds``). ``where`` keeps
    only samples with those label values; ``scale`` converts units (0.001 for ms -> s).
    """

    name: str
    where: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    scale: float = 1.0

    def sample_names(self, kind: Kind) -> tuple[str, ...]:
        if kind is Kind.HISTOGRAM:
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


@dataclass(frozen=True)
class Feed:
    """A contract key (see ``inferwatch.metrics.BACKEND``) and where a backend finds it."""

    key: str
    sources: tuple[Source, ...]

    def __post_init__(self) -> None:
        if self.key not in BACKEND:
            raise ValueError(f"{self.key!r} is not a backend series of the metric contract")

    @property
    def kind(self) -> Kind:
        return BACKEND[self.key].kind


def feed(key: str, *names: str | Source) -> Feed:
    """``feed("requests_waiting", "vllm:num_requests_waiting")``: names in preference order."""
    return Feed(key, tuple(n if isinstance(n, Source) else Source(n) for n in names))


@dataclass(frozen=True)
class Backend:
    """How to read one kind of inference server.

    ``labels`` maps the server's label names onto contract labels (``model_name`` ->
    ``model``); every other label is dropped, and series that then coincide are merged
    (gauges: max, counters and histograms: sum). ``signature`` holds metric-name prefixes
    that identify the server for ``--backend auto``. A server whose series carry no model
    label names its model in a JSON document instead: ``model_path`` and ``model_field``
    (a dotted path such as ``data.0.id``), read once per connection like the version.
    """

    name: str
    feeds: tuple[Feed, ...]
    signature: tuple[str, ...]
    labels: Mapping[str, str]
    metrics_path: str = "/metrics"
    version_path: str | None = None
    version_field: str = "version"
    model_path: str | None = None
    model_field: str = "model"
    # Rewrites the raw body before parsing (a server that escapes its own output).
    preprocess: Callable[[str], str] | None = None
    wanted: frozenset[str] = field(init=False)
    _relabel: _Relabeler = field(init=False, repr=False, compare=False)
    _scanner: PageScanner = field(init=False, repr=False, compare=False)
    _signal_names: frozenset[str] = field(init=False, repr=False, compare=False)
    _histogram_memo: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = {n for f in self.feeds for s in f.sources for n in s.sample_names(f.kind)}
        signal_names = {
            n
            for f in self.feeds
            if f.key in SIGNAL_KEYS
            for s in f.sources
            for n in s.sample_names(f.kind)
        }
        object.__setattr__(self, "wanted", frozenset(names))
        object.__setattr__(self, "_relabel", _Relabeler(self.labels))
        object.__setattr__(self, "_scanner", PageScanner(names))
        object.__setattr__(self, "_signal_names", frozenset(signal_names))
        object.__setattr__(self, "_histogram_memo", {})

    def recognises(self, text: str) -> bool:
        """Whether the page holds this server's metric names."""
        return any(text.startswith(p) or f"\n{p}" in text for p in self.signature)

    def normalize(self, text: str, model_hint: str = "") -> BackendSample:
        """Map one page onto the contract; raises ExpositionError for a page to reject.

        Only the signals the poll loop needs (:data:`SIGNAL_KEYS`) are read now; the rest
        of the page is mapped when the sample's ``values`` or ``histograms`` are first used.
        """
        if self.preprocess is not None:
            text = self.preprocess(text)
        if not self.recognises(text):
            raise ExpositionError(f"no {self.name} metrics on the page ({self.hint_no_metrics()})")
        signal_samples = self._scanner.scan(text, self._signal_names)
        signals = self._scalars_of(signal_samples, [f for f in self.feeds if f.key in SIGNAL_KEYS])
        model = _first_model(signals) or model_hint
        if not model:  # a page without the signals: the model must come from the rest
            values, histograms = self._map(text, "")
            model = _first_model(values) or _first_model(histograms) or "unknown"
        return BackendSample(
            backend=self.name,
            model=model,
            signals=MappingProxyType({k: _with_model(v, model) for k, v in signals.items()}),
            build=lambda: self._map(text, model),
        )

    def _map(self, text: str, model: str) -> tuple[Mapping, Mapping]:
        """(values, histograms) of the whole page; series lacking a model label get ``model``."""
        try:
            samples = self._scanner.scan(text)
        except ExpositionError as exc:
            log.warning(
                "%s page has a malformed sample (%s); only its signals are kept", self.name, exc
            )
            samples = self._scanner.scan(text, self._signal_names)
        values = self._scalars_of(samples, self.feeds)
        histograms = {}
        for f in self.feeds:
            if f.kind is not Kind.HISTOGRAM:
                continue
            for source in f.sources:
                if source.name + "_bucket" in samples:
                    series = self._histograms(samples, source)
                    if series:
                        histograms[f.key] = series
                    break
        if model:
            values = {k: _with_model(v, model) for k, v in values.items()}
            histograms = {k: _with_model(v, model) for k, v in histograms.items()}
        return MappingProxyType(values), MappingProxyType(histograms)

    def _scalars_of(
        self, samples: dict[str, list[tuple[str, float]]], feeds: Iterable[Feed]
    ) -> dict[str, SeriesValues]:
        values: dict[str, SeriesValues] = {}
        for f in feeds:
            if f.kind is Kind.HISTOGRAM:
                continue
            for source in f.sources:
                if source.name in samples:
                    series = _scalars(samples[source.name], source, self._relabel, f.kind)
                    if series:  # a family whose `where` keeps nothing leaves the key absent
                        values[f.key] = series
                    break
        return values

    def _histograms(
        self, samples: dict[str, list[tuple[str, float]]], source: Source
    ) -> HistogramValues:
        """Histograms of one source; reused as is while its lines are unchanged.

        A family that cannot be assembled (a bucket bound that is not a number) is left out
        with a warning; the rest of the page is kept.
        """
        lines = tuple(samples.get(source.name + s) for s in ("_bucket", "_sum", "_count"))
        memo = self._histogram_memo.get(source.name)
        if memo is not None and all(a is b for a, b in zip(memo[0], lines, strict=True)):
            return memo[1]
        try:
            series = _histograms(samples, source, self._relabel)
        except ExpositionError as exc:
            log.warning("%s: %s; histogram left out", source.name, exc)
            series = MappingProxyType({})
        self._histogram_memo[source.name] = (lines, series)
        return series

    def hint_no_metrics(self) -> str:
        return f"expected names starting with {' or '.join(self.signature)}"


class _Relabeler:
    """Maps a sample's label text onto contract labels.

    Label texts repeat verbatim from poll to poll, so results are cached for the backend's
    lifetime (bounded: cleared when a churning server makes it large).
    """

    _MAX_ENTRIES = 50_000

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self._mapping = mapping
        self._series: dict[str, tuple[Labels, Labels]] = {}
        self._buckets: dict[str, tuple[Labels, Labels, str, float]] = {}

    def series(self, text: str) -> tuple[Labels, Labels]:
        """Label text -> (the server's own labels, sorted; contract labels)."""
        out = self._series.get(text)
        if out is None:
            own = tuple(sorted(parse_labels(text)))
            renamed = {self._mapping[k]: v for k, v in own if k in self._mapping}
            out = (own, tuple((k, renamed[k]) for k in LABEL_ORDER if k in renamed))
            if len(self._series) >= self._MAX_ENTRIES:
                self._series.clear()
            self._series[text] = out
        return out

    def bucket(self, text: str) -> tuple[Labels, Labels, str, float]:
        """A bucket line's label text -> (contract labels, own labels without le, le, bound)."""
        out = self._buckets.get(text)
        if out is None:
            own, _ = self.series(text)
            le = next((v for k, v in own if k == "le"), "+Inf")
            try:
                bound = float(le)
            except ValueError:
                raise ExpositionError(f"bucket bound le={le[:20]!r} is not a number") from None
            without_le = tuple((k, v) for k, v in own if k != "le")
            renamed = {self._mapping[k]: v for k, v in without_le if k in self._mapping}
            key = tuple((k, renamed[k]) for k in LABEL_ORDER if k in renamed)
            out = (key, without_le, le, bound)
            if len(self._buckets) >= self._MAX_ENTRIES:
                self._buckets.clear()
            self._buckets[text] = out
        return out


def _first_model(values: Mapping[str, Mapping[Labels, object]]) -> str:
    """The model label of the first series that has one."""
    for series in values.values():
        for labels in series:
            if labels and labels[0][0] == "model":
                return labels[0][1]
    return ""


def _matches(labels: Labels, where: Mapping[str, str]) -> bool:
    present = dict(labels)
    return all(present.get(k) == v for k, v in where.items())


def _scalars(
    samples: list[tuple[str, float]], source: Source, relabel: _Relabeler, kind: Kind
) -> SeriesValues:
    out: dict[Labels, float] = {}
    for text, value in samples:
        own, key = relabel.series(text)
        if source.where and not _matches(own, source.where):
            continue
        value *= source.scale
        if key in out:
            value = max(out[key], value) if kind is Kind.GAUGE else out[key] + value
        out[key] = value
    return MappingProxyType(out)


def _histograms(
    samples: dict[str, list[tuple[str, float]]], source: Source, relabel: _Relabeler
) -> HistogramValues:
    buckets = samples.get(source.name + "_bucket")
    if not buckets:
        return MappingProxyType({})
    # Group bucket lines by the series' labels without "le"; merge series that coincide
    # after relabeling (the same series from several processes).
    per_series: dict[Labels, dict[Labels, list[tuple[float, str, float]]]] = {}
    for text, value in buckets:
        key, own, le, bound = relabel.bucket(text)
        if source.where and not _matches(own, source.where):
            continue
        per_series.setdefault(key, {}).setdefault(own, []).append((bound, le, value))
    sums = _by_own_labels(samples.get(source.name + "_sum", ()), relabel)
    counts = _by_own_labels(samples.get(source.name + "_count", ()), relabel)
    out: dict[Labels, Histogram] = {}
    for key, own_series in per_series.items():
        merged: Histogram | None = None
        for own, bucket_list in own_series.items():
            hist = _histogram(bucket_list, sums.get(own), counts.get(own))
            merged = hist if merged is None else merged.merged(hist)
        assert merged is not None
        out[key] = merged.scaled(source.scale)
    return MappingProxyType(out)


def _by_own_labels(samples, relabel: _Relabeler) -> dict[Labels, float]:
    return {relabel.series(text)[0]: value for text, value in samples}


def _histogram(
    buckets: list[tuple[float, str, float]], total: float | None, count: float | None
) -> Histogram:
    """Buckets re-exported as the backend wrote them; an unknown sum or count is NaN."""
    buckets.sort()  # by bound; a no-op pass when the page lists them in order, as usual
    return Histogram(
        tuple((le, count) for _, le, count in buckets),
        math.nan if total is None else total,
        math.nan if count is None else count,
    )


def _with_model(series: Mapping[Labels, object], model: str) -> Mapping:
    """Series without a model label (process CPU, unlabelled servers) get the page's model."""
    if all(labels and labels[0][0] == "model" for labels in series):
        return series
    return MappingProxyType(
        {
            (labels if labels and labels[0][0] == "model" else (("model", model), *labels)): v
            for labels, v in series.items()
        }
    )
