"""The backend seam: a table that maps one server's families onto the metric contract.

A backend module declares a :class:`Backend` with one :class:`Feed` per contract key it can
provide. A feed lists :class:`Source` families in order of preference (current name first,
then the names older releases used); the first one present on the page wins, so a server
that exposes both a new and a deprecated name is never counted twice.

Most sources read a sample's value. Two kinds derive it: :func:`info` reads numbers from
the label values of an info series (``vllm:cache_config_info{num_gpu_blocks="32",...} 1``),
and ``Source(..., times=other)`` multiplies each series by the other source's series with
the same contract labels. A value they cannot derive (a label missing, ``"None"``, not a
number) leaves the series absent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from inferwatch.collect.textparse import (
    BOM,
    ExpositionError,
    PageScanner,
    Samples,
    Scan,
    parse_labels,
)
from inferwatch.metrics import BACKEND, Kind
from inferwatch.model import (
    BackendSample,
    Dropped,
    Histogram,
    HistogramValues,
    Labels,
    SeriesValues,
)

# The contract keys the poll loop derives its signals from (queued-while-idle) and reads the
# page's model from: a page where one of these is malformed is rejected, not trimmed.
SIGNAL_KEYS = frozenset(
    {"requests_waiting", "requests_running", "engine_steps", "scheduler_idle_seconds"}
)

# Contract labels in the order they are exposed; a backend maps its own label names onto them.
LABEL_ORDER = ("model", "engine", "reason", "status")

# The contract's ``status`` is an HTTP status class: a server's "2xx" is kept and its code
# "200" becomes "2xx"; any other value makes the family malformed (left out).
_STATUS = re.compile(r"([1-5])(?:xx|[0-9][0-9])")

# A ``where`` test: the label's value equals the string, or the callable accepts it.
LabelTest = str | Callable[[str], bool]


@dataclass(frozen=True)
class Source:
    """One backend family feeding a contract key.

    ``name`` is the sample name for gauges and counters (``vllm:prompt_tokens_total``) and
    the family name for histograms (``vllm:time_to_first_token_seconds``). ``where`` keeps
    only samples whose labels pass its tests (a value, or a callable on the value; a missing
    label fails); ``scale`` converts units (0.001 for ms -> s).

    Gauges and counters may derive their value instead of reading it: ``from_labels`` (see
    :func:`info`) takes it from the sample's label values, and ``times`` multiplies each
    series by the series of another source with the same contract labels.
    """

    name: str
    where: Mapping[str, LabelTest] = field(default_factory=lambda: MappingProxyType({}))
    scale: float = 1.0
    from_labels: tuple[tuple[str, ...], ...] = ()
    times: Source | None = None

    def sample_names(self, kind: Kind) -> tuple[str, ...]:
        if kind is Kind.HISTOGRAM:
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.times is not None:
            return (self.name, *self.times.sample_names(kind))
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


def info(name: str, *alternatives: str | tuple[str, ...]) -> Source:
    """An info series (value 1) whose labels hold the number: ``info("vllm:cache_config_info",
    "kv_cache_size_tokens", ("num_gpu_blocks", "block_size"))`` reads the first label, else
    the product of the other two. Per sample, the first alternative whose labels are all
    present and numbers (finite, >= 0) wins; a label reading ``"None"`` counts as missing."""
    return Source(
        name, from_labels=tuple((a,) if isinstance(a, str) else tuple(a) for a in alternatives)
    )


def inference_api(*paths: str) -> Callable[[str], bool]:
    """A ``where`` test for an HTTP handler label: the OpenAI-compatible API (paths under
    ``/v1/``) other than ``/v1/models``, plus the server's own inference ``paths``.

    It leaves out what monitoring and load balancers request (``/metrics``, ``/health``,
    ``/ping``, ``/version``, ``/load``, model and server info...): those requests say nothing
    about the service's answers to its clients, and the exporter makes some of them itself.
    ``/v1/models`` is left out for the same reason (clients, probes and routers poll it).
    """
    native = frozenset(paths)

    def test(handler: str) -> bool:
        if handler == "/v1/models" or handler.startswith("/v1/models/"):
            return False
        return handler in native or handler.startswith("/v1/")

    return test


@dataclass(frozen=True)
class Profiler:
    """A server's own profiler endpoints (POST, no body needed), for evidence capture.

    ``enable`` says how the server is started with its profiler on (the endpoints exist
    only then); ``prefix_field`` names a start-body field that prefixes the trace files,
    ``steps_field`` one that bounds the engine steps profiled.
    """

    enable: str
    start_path: str = "/start_profile"
    stop_path: str = "/stop_profile"
    prefix_field: str | None = None
    steps_field: str | None = None


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
    # Its own profiler's endpoints, where it has them (evidence capture).
    profiler: Profiler | None = None

    @property
    def wanted(self) -> frozenset[str]:
        """Every sample name the feeds read."""
        return frozenset(n for f in self.feeds for s in f.sources for n in s.sample_names(f.kind))

    def recognises(self, text: str) -> bool:
        """Whether the page holds this server's metric names."""
        return any(text.startswith(p) or f"\n{p}" in text for p in self.signature)

    def normalize(
        self, text: str, model_hint: str = "", max_series: float = math.inf
    ) -> BackendSample:
        """Map one page with a fresh :class:`Mapper` (for one-off callers; a poller keeps
        its own mapper, whose caches make the next page of the same server cheap)."""
        return Mapper(self).normalize(text, model_hint, max_series)

    def hint_no_metrics(self) -> str:
        return f"expected names starting with {' or '.join(self.signature)}"


