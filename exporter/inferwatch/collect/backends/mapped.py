"""A page that fits a known layout, mapped feed by feed as its series are read.

A poll reads a few feeds of its page: the signals, the latency window's two histograms. A
scrape or the verdict reads them all, every few seconds at most. So a page whose layout has
a plan (:mod:`.plan`) keeps the texts of its values, and each feed is parsed and mapped
when first read, then kept for the page's other readers. Its sample reads as any other::

    sample.values["requests_waiting"]   # this feed parsed and mapped now
    list(sample.histograms)             # every histogram feed (a scrape)
    sample.dropped                      # every feed: what the page's mapping left out

What a feed leaves out is reported (the poller logs it) when the feed is mapped. A value
text that is not a number has the rest of the page mapped family by family, by a fresh
mapper, as a page that fits no layout: what is read of such a page is what a poll of it
would have given had it been mapped in full. The page is read by the poll's event loop and
by a scrape's or the verdict's thread: a lock keeps each feed mapped once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import overload

from inferwatch.collect.backends.plan import Plan
from inferwatch.model import BackendSample, Dropped


class MappedPage:
    """One page's value texts and what of them was mapped so far, under the page's model.

    ``signals`` are the feeds the poll mapped to find the page's model (their series and
    what they left out); ``under_model`` puts a feed's series under the page's model;
    ``fallback`` maps the whole page family by family; ``report`` is told what a feed
    leaves out, once per page."""

    def __init__(
        self,
        plan: Plan,
        texts: tuple[str, ...],
        signals: dict[str, tuple[Mapping, list[Dropped]]],
        under_model: Callable[[str, Mapping], Mapping],
        fallback: Callable[[], BackendSample],
        report: Callable[[Dropped], None],
    ) -> None:
        self._plan = plan
        self._texts = texts
        self._under_model = under_model
        self._fallback = fallback
        self._report = report
        self._lock = threading.Lock()
        # Each feed read so far: its series under the page's model ({}: absent from the
        # page) and what it left out.
        self._read: dict[str, tuple[Mapping, list[Dropped]]] = {
            key: (under_model(key, series), left_out) for key, (series, left_out) in signals.items()
        }
        self._full: BackendSample | None = None  # the page mapped in full, where it had to be

    def keys(self, histograms: bool) -> Iterator[str]:
        """The plan's feeds of one kind (scalars or histograms), in the table's order."""
        return (
            key for key, (_, histogram, _) in self._plan.feeds.items() if histogram is histograms
        )

    def series(self, key: str, histograms: bool) -> Mapping | None:
        """A feed's series of one kind, mapped on its first read; None where the page has
        none."""
        feed = self._plan.feeds.get(key)
        if feed is None or feed[1] is not histograms:
            return None
        read = self._read.get(key)  # a feed read before needs no lock
        if read is None:
            with self._lock:
                read = self._series(key)
        if self._full is not None:
            full = self._full.histograms if histograms else self._full.values
            return full.get(key)
        return read[0] or None

    def dropped(self) -> tuple[Dropped, ...]:
        """What the page's mapping left out, every feed mapped to tell."""
        with self._lock:
            read = [self._series(key) for key in self._plan.feeds]
            if self._full is not None:
                return tuple(self._full.dropped)
            return tuple(d for _, left_out in read for d in left_out)

    def _series(self, key: str) -> tuple[Mapping, list[Dropped]]:
        """A feed's series and what it left out, mapped now if not read before (the lock
        held)."""
        read = self._read.get(key)
        if read is not None:
            return read
        if self._full is None:
            left_out: list[Dropped] = []
            try:
                series = self._plan.series(key, self._texts, left_out)
            except ValueError:  # a value that is not a number: the page read in full
                self._full = self._fallback()
                for dropped in self._full.dropped:
                    self._report(dropped)
            else:
                for dropped in left_out:
                    self._report(dropped)
                read = self._read[key] = (
                    self._under_model(key, series) if series else {},
                    left_out,
                )
                return read
        read = self._read[key] = ({}, [])  # served from the full mapping from now on
        return read


class Feeds(Mapping[str, Mapping]):
    """A mapped page's scalar or histogram series by contract key (a
    :class:`~inferwatch.model.BackendSample`'s ``values`` or ``histograms``)."""

    def __init__(self, page: MappedPage, histograms: bool) -> None:
        self._page = page
        self._histograms = histograms

    def __getitem__(self, key: str) -> Mapping:
        series = self.get(key)
        if series is None:
            raise KeyError(key)
        return series

    def get(self, key: str, default: Mapping | None = None) -> Mapping | None:  # type: ignore[override]
        series = self._page.series(key, self._histograms)
        return default if series is None else series

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._page.keys(self._histograms) if self.get(k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class LeftOut(Sequence[Dropped]):
    """A mapped page's ``dropped``: every feed is mapped when it is first looked at. Equal
    to (and shown as) the tuple of what was left out."""

    def __init__(self, page: MappedPage) -> None:
        self._page = page

    @overload
    def __getitem__(self, index: int) -> Dropped: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Dropped, ...]: ...
    def __getitem__(self, index: int | slice) -> Dropped | tuple[Dropped, ...]:
        return self._page.dropped()[index]

    def __len__(self) -> int:
        return len(self._page.dropped())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._page.dropped() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._page.dropped())
