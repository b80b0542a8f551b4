"""One feed's family read off a scanned page: its series under contract labels.

Series that coincide once relabeled (the same engine from several processes) are merged:
gauges take the max, counters and histograms the sum. With vLLM's table (``pid`` dropped)::

    vllm:prompt_tokens_total{engine="0",model_name="tiny",pid="7"} 10.0
    vllm:prompt_tokens_total{engine="0",model_name="tiny",pid="8"} 5.0

is ``{(("model", "tiny"), ("engine", "0")): 15.0}``. What cannot be kept is left out with a
:class:`~inferwatch.model.Dropped` saying why: a repeated series (the first is kept), a value
its kind cannot take, a derived value that is not a number. A family that cannot be read
at all raises :class:`~inferwatch.collect.textparse.ExpositionError`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from inferwatch.collect.backends.relabel import Relabeler
from inferwatch.collect.backends.table import Feed, LabelTest, Source
from inferwatch.collect.scanner import LAYOUTS
from inferwatch.collect.textparse import ExpositionError, Samples
from inferwatch.metrics import Kind
from inferwatch.model import Dropped, Histogram, HistogramValues, Labels, SeriesValues

# The most characters of label text a histogram feed's layouts are made from, together
# (about as much again is held): hundreds of times a real histogram family's. A
# layout that would take them past it makes the feed forget the others; a bigger one is
# not kept (such a family is assembled anew each time its label texts change).
HISTOGRAM_LAYOUT_CHARS = 1 << 20


def scalars(
    samples: list[tuple[str, float]],
    source: Source,
    feed: Feed,
    relabel: Relabeler,
    dropped: list[Dropped],
) -> SeriesValues:
    """The feed's series; processes that coincide after relabeling are merged (gauges: max,
    counters: sum). A merged series with one invalid part is left out whole: summing the
    valid parts alone would look like a counter reset."""
    out: dict[Labels, float] = {}
    seen: set[Labels] = set()
    bad: dict[Labels, str] = {}
    stamps: dict[Labels, float] = {}  # ``newest``: the value of the sample kept per key
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
        stamp = value
        if source.from_labels:
            derived = _from_labels(own, source.from_labels)
            if isinstance(derived, str):
                if derived:
                    detail = f"{_series(source.name, text)}: {derived}"
                    dropped.append(Dropped(source.name, "invalid value", detail))
                continue
            value = derived
        elif source.count_label:
            names = dict(own).get(source.count_label, "")
            value = float(sum(1 for n in names.split(",") if n.strip()))
        value *= source.scale
        problem = _invalid(feed, value)
        if source.newest:
            if key in stamps and not stamp > stamps[key]:
                continue
            stamps[key] = stamp
            bad.pop(key, None)
        elif key in out:
            value = _merged(feed, out[key], value)
            problem = problem or _invalid(feed, value)  # a sum can overflow
        out[key] = value
        if problem and key not in bad:
            bad[key] = f"{_series(source.name, text)}: {problem}"
    for key, problem in bad.items():
        del out[key]
        dropped.append(Dropped(source.name, "invalid value", problem))
    return MappingProxyType(out)


def oversized(counts: Mapping[str, int], max_bytes: float) -> list[Dropped]:
    """What a scan left out for label sets longer than ``max_bytes``: one entry a name."""
    return [
        Dropped(
            name,
            "label bytes",
            f"{n} series of {name} left out: label set over {max_bytes:.0f} bytes "
            "(--backend-max-label-bytes)",
        )
        for name, n in counts.items()
    ]


def _merged(feed: Feed, one: float, other: float) -> float:
    """Two values of one series: a gauge's larger (stale copies read 0), a counter's sum."""
    return max(one, other) if feed.kind is Kind.GAUGE else one + other


def added(parts: list[SeriesValues], feed: Feed, dropped: list[Dropped]) -> SeriesValues:
    """The series of a feed's sources added (:func:`~.table.feed_sum`): a label set two of
    them give is their sum (other families, other quantities: a gauge's too), left out if
    the sum is invalid."""
    if len(parts) == 1:
        return parts[0]
    out: dict[Labels, float] = {}
    for series in parts:
        for key, value in series.items():
            out[key] = out[key] + value if key in out else value
    for key, value in list(out.items()):
        problem = _invalid(feed, value)
        if problem:  # a sum can overflow
            del out[key]
            dropped.append(Dropped(feed.key, "invalid value", f"{feed.key}{key}: {problem}"))
    return MappingProxyType(out)


def product(
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
        result = value * factors[key]
        problem = _invalid(feed, result)
        if problem:
            dropped.append(_invalid_series(source, key, problem))
            continue
        out[key] = result
    return MappingProxyType(out)


def histograms(
    samples: Samples,
    source: Source,
    relabel: Relabeler,
    dropped: list[Dropped],
    layouts: dict[tuple, HistogramLayout] | None = None,
) -> HistogramValues:
    """Histograms of one source. Raises ExpositionError when the family cannot be assembled
    (a bound that is not a number; processes that disagree on the bounds).

    ``layouts`` (the caller's, kept from page to page) holds how the source's samples
    assembled on the last pages, by their label texts: a page whose label texts are the
    same only has its values read."""
    name = source.name
    buckets = samples.get(name + "_bucket")
    if not buckets:
        return MappingProxyType({})
    sums = samples.get(name + "_sum", ())
    counts = samples.get(name + "_count", ())
    texts = (tuple(map(_FIRST, buckets)), tuple(map(_FIRST, sums)), tuple(map(_FIRST, counts)))
    layout = layouts.get(texts) if layouts is not None else None
    if layout is None:
        layout = HistogramLayout.of(texts, source, relabel)
        if layouts is not None and layout.chars <= HISTOGRAM_LAYOUT_CHARS:
            held = sum(other.chars for other in layouts.values())
            if len(layouts) >= LAYOUTS or held + layout.chars > HISTOGRAM_LAYOUT_CHARS:
                layouts.clear()
            layouts[texts] = layout
    return layout.read(
        list(map(_SECOND, buckets)), list(map(_SECOND, sums)), list(map(_SECOND, counts)),
        source, dropped,
    )  # fmt: skip


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


@dataclass(frozen=True)
class _Part:
    """One process's histogram in a series: where its buckets (in the order of their
    bounds), its ``_sum`` and its ``_count`` are among the source's samples."""

    positions: tuple[int, ...]
    les: tuple[str, ...]
    sum_at: int | None
    count_at: int | None


@dataclass(frozen=True)
class HistogramLayout:
    """How one source's samples assemble into contract series, told by their label texts
    alone: which buckets, sums and counts make each series (the parts of several processes
    added up), and what the label texts alone leave out (repeated series)."""

    series: tuple[tuple[Labels, tuple[_Part, ...]], ...]
    dropped: tuple[Dropped, ...]
    chars: int  # of the label texts it was made from

    @classmethod
    def of(
        cls, texts: tuple[tuple[str, ...], ...], source: Source, relabel: Relabeler
    ) -> HistogramLayout:
        """The layout of the samples with these label texts (buckets, sums, counts); raises
        ExpositionError for a bound that is not a number or parts with different bounds."""
        bucket_texts, sum_texts, count_texts = texts
        dropped: list[Dropped] = []
        # Group bucket lines by the series' labels without "le"; merge series that coincide
        # after relabeling (the same series from several processes).
        per_series: dict[Labels, dict[Labels, dict[str, tuple[float, int]]]] = {}
        for at, text in enumerate(bucket_texts):
            key, own, le, bound = relabel.bucket(text)
            if source.where and not _matches(own, source.where):
                continue
            series = per_series.setdefault(key, {}).setdefault(own, {})
            if le in series:
                detail = f"{_series(source.name + '_bucket', text)} repeated"
                dropped.append(Dropped(source.name, "duplicate", detail))
                continue
            series[le] = (bound, at)
        sums = _by_own_labels(sum_texts, source.name + "_sum", relabel, dropped)
        counts = _by_own_labels(count_texts, source.name + "_count", relabel, dropped)
        out = []
        for key, own_series in per_series.items():
            parts = []
            for own, by_le in own_series.items():
                ordered = sorted(by_le.items(), key=lambda item: item[1][0])  # by bound
                positions = tuple(at for _, (_, at) in ordered)
                les = tuple(le for le, _ in ordered)
                parts.append(_Part(positions, les, sums.get(own), counts.get(own)))
            if any(part.les != parts[0].les for part in parts):
                raise ExpositionError(
                    "series that merge into one have different bucket bounds", "bucket bounds"
                )
            out.append((key, tuple(parts)))
        chars = sum(len(text) for part in texts for text in part)
        return cls(tuple(out), tuple(dropped), chars)

    def read(
        self,
        buckets: list[float],
        sums: list[float],
        counts: list[float],
        source: Source,
        dropped: list[Dropped],
    ) -> HistogramValues:
        """The series from the samples' values; one invalid for its kind is left out, with
        why in ``dropped``."""
        dropped.extend(self.dropped)
        out: dict[Labels, Histogram] = {}
        for key, parts in self.series:
            histograms = [_histogram(part, buckets, sums, counts) for part in parts]
            problem = next(filter(None, (h.defect() for h in histograms)), "")
            merged = histograms[0]
            for other in histograms[1:]:
                merged = merged.merged(other)
            merged = merged.scaled(source.scale)
            if not problem and merged is not histograms[0]:
                problem = merged.defect()  # a sum can overflow
            if problem:
                dropped.append(_invalid_series(source, key, problem))
                continue
            out[key] = merged
        return MappingProxyType(out)


def _series(name: str, labels: str) -> str:
    """A series as a log line names it, its label text cut short."""
    return f"{name}{{{labels if len(labels) <= 120 else labels[:120] + '...'}}}"


def _invalid_series(source: Source, key: Labels, problem: str) -> Dropped:
    """A merged series (named by its contract labels) left out for an invalid value."""
    labels = ",".join(f'{k}="{v}"' for k, v in key)
    return Dropped(source.name, "invalid value", f"{_series(source.name, labels)}: {problem}")


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


def valid(feed: Feed, values: tuple[float, ...]) -> bool:
    """Whether every value can be a sample of the feed's contract series (told in a few
    passes in C; :func:`_invalid` says why one cannot)."""
    if not values:
        return True
    if not (all(map(math.isfinite, values)) and min(values) >= 0):
        return False
    return max(values) <= 1 if feed.key.endswith("_ratio") else True


def _invalid(feed: Feed, value: float) -> str:
    """Why ``value`` cannot be a sample of the feed's contract series, or ''.

    Every scalar of the contract is a count, a counter or a ratio: finite and >= 0, and a
    ratio at most 1.
    """
    if valid(feed, (value,)):
        return ""
    if feed.key.endswith("_ratio"):
        return f"value {value} is not a ratio in [0, 1]"
    return f"value {value} is not a {feed.kind.value} value (finite, >= 0)"


def _by_own_labels(
    texts: tuple[str, ...], name: str, relabel: Relabeler, dropped: list[Dropped]
) -> dict[Labels, int]:
    """Where each series' sample is among ``texts`` (its label texts), by its own labels."""
    out: dict[Labels, int] = {}
    for at, text in enumerate(texts):
        own = relabel.series(text)[0]
        if own in out:
            dropped.append(Dropped(name, "duplicate", f"{_series(name, text)} repeated"))
        else:
            out[own] = at
    return out


def _histogram(
    part: _Part, buckets: list[float], sums: list[float], counts: list[float]
) -> Histogram:
    """A part's histogram, its buckets as the backend wrote them. A missing ``_count`` is the
    ``+Inf`` bucket's (the format defines them equal); a missing ``_sum`` is NaN, which
    :meth:`Histogram.defect` refuses."""
    cumulative = [buckets[at] for at in part.positions]
    if part.count_at is not None:
        count = counts[part.count_at]
    else:
        count = cumulative[-1] if part.les[-1] == "+Inf" else math.nan
    total = math.nan if part.sum_at is None else sums[part.sum_at]
    return Histogram(tuple(zip(part.les, cumulative, strict=True)), total, count)