class Mapper:
    """Maps one server's pages onto the contract, for one owner (a poller, a sweep).

    It holds what makes the next page of the same server cheap: the scanner's per-block
    cache, the relabeler's memo and histograms reused while their lines are unchanged. Not
    shared between owners and not for concurrent use: each poll maps one page at a time.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._relabel = _Relabeler(backend.labels)
        self._scanner = PageScanner(backend.wanted)
        self._histogram_memo: dict[str, tuple] = {}

    def normalize(
        self, text: str, model_hint: str = "", max_series: float = math.inf
    ) -> BackendSample:
        """Map one page onto the contract; raises ExpositionError for a page to reject.

        A leading byte-order mark is skipped. A page is rejected when it is cut short, is not this server's, holds more than
        ``max_series`` samples of the families mapped here, or when a family the poll loop
        needs (:data:`SIGNAL_KEYS`) is malformed. Any other malformed family is left out, and
        so are series with a value their kind cannot take (a negative or NaN counter, a
        ratio outside [0, 1]) and repeats of a series (the first is kept, as Prometheus
        does); the sample's ``dropped`` says what and why.
        """
        text = text.removeprefix(BOM)
        if self.backend.preprocess is not None:
            text = self.backend.preprocess(text)
        if not self.backend.recognises(text):
            raise ExpositionError(
                f"no {self.backend.name} metrics on the page ({self.backend.hint_no_metrics()})",
                "not this server",
            )
        found = self._scanner.scan(text, max_series)
        dropped: list[Dropped] = []
        values: dict[str, SeriesValues] = {}
        histograms: dict[str, HistogramValues] = {}
        for f in self.backend.feeds:
            source = next((s for s in f.sources if _present(found, s, f.kind)), None)
            if source is None:
                continue
            names = source.sample_names(f.kind)
            malformed = [found.malformed[n] for n in names if n in found.malformed]
            try:
                if malformed:
                    raise ExpositionError(malformed[0])
                if f.kind is Kind.HISTOGRAM:
                    hseries = self._histograms(found.samples, source, dropped)
                    if hseries:
                        histograms[f.key] = hseries
                    continue
                series = _scalars(found.samples[source.name], source, f, self._relabel, dropped)
                if source.times is not None:
                    other = found.samples.get(source.times.name, [])
                    factors = _scalars(other, source.times, f, self._relabel, dropped)
                    series = _product(series, factors, source, f, dropped)
            except ExpositionError as exc:
                if f.key in SIGNAL_KEYS:
                    raise ExpositionError(f"{source.name}: {exc}") from None
                detail = f"{source.name}: {exc}; family left out"
                dropped.append(Dropped(source.name, exc.kind, detail))
                continue
            if series:  # a family whose `where` keeps nothing leaves the key absent
                values[f.key] = series
        signals = {k: v for k, v in values.items() if k in SIGNAL_KEYS}
        model = (
            _first_model(signals)
            or model_hint
            or _first_model(values)
            or _first_model(histograms)
            or "unknown"
        )
        return BackendSample(
            backend=self.backend.name,
            model=model,
            values=MappingProxyType({k: _with_model(v, model) for k, v in values.items()}),
            histograms=MappingProxyType({k: _with_model(v, model) for k, v in histograms.items()}),
            dropped=tuple(dropped),
        )

    def _histograms(
        self, samples: Samples, source: Source, dropped: list[Dropped]
    ) -> HistogramValues:
        """Histograms of one source; reused as is while its lines are unchanged."""
        lines = tuple(samples.get(source.name + s) for s in ("_bucket", "_sum", "_count"))
        memo = self._histogram_memo.get(source.name)
        if memo is None or not all(a is b for a, b in zip(memo[0], lines, strict=True)):
            left_out: list[Dropped] = []
            memo = (lines, _histograms(samples, source, self._relabel, left_out), left_out)
            self._histogram_memo[source.name] = memo
        dropped.extend(memo[2])
        return memo[1]


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
            out = (own, _contract_labels(renamed))
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
                bound = math.nan
            if math.isnan(bound):
                raise ExpositionError(f"bucket bound le={le[:20]!r} is not a number")
            if bound == math.inf:
                le = "+Inf"  # as the format writes it ("+inf" and "Inf" parse the same)
            without_le = tuple((k, v) for k, v in own if k != "le")
            renamed = {self._mapping[k]: v for k, v in without_le if k in self._mapping}
            out = (_contract_labels(renamed), without_le, le, bound)
            if len(self._buckets) >= self._MAX_ENTRIES:
                self._buckets.clear()
            self._buckets[text] = out
        return out


def _contract_labels(renamed: Mapping[str, str]) -> Labels:
    """Contract labels in exposition order; a status code becomes its class (200 -> 2xx)."""
    if "status" in renamed:
        match = _STATUS.fullmatch(renamed["status"])
        if match is None:
            raise ExpositionError(f"status={renamed['status'][:20]!r} is not an HTTP status")
        renamed = {**renamed, "status": f"{match.group(1)}xx"}
    return tuple((k, renamed[k]) for k in LABEL_ORDER if k in renamed)


def _first_model(values: Mapping[str, Mapping[Labels, object]]) -> str:
    """The model label of the first series that has one."""
    for series in values.values():
        for labels in series:
            if labels and labels[0][0] == "model":
                return labels[0][1]
    return ""


def _series(name: str, labels: str) -> str:
    """A series as a log line names it, its label text cut short."""
    return f"{name}{{{labels if len(labels) <= 120 else labels[:120] + '...'}}}"


def _present(found: Scan, source: Source, kind: Kind) -> bool:
    """Whether the page holds the source's family (read or malformed)."""
    name = source.name + "_bucket" if kind is Kind.HISTOGRAM else source.name
    return name in found.samples or name in found.malformed


