"""A server's :class:`Backend` (its table) and the :class:`Mapper` that maps its pages.

The mapper reads the families the table names (:mod:`.table`), each from the first of its
sources on the page (:mod:`.families`), into a :class:`~inferwatch.model.BackendSample`::

    vllm:num_requests_waiting{engine="0",model_name="tiny"} 20.0

is ``values["requests_waiting"] == {(("model", "tiny"), ("engine", "0")): 20.0}``; a series
without a model label (an unlabelled server's, the process CPU) gets the page's model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from weakref import WeakKeyDictionary

from inferwatch.collect.backends import families
from inferwatch.collect.backends.mapped import Feeds, LeftOut, MappedPage
from inferwatch.collect.backends.plan import Plan
from inferwatch.collect.backends.relabel import Relabeler
from inferwatch.collect.backends.table import Feed, Profiler, Source
from inferwatch.collect.scanner import Layout, PageScanner
from inferwatch.collect.textparse import BOM, ExpositionError, Samples, Scan
from inferwatch.metrics import Kind
from inferwatch.model import BackendSample, Dropped, HistogramValues, Labels, SeriesValues

# The contract keys the poll loop derives its signals from (queued-while-idle) and reads the
# page's model from: a page where one of these is malformed is rejected, not trimmed.
SIGNAL_KEYS = frozenset(
    {"requests_waiting", "requests_running", "engine_steps", "scheduler_idle_seconds"}
)


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
    serves_inference: bool = True  # False: a router's metrics port, no API for the canary
    role_of: Callable[[str], str] | None = None  # the role its raw page tells (metrics.ROLES)

    @property
    def wanted(self) -> frozenset[str]:
        """Every sample name the feeds read."""
        return frozenset(n for f in self.feeds for s in f.sources for n in s.sample_names(f.kind))

    @property
    def measures_ttft(self) -> bool:
        """Whether the server has a TTFT histogram of its own (its table feeds one)."""
        return any(f.key == "time_to_first_token_seconds" for f in self.feeds)

    def readable(self, text: str) -> str:
        """The page as this server's mapping reads it: a leading byte-order mark skipped,
        then :attr:`preprocess` applied (which raises ExpositionError for a body it cannot
        decode)."""
        text = text.removeprefix(BOM)
        return text if self.preprocess is None else self.preprocess(text)

    def signature_lines(self, page: str) -> int:
        """How many lines of the page start with one of the :attr:`signature` prefixes."""
        return sum(1 for _ in self._signature_line_starts(page))

    def recognises(self, page: str) -> bool:
        """Whether the page holds this server's metric names (it stops at the first)."""
        return next(self._signature_line_starts(page), None) is not None

    def _signature_line_starts(self, page: str) -> Iterator[int]:
        """Where each line that starts with a signature prefix begins, prefix by prefix."""
        for prefix in self.signature:
            if page.startswith(prefix):
                yield 0
            at = page.find(f"\n{prefix}")
            while at >= 0:
                yield at + 1
                at = page.find(f"\n{prefix}", at + 1)

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
    cache and layouts, the relabeler's memo, each histogram's layout (which samples make
    which series) and each feed's series, reused as they are (the same objects) while the
    lines they were read from are unchanged. A page that fits a layout with a plan is
    mapped feed by feed as its series are read (:mod:`.mapped`). What a page's mapping
    leaves out is told to ``report`` (the poller logs it) as it is found. Not shared between
    owners: each poll maps one page at a time (a scrape's thread may read the last one's).
    """

    def __init__(
        self,
        backend: Backend,
        report: Callable[[Dropped], None] | None = None,
        max_label_bytes: float = math.inf,
    ) -> None:
        self.backend = backend
        self._report = report or _ignore
        self._relabel = Relabeler(backend.labels)
        # Sources that keep labels of their own (Source.labels) relabel with their own.
        self._relabels = {
            id(s): Relabeler({**backend.labels, **s.labels}, s.values, s.constant)
            for f in backend.feeds
            for source in f.sources
            for s in (source, source.times)
            if s is not None and s.relabels
        }
        self._scanner = PageScanner(backend.wanted, max_label_bytes)
        # (feed key, source) -> (the source, the sample lists read, its series, what it left out)
        self._memo: dict[tuple[str, str], tuple[Source, tuple, Mapping, list[Dropped]]] = {}
        # (feed key, source) -> its histograms' layouts by label texts (families.histograms)
        self._layouts: dict[tuple[str, str], dict[tuple, families.HistogramLayout]] = {}
        # feed key -> (its series, the page's model, the series under that model), last read
        self._modelled: dict[str, tuple[Mapping, str, Mapping]] = {}
        # A page layout the scanner holds -> how its values map (None: not by layout alone).
        self._plans: WeakKeyDictionary[Layout, Plan | None] = WeakKeyDictionary()
        # Each feed with its kind and its sources' sample names, worked out once.
        self._feeds = tuple(
            (f, f.kind, tuple((s, s.sample_names(f.kind)) for s in f.sources))
            for f in backend.feeds
        )

    def normalize(
        self, text: str, model_hint: str = "", max_series: float = math.inf, version: str = ""
    ) -> BackendSample:
        """Map one page onto the contract (of the server's ``version``, where known); raises
        ExpositionError for a page to reject.

        A leading byte-order mark is skipped. A page is rejected when it is cut short, is
        not this server's, holds more than ``max_series`` samples of the families mapped
        here, or when a family the poll loop needs (:data:`SIGNAL_KEYS`) is malformed. Any
        other malformed family is left out, and so are series with a value their kind cannot
        take (a negative or NaN counter, a ratio outside [0, 1]) and repeats of a series (the
        first is kept, as Prometheus does); the sample's ``dropped`` says what and why.
        """
        page = self.backend.readable(text)
        fitted = self._scanner.by_layout(page, max_series)
        if fitted is not None:
            sample = self._planned(text, *fitted, model_hint, max_series, version)
            if sample is not None:
                return sample
        if not self.backend.recognises(page):
            raise ExpositionError(
                f"no {self.backend.name} metrics on the page ({self.backend.hint_no_metrics()})",
                "not this server",
            )
        found = self._scanner.scan(page, max_series)
        self._next_page()
        dropped = families.oversized(found.oversized, self._scanner.max_label_bytes)
        values: dict[str, SeriesValues] = {}
        histograms: dict[str, HistogramValues] = {}
        for f, kind, sources in self._feeds:
            present = [s for s in sources if _present(found, s[1])][: None if f.adds else 1]
            if not present:
                continue
            parts = [self._read(found, f, *source, dropped) for source in present]
            series = families.added(parts, f, dropped)
            if series:  # a family whose `where` keeps nothing leaves the key absent
                (histograms if kind is Kind.HISTOGRAM else values)[f.key] = series
        for left_out in dropped:
            self._report(left_out)
        oversized = sum(found.oversized.values())
        return self._sample(values, histograms, dropped, model_hint, version, oversized)

    def _planned(
        self,
        text: str,
        layout: Layout,
        texts: tuple[str, ...],
        model_hint: str,
        max_series: float,
        version: str,
    ) -> BackendSample | None:
        """The page mapped feed by feed as it is read, by the plan of its layout (made on
        the layout's first page); None where it has none, or where a signal's value or the
        model must be read from the whole page: then it is mapped family by family. A layout
        has a plan only where it holds samples of a :attr:`Backend.signature` name: a page
        that fits it is this server's without another look."""
        if layout not in self._plans:
            signed = any(name.startswith(self.backend.signature) for name in layout.names)
            try:
                plan = Plan.of(self._feeds, layout.names, texts, self._of) if signed else None
            except ValueError:  # a value that is not a number: the next page may plan
                return None
            self._plans[layout] = plan
        plan = self._plans[layout]
        if plan is None:
            return None
        self._next_page()
        signals: dict[str, tuple[Mapping, list[Dropped]]] = {}
        try:
            for key in plan.feeds:
                if key in SIGNAL_KEYS:
                    left_out: list[Dropped] = []
                    signals[key] = (plan.series(key, texts, left_out), left_out)
        except ValueError:
            return None
        model = _first_model({k: s for k, (s, _) in signals.items()}) or model_hint
        if not model:  # only the page's other series may name it
            return None
        page = MappedPage(
            plan,
            texts,
            signals,
            lambda key, series: self._under_model(key, series, model),
            lambda: Mapper(self.backend).normalize(text, model_hint, max_series),
            self._report,
        )
        return BackendSample(
            backend=self.backend.name,
            model=model,
            version=version,
            values=Feeds(page, histograms=False),
            histograms=Feeds(page, histograms=True),
            dropped=LeftOut(page),
        )

    def _read(
        self,
        found: Scan,
        feed: Feed,
        source: Source,
        names: tuple[str, ...],
        dropped: list[Dropped],
    ) -> SeriesValues | HistogramValues:
        """The feed's series from ``source`` (its sample ``names``); none when its family is
        malformed, which rejects the page for a signal key and is said in ``dropped`` for
        any other."""
        try:
            return self._family(found, feed, source, names, dropped)
        except ExpositionError as exc:
            if feed.key in SIGNAL_KEYS:
                raise ExpositionError(f"{source.name}: {exc}") from None
            detail = f"{source.name}: {exc}; family left out"
            dropped.append(Dropped(source.name, exc.kind, detail))
            return MappingProxyType({})

    def _family(
        self,
        found: Scan,
        feed: Feed,
        source: Source,
        names: tuple[str, ...],
        dropped: list[Dropped],
    ) -> SeriesValues | HistogramValues:
        """The feed's series from ``source``; ExpositionError when its family is malformed."""
        if found.malformed:
            malformed = [found.malformed[n] for n in names if n in found.malformed]
            if malformed:
                raise ExpositionError(malformed[0])
        lines = tuple(map(found.samples.get, names))
        memo = self._memo.pop((feed.key, source.name), None)
        if memo is None or memo[0] is not source or not _same(memo[1], lines):
            memo = None  # the stale series are not held while the family is mapped anew
            left_out: list[Dropped] = []
            memo = (source, lines, self._map(found.samples, feed, source, left_out), left_out)
        self._memo[feed.key, source.name] = memo
        dropped.extend(memo[3])
        return memo[2]

    def _map(
        self, samples: Samples, feed: Feed, source: Source, dropped: list[Dropped]
    ) -> SeriesValues | HistogramValues:
        """The feed's series from its source's samples."""
        if feed.kind is Kind.HISTOGRAM:
            layouts = self._layouts.setdefault((feed.key, source.name), {})
            return families.histograms(samples, source, self._of(source), dropped, layouts)
        series = families.scalars(samples[source.name], source, feed, self._of(source), dropped)
        if source.times is None:
            return series
        other = samples.get(source.times.name, [])
        factors = families.scalars(other, source.times, feed, self._of(source.times), dropped)
        return families.product(series, factors, source, feed, dropped)

    def _of(self, source: Source) -> Relabeler:
        """The relabeler of a source's samples."""
        return self._relabels.get(id(source), self._relabel) if source.relabels else self._relabel

    def _next_page(self) -> None:
        """Tell the relabelers a new page is read (their memos keep what it reads)."""
        self._relabel.next_page()
        for relabel in self._relabels.values():
            relabel.next_page()

    def _sample(
        self,
        values: Mapping[str, SeriesValues],
        histograms: Mapping[str, HistogramValues],
        dropped: list[Dropped],
        model_hint: str,
        version: str,
        oversized: int,
    ) -> BackendSample:
        """The page's sample, every series under the page's model: a signal's model label,
        else ``model_hint``, else any series' model label."""
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
            version=version,
            values=MappingProxyType({k: self._under_model(k, v, model) for k, v in values.items()}),
            histograms=MappingProxyType(
                {k: self._under_model(k, v, model) for k, v in histograms.items()}
            ),
            dropped=tuple(dropped),
            oversized=oversized,
        )

    def _under_model(self, key: str, series: Mapping, model: str) -> Mapping:
        """:func:`_with_model` of a feed's series, the last read's result while its series
        and the page's model are the same."""
        was = self._modelled.get(key)
        if was is not None and was[0] is series and was[1] == model:
            out = was[2]
        else:
            out = _with_model(series, model)
        self._modelled[key] = (series, model, out)
        return out


def _ignore(_: Dropped) -> None:
    """What a mapper without an owner to tell does with what a page left out."""


def _same(before: tuple, now: tuple) -> bool:
    """Whether every sample list is the very one read before (the scanner's, unchanged)."""
    return len(before) == len(now) and all(map(operator.is_, before, now))


def _present(found: Scan, names: tuple[str, ...]) -> bool:
    """Whether the page holds the family of a source's sample ``names`` (read or malformed):
    its first (the ``_bucket`` of a histogram)."""
    return names[0] in found.samples or names[0] in found.malformed


def _first_model(values: Mapping[str, Mapping[Labels, object]]) -> str:
    """The model label of the first series that has one."""
    for series in values.values():
        for labels in series:
            if labels and labels[0][0] == "model":
                return labels[0][1]
    return ""


def _with_model(series: Mapping[Labels, object], model: str) -> Mapping:
    """Series without a model label (process CPU, unlabelled servers) get the page's model."""
    try:  # every series led by a model label, told in C (a series without labels raises)
        if all(map("model".__eq__, map(_FIRST, map(_FIRST, series)))):
            return series
    except IndexError:
        pass
    return MappingProxyType(
        {
            (labels if labels and labels[0][0] == "model" else (("model", model), *labels)): v
            for labels, v in series.items()
        }
    )


_FIRST = operator.itemgetter(0)
