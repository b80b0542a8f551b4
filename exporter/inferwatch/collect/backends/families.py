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
from collections.abc import Mapping
from types import MappingProxyType

from inferwatch.collect.backends.relabel import Relabeler
from inferwatch.collect.backends.table import Feed, LabelTest, Source
from inferwatch.collect.textparse import ExpositionError, Samples
from inferwatch.metrics import Kind
from inferwatch.model import Dropped, Histogram, HistogramValues, Labels, SeriesValues


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
    samples: Samples, source: Source, relabel: Relabeler, dropped: list[Dropped]
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


def _by_own_labels(
    samples: list[tuple[str, float]], name: str, relabel: Relabeler, dropped: list[Dropped]
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