def _matches(labels: Labels, where: Mapping[str, LabelTest]) -> bool:
    present = dict(labels)
    for k, test in where.items():
        value = present.get(k)
        if value is None or not (value == test if isinstance(test, str) else test(value)):
            return False
    return True


def _from_labels(labels: Labels, alternatives: tuple[tuple[str, ...], ...]) -> float | str:
    """The product of the first alternative's label values that are all numbers; else why
    not ('' when every alternative lacks a label or reads "None": the series is absent)."""
    present = dict(labels)
    problem = ""
    for names in alternatives:
        texts = [present.get(n, "None") for n in names]
        if "None" in texts:
            continue
        try:
            numbers = [float(t) for t in texts]
        except ValueError:
            numbers = [math.nan]
        if all(math.isfinite(x) and x >= 0 for x in numbers):
            return math.prod(numbers)
        shown = ", ".join(f"{n}={t[:20]!r}" for n, t in zip(names, texts, strict=True))
        problem = problem or f"{shown}: not a number (finite, >= 0)"
    return problem


def _invalid(feed: Feed, value: float) -> str:
    """Why ``value`` cannot be a sample of the feed's contract series, or ''.

    Every scalar of the contract is a count, a counter or a ratio: finite and >= 0, and a
    ratio at most 1.
    """
    if feed.key.endswith("_ratio"):
        return "" if 0.0 <= value <= 1.0 else f"value {value} is not a ratio in [0, 1]"
    if math.isfinite(value) and value >= 0:
        return ""
    return f"value {value} is not a {feed.kind.value} value (finite, >= 0)"


def _scalars(
    samples: list[tuple[str, float]],
    source: Source,
    feed: Feed,
    relabel: _Relabeler,
    dropped: list[Dropped],
) -> SeriesValues:
    """The feed's series; processes that coincide after relabeling are merged (gauges: max,
    counters: sum). A merged series with one invalid part is left out whole: summing the
    valid parts alone would look like a counter reset."""
    out: dict[Labels, float] = {}
    seen: set[Labels] = set()
    bad: dict[Labels, str] = {}
    for text, value in samples:
        own, key = relabel.series(text)
        if source.where and not _matches(own, source.where):
            continue
        if own in seen:
            dropped.append(
                Dropped(source.name, "duplicate", f"{_series(source.name, text)} repeated")
            )
            continue
        seen.add(own)
        if source.from_labels:
            derived = _from_labels(own, source.from_labels)
            if isinstance(derived, str):
                if derived:
                    detail = f"{_series(source.name, text)}: {derived}"
                    dropped.append(Dropped(source.name, "invalid value", detail))
                continue
            value = derived
        value *= source.scale
        problem = _invalid(feed, value)
        if key in out:
            value = max(out[key], value) if feed.kind is Kind.GAUGE else out[key] + value
            problem = problem or _invalid(feed, value)  # a sum can overflow
        out[key] = value
        if problem and key not in bad:
            bad[key] = f"{_series(source.name, text)}: {problem}"
    for key, problem in bad.items():
        del out[key]
        dropped.append(Dropped(source.name, "invalid value", problem))
    return MappingProxyType(out)


