"""A plan for the pages of one layout: how the values of a page that fits it map, feed by
feed, without reading it family by family.

The scanner cuts a page that fits one of its page layouts into the texts of its values
(:meth:`~inferwatch.collect.scanner.PageScanner.by_layout`); the layout says which values
are whose and their label texts. A plan, made on the layout's first page, holds for each
feed where its source's values sit, and what its label texts alone decide (the histograms'
assembly, the series' labels); a page then only has the values of the feeds read parsed.
It maps a page as the family-by-family mapping does (the hostile pages' property test
compares the two), and a feed whose value texts did not change keeps its series object
without parsing them::

    plan = Plan.of(mapper_feeds, layout.names, texts, relabeler_of_source)
    series = plan.series("requests_waiting", next_texts, dropped)

A value text that is not a number raises ValueError where its feed is mapped: the page is
then mapped family by family, as a page that fits no layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from types import MappingProxyType

from inferwatch.collect.backends import families
from inferwatch.collect.backends.relabel import Relabeler
from inferwatch.collect.backends.table import Feed, Source
from inferwatch.collect.textparse import ExpositionError
from inferwatch.metrics import Kind
from inferwatch.model import Dropped, HistogramValues, Labels, SeriesValues

# A layout's names: where each name's values sit among the page's, and its label texts.
Names = Mapping[str, tuple[Callable[[Sequence], tuple], tuple[str, ...]]]
# Each feed of a backend with its kind and its sources' sample names (the mapper's).
Feeds = tuple[tuple[Feed, Kind, tuple[tuple[Source, tuple[str, ...]], ...]], ...]

_NONE: tuple[Callable[[Sequence], tuple], tuple[str, ...]] = (lambda values: (), ())


@dataclass(frozen=True, eq=False)
class Step:
    """One feed of a page layout's plan: where its source's samples sit among the page's
    values (``getters``, one per sample name of the source), their label texts, and for a
    histogram which samples make which series."""

    feed: Feed
    source: Source
    getters: tuple[Callable[[Sequence], tuple], ...]
    texts: tuple[tuple[str, ...], ...]
    histogram: families.HistogramLayout | None
    # A scalar family whose every sample is a series of its own, read as it is: the
    # series' labels in sample order (else None).
    keys: tuple[Labels, ...] | None
    relabel: Relabeler  # the source's

    @classmethod
    def of(
        cls,
        feed: Feed,
        source: Source,
        parts: list[tuple[Callable[[Sequence], tuple], tuple[str, ...]]],
        relabel: Relabeler,
    ) -> Step:
        """The step of a source whose samples (``parts``: where each sample name's values
        sit, and their label texts) are on the page; ExpositionError where they cannot be
        mapped."""
        getters = tuple(get for get, _ in parts)
        texts = tuple(texts for _, texts in parts)
        if feed.kind is Kind.HISTOGRAM:
            return cls(
                feed,
                source,
                getters,
                texts,
                families.HistogramLayout.of(texts, source, relabel),
                None,
                relabel,
            )
        keys = tuple(relabel.series(text)[1] for text in texts[0])
        simple = (
            not source.where
            and not source.from_labels
            and not source.count_label
            and not source.newest
            and source.times is None
            and len(set(keys)) == len(keys)
            and len({relabel.series(text)[0] for text in texts[0]}) == len(keys)
        )
        return cls(feed, source, getters, texts, None, keys if simple else None, relabel)

    def texts_of(self, page_texts: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        """The texts of the source's values on this page, per sample name."""
        getters = self.getters
        if len(getters) == 1:  # a scalar family
            return (getters[0](page_texts),)
        return tuple([get(page_texts) for get in getters])

    def series(
        self, texts: tuple[tuple[str, ...], ...], dropped: list[Dropped]
    ) -> SeriesValues | HistogramValues:
        """The feed's series from the texts of the source's values, as the family-by-family
        mapping gives them; ValueError for a text that is not a number."""
        read = tuple([tuple(map(float, part)) for part in texts])
        if self.histogram is not None:
            return self.histogram.read(*read, self.source, dropped)
        if self.keys is not None:
            values = read[0]
            if self.source.scale != 1.0:
                values = tuple(v * self.source.scale for v in values)
            if families.valid(self.feed, values):
                return MappingProxyType(dict(zip(self.keys, values, strict=True)))
        pairs = list(zip(self.texts[0], read[0], strict=True))
        return families.scalars(pairs, self.source, self.feed, self.relabel, dropped)


class Plan:
    """The steps of a layout's feeds, and what each read on the last page it mapped."""

    def __init__(self, steps: tuple[Step, ...]) -> None:
        # Each feed's key -> the feed, whether its series are histograms, and its steps
        # (one, or every source of a feed_sum on the page) with their places in _last:
        # worked out once, not at every page. In the feeds' order.
        self.feeds: dict[str, tuple[Feed, bool, tuple[tuple[int, Step], ...]]] = {
            feed.key: (feed, feed.kind is Kind.HISTOGRAM, tuple(group))
            for feed, group in groupby(enumerate(steps), lambda step: step[1].feed)
        }
        # Each step's (its value texts on the last page it mapped, its series, what was
        # left out). Written by whichever reader maps the step: a stale entry only costs
        # a parse, as it is used only where its texts are the page's.
        self._last: list[tuple[tuple, SeriesValues | HistogramValues, list[Dropped]] | None]
        self._last = [None] * len(steps)

    @classmethod
    def of(
        cls,
        feeds: Feeds,
        names: Names,
        page_texts: tuple[str, ...],
        relabel_of: Callable[[Source], Relabeler],
    ) -> Plan | None:
        """The plan of a layout (``names``), or None where a family on it cannot be mapped
        from its label texts alone: bounds that are not numbers or do not merge, a
        malformed label set, a feed that multiplies two families. Its first page
        (``page_texts``) is mapped once to find out; ValueError where a value text on it
        is not a number (the next page may tell)."""
        steps = []
        for feed, _, sources in feeds:
            present = [(s, n) for s, n in sources if n[0] in names][: None if feed.adds else 1]
            for source, sample_names in present:
                if source.times is not None:
                    return None
                try:
                    parts = [names.get(n, _NONE) for n in sample_names]
                    step = Step.of(feed, source, parts, relabel_of(source))
                    step.series(step.texts_of(page_texts), [])
                except ExpositionError:
                    return None
                steps.append(step)
        return cls(tuple(steps))

    def series(
        self, key: str, page_texts: tuple[str, ...], dropped: list[Dropped]
    ) -> SeriesValues | HistogramValues:
        """The series of the feed ``key`` (one of :attr:`feeds`) on a page of value texts,
        what it left out added to ``dropped``; ValueError for a value text that is not a
        number."""
        feed, _, steps = self.feeds[key]
        last = self._last
        parts = []
        for at, step in steps:
            texts = step.texts_of(page_texts)
            memo = last[at]
            if memo is None or memo[0] != texts:  # the same texts: the same series
                left_out: list[Dropped] = []
                memo = last[at] = (texts, step.series(texts, left_out), left_out)
            if memo[2]:
                dropped.extend(memo[2])
            parts.append(memo[1])
        return families.added(parts, feed, dropped) if feed.adds else parts[0]