def _product(
    series: SeriesValues,
    factors: SeriesValues,
    source: Source,
    feed: Feed,
    dropped: list[Dropped],
) -> SeriesValues:
    """Each series times the factor with the same contract labels; one without a factor is
    absent, and so is a product that is not a valid value (an overflow)."""
    out: dict[Labels, float] = {}
    for key, value in series.items():
        if key not in factors:
            continue
        product = value * factors[key]
        problem = _invalid(feed, product)
        if problem:
            labels = ",".join(f'{k}="{v}"' for k, v in key)
            dropped.append(
                Dropped(source.name, "invalid value", f"{_series(source.name, labels)}: {problem}")
            )
            continue
        out[key] = product
    return MappingProxyType(out)


def _histograms(
    samples: Samples, source: Source, relabel: _Relabeler, dropped: list[Dropped]
) -> HistogramValues:
    """Histograms of one source. Raises ExpositionError when the family cannot be assembled
    (a bound that is not a number; processes that disagree on the bounds)."""
    buckets = samples.get(source.name + "_bucket")
    if not buckets:
        return MappingProxyType({})
    # Group bucket lines by the series' labels without "le"; merge series that coincide
    # after relabeling (the same series from several processes).
    per_series: dict[Labels, dict[Labels, dict[str, tuple[float, float]]]] = {}
    for text, value in buckets:
        key, own, le, bound = relabel.bucket(text)
        if source.where and not _matches(own, source.where):
            continue
        series = per_series.setdefault(key, {}).setdefault(own, {})
        if le in series:
            dropped.append(
                Dropped(
                    source.name, "duplicate", f"{_series(source.name + '_bucket', text)} repeated"
                )
            )
            continue
        series[le] = (bound, value)
    sums = _by_own_labels(
        samples.get(source.name + "_sum", ()), source.name + "_sum", relabel, dropped
    )
    counts = _by_own_labels(
        samples.get(source.name + "_count", ()), source.name + "_count", relabel, dropped
    )
    out: dict[Labels, Histogram] = {}
    for key, own_series in per_series.items():
        parts = [_histogram(b, sums.get(own), counts.get(own)) for own, b in own_series.items()]
        problem = next(filter(None, (part.defect() for part in parts)), "")
        merged = parts[0]
        for part in parts[1:]:
            try:
                merged = merged.merged(part)
            except ValueError:
                raise ExpositionError(
                    "series that merge into one have different bucket bounds", "bucket bounds"
                ) from None
        merged = merged.scaled(source.scale)
        problem = problem or merged.defect()  # a sum can overflow
        if problem:
            labels = ",".join(f'{k}="{v}"' for k, v in key)  # the contract's labels
            dropped.append(
                Dropped(source.name, "invalid value", f"{_series(source.name, labels)}: {problem}")
            )
            continue
        out[key] = merged
    return MappingProxyType(out)


def _by_own_labels(
    samples: list[tuple[str, float]], name: str, relabel: _Relabeler, dropped: list[Dropped]
) -> dict[Labels, float]:
    out: dict[Labels, float] = {}
    for text, value in samples:
        own = relabel.series(text)[0]
        if own in out:
            dropped.append(Dropped(name, "duplicate", f"{_series(name, text)} repeated"))
        else:
            out[own] = value
    return out


def _histogram(
    buckets: dict[str, tuple[float, float]], total: float | None, count: float | None
) -> Histogram:
    """Buckets re-exported as the backend wrote them, in order of their bounds. A missing
    ``_count`` is the ``+Inf`` bucket's (the format defines them equal); a missing ``_sum``
    is NaN, which :meth:`Histogram.defect` refuses."""
    ordered = sorted(buckets.items(), key=lambda item: item[1][0])  # by bound
    if count is None:
        count = ordered[-1][1][1] if ordered[-1][1][0] == math.inf else math.nan
    return Histogram(
        tuple((le, cumulative) for le, (_, cumulative) in ordered),
        math.nan if total is None else total,
        count,
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
