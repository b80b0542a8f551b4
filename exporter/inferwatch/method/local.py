"""The method evaluated locally: every signal's recipe over two scrapes of one exporter.

The same signals and conditions as the rules (:mod:`inferwatch.method.signals`,
:mod:`inferwatch.method.alerts`), computed from the exporter's own pages instead of
Prometheus' recording rules: ``diagnose --exporter`` reads them. Each recipe combines an
exporter's engines and GPUs as the PromQL form aggregates them; tests/test_signals.py
evaluates both forms on the same series.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from inferwatch.method.alerts import ALERTS, Alert, Cond
from inferwatch.method.quantile import histogram_quantile
from inferwatch.method.recipes import (
    Aggregation,
    Gauge,
    Mean,
    Quantile,
    Rate,
    Ratio,
    Recipe,
    ShareAbove,
    Sum,
)
from inferwatch.method.signals import SIGNALS
from inferwatch.method.spec import Spec
from inferwatch.method.thresholds import THRESHOLDS
from inferwatch.model import bucket_bound

# A page's samples by name (``inferwatch.collect.textparse.read_page`` reads one).
Samples = dict[str, list[tuple[dict[str, str], float]]]


# A selector's patterns, compiled once (re's own cache is looked up in Python at every call:
# every series of every verdict).
_pattern = functools.lru_cache(maxsize=256)(re.compile)


def _matches(labels: Mapping[str, str], where: Mapping[str, str]) -> bool:
    return all(_pattern(pattern).fullmatch(labels.get(k, "")) for k, pattern in where.items())


def _combine(values: list[float], how: Aggregation) -> float:
    """The series of one exporter (its engines, its GPUs) as one value."""
    if how == "sum":
        return math.fsum(values)
    if how == "mean":
        return math.fsum(values) / len(values)
    return max(values)


def _sorted(labels: Mapping[str, str]) -> tuple:
    return tuple(sorted(labels.items()))


class Matched(NamedTuple):
    """A metric's series over a window: on both pages (older value, newer value, the newer
    page's labels), and the values of those on one page only."""

    both: list[tuple[float, float, Mapping[str, str]]]
    before_only: list[float]
    after_only: list[float]


@dataclass
class Window:
    """Two scrapes of one exporter ``seconds`` apart; computes signal recipes over them
    (``spec``: the thresholds a recipe reads, the built-in defaults without one), over the
    series in ``scope`` alone where it names labels."""

    before: Samples
    after: Samples
    seconds: float
    spec: Spec | None = None
    # Only the series with these labels (label -> value): one worker of a router's.
    scope: Mapping[str, str] = field(default_factory=dict)
    # What a window has read of its pages, by (page, name, where), and matched across them,
    # by (name, where): the signals of a verdict read the same series many times. Never
    # changed once read.
    _read: dict[tuple, dict[int, tuple]] = field(default_factory=dict, repr=False, compare=False)
    _matched: dict[tuple, Matched] = field(default_factory=dict, repr=False, compare=False)

    def signal(self, name: str) -> float | None:
        """A signal of :data:`SIGNALS` over the window (its fallback's where the page has
        none of its own series, see :meth:`reading`)."""
        return self.reading(name)[1]

    def reading(self, name: str) -> tuple[str, float | None]:
        """The signal read for ``name`` and its value: ``name`` itself, or its fallback
        where the newer page lacks a series the signal's own recipe reads and has the
        fallback's (as PromQL's ``or`` takes the fallback where the signal has no series).
        A share (unit ``ratio``) is clipped to [0, 1], as its rule is: a counter of seconds
        can gain a stall's first seconds at once (``collect/derive.py`` counts a stall from
        its start), and over a window shorter than the stall that would read as more than
        the whole window."""
        signal = SIGNALS[name]
        if signal.fallback is not None and not self._present(signal.local):
            read = self.reading(signal.fallback)
            if self._present(SIGNALS[read[0]].local):  # else neither has series: its own name
                return read
        value = self.value(signal.local)
        if value is not None and signal.unit == "ratio":
            value = min(max(value, 0.0), 1.0)
        return name, value

    def _present(self, recipe: Recipe | None) -> bool:
        """Whether the newer page has series of every metric the recipe reads."""
        return recipe is not None and all(
            self._series(self.after, name, where) for name, where in _required(recipe)
        )

    def label_values(self, label: str, recipe: Recipe) -> set[str]:
        """The values of ``label`` on the newer page's series that the recipe reads."""
        return {
            labels[label]
            for name, where in _required(recipe)
            for labels, _ in self._series(self.after, name, where).values()
            if label in labels
        }

    def value(self, recipe: Recipe | None) -> float | None:
        if recipe is None:
            return None
        if isinstance(recipe, Ratio):
            top, bottom = self.value(recipe.numerator), self.value(recipe.denominator)
            if top is None or not bottom:
                return None
            return top / bottom
        if isinstance(recipe, Sum):
            parts = [self.value(part) for part in recipe.parts]
            parts += [self.value(part) or 0.0 for part in recipe.optional]
            return None if None in parts else math.fsum(p for p in parts if p is not None)
        if isinstance(recipe, Rate):
            return self._rate(recipe)
        if isinstance(recipe, Gauge):
            return self._gauge(recipe)
        if isinstance(recipe, Mean):
            total = self._delta(f"inferwatch_{recipe.histogram}_sum", recipe.where)
            count = self._delta(f"inferwatch_{recipe.histogram}_count", recipe.where)
            return None if total is None or not count else total / count
        if isinstance(recipe, Quantile):
            return self._quantile(recipe)
        if isinstance(recipe, ShareAbove):
            return self._share_above(recipe)
        raise TypeError(recipe)

    def _series(self, samples: Samples, name: str, where: Mapping[str, str]) -> dict[int, tuple]:
        """The series of ``name`` on a page that match ``where``: (labels, value) by the
        label dict's identity."""
        read = (id(samples), name, tuple(where.items()))
        series = self._read.get(read)
        if series is None:
            where = {**where, **{k: re.escape(v) for k, v in self.scope.items()}}
            series = self._read[read] = {
                id(sample[0]): sample  # the page's own pair: nothing new per series
                for sample in samples.get(name, [])
                if _matches(sample[0], where)
            }
        return series

    def _match(self, name: str, where: Mapping[str, str]) -> Matched:
        """The series of ``name`` matched across the two pages. A series is the same on both
        when its label dict is (a :class:`~inferwatch.collect.textparse.PageReader` shares
        them between the pages it reads), else when its labels are equal: no key is built
        for a series whose dict both pages hold."""
        memo = (name, tuple(where.items()))
        found = self._matched.get(memo)
        if found is not None:
            return found
        before = self._series(self.before, name, where)
        both: list[tuple[float, float, Mapping[str, str]]] = []
        after_only: list[tuple[Mapping[str, str], float]] = []
        for key, (labels, value) in self._series(self.after, name, where).items():
            old = before.get(key)
            if old is None:
                after_only.append((labels, value))
            else:
                both.append((old[1], value, labels))
        if len(both) == len(before):
            before_only: list[float] = []
        else:  # match the rest by their labels
            shared = {id(labels) for _, _, labels in both}
            rest = {_sorted(labels): v for k, (labels, v) in before.items() if k not in shared}
            unmatched = []
            for labels, value in after_only:
                old_value = rest.pop(_sorted(labels), None)
                if old_value is None:
                    unmatched.append((labels, value))
                else:
                    both.append((old_value, value, labels))
            before_only, after_only = list(rest.values()), unmatched
        found = self._matched[memo] = Matched(both, before_only, [v for _, v in after_only])
        return found

    def _increases(self, name: str, where: Mapping[str, str]) -> list[tuple[float, Mapping]]:
        """Each series' increase over the window, with its labels; a reset counts from
        zero. A series missing from the first page (a failed poll's page has no backend
        series) has none, as PromQL's ``increase`` needs two samples: its whole count is not
        the window's."""
        return [
            (value - old if value >= old else value, labels)
            for old, value, labels in self._match(name, where).both
        ]

    def _delta(self, name: str, where: Mapping[str, str] | None = None) -> float | None:
        """The increase of a counter, summed over its series."""
        increases = self._increases(name, where or {})
        return math.fsum(i for i, _ in increases) if increases else None

    def _rate(self, rate: Rate) -> float | None:
        increases = [i for i, _ in self._increases(rate.counter, rate.where)]
        if rate.born_beside and self._series(self.before, rate.born_beside, rate.where):
            increases += self._match(rate.counter, rate.where).after_only
        if not increases:
            return None
        return _combine(increases, rate.how) / self.seconds

    def _gauge(self, gauge: Gauge) -> float | None:
        matched = self._match(gauge.metric, gauge.where)
        if gauge.averaged:
            # avg_over_time: each series' mean over the scrapes of the window that hold it.
            values = [(old + value) / 2 for old, value, _ in matched.both]
            values += matched.before_only
        else:
            values = [value for _, value, _ in matched.both]
        values += matched.after_only
        return _combine(values, gauge.how) if values else None

    def _quantile(self, recipe: Quantile) -> float | None:
        """Over the increase of every series' buckets, merged by bound (all engines)."""
        increases = self._increases(f"inferwatch_{recipe.histogram}_bucket", recipe.where)
        if not increases:
            return None
        buckets: dict[str, float] = {}
        for increase, labels in increases:
            le = labels["le"]
            buckets[le] = buckets.get(le, 0.0) + increase
        result = histogram_quantile(recipe.q, buckets.items())
        return None if math.isnan(result) else result

    def _share_above(self, recipe: ShareAbove) -> float | None:
        """1 - the bucket at the bound's increase over the count's (all engines)."""
        name = recipe.bound
        bound = self.spec.threshold(name) if self.spec else THRESHOLDS[name].default
        count = self._delta(f"inferwatch_{recipe.histogram}_count")
        below = [
            increase
            for increase, labels in self._increases(f"inferwatch_{recipe.histogram}_bucket", {})
            if bucket_bound(labels["le"]) == bound
        ]
        if not count or not below:
            return None
        return max(0.0, 1.0 - math.fsum(below) / count)


def _required(recipe: Recipe) -> list[tuple[str, Mapping[str, str]]]:
    """The metrics (name, selector) a recipe needs series of to have a value."""
    if isinstance(recipe, Ratio):
        return _required(recipe.numerator) + _required(recipe.denominator)
    if isinstance(recipe, Sum):
        return [needed for part in recipe.parts for needed in _required(part)]
    if isinstance(recipe, Rate):
        return [(recipe.counter, recipe.where)]
    if isinstance(recipe, Gauge):
        return [(recipe.metric, recipe.where)]
    if isinstance(recipe, Mean):
        return [(f"inferwatch_{recipe.histogram}_count", recipe.where)]
    if isinstance(recipe, Quantile):
        return [(f"inferwatch_{recipe.histogram}_bucket", recipe.where)]
    if isinstance(recipe, ShareAbove):
        return [(f"inferwatch_{recipe.histogram}_bucket", {})]
    raise TypeError(recipe)


Evidence = list[tuple[Cond, float | None]]


def signal_readings(window: Window) -> dict[str, tuple[str, float | None]]:
    """Every signal over the window but those judged per label value (:func:`scoped`): the
    signal read (itself or its fallback) and its value (None: no data); ``exporter_up`` is 1
    (it answered)."""
    readings = {name: window.reading(name) for name, s in SIGNALS.items() if s.per is None}
    readings["exporter_up"] = ("exporter_up", 1.0)
    return readings


def _per(alert: Alert) -> str | None:
    """The label an alert is judged per value of: its signals' ``per``, if any."""
    return next((SIGNALS[c.signal].per for c in alert.conditions() if SIGNALS[c.signal].per), None)


def holding(
    readings: Mapping[str, tuple[str, float | None]], spec: Spec, per: str | None = None
) -> list[tuple[Alert, Evidence]]:
    """The alerts judged per ``per`` (None: per exporter) whose conditions hold for these
    readings, each with its evidence (the conditions naming the signal read)."""
    values = {name: value for name, (_, value) in readings.items()}

    def holds(cond: Cond) -> bool:
        value = values[cond.signal]
        return value is not None and cond.holds(value, spec)

    out = []
    for alert in ALERTS.values():
        if _per(alert) != per:
            continue
        if alert.any_of:
            fires = any(holds(c) for c in alert.any_of)
        else:
            fires = all(holds(c) for c in alert.when) and not any(holds(c) for c in alert.unless)
        if fires:
            out.append(
                (
                    alert,
                    [
                        (replace(c, read=readings[c.signal][0]), values[c.signal])
                        for c in alert.conditions()
                    ],
                )
            )
    return out


def scoped(window: Window, spec: Spec) -> list[tuple[dict[str, str], Alert, Evidence]]:
    """The alerts judged per label value (a router's, per worker) that hold for one value:
    the label and its value, the alert and its evidence, over the series of that value."""
    out = []
    for label in sorted({s.per for s in SIGNALS.values() if s.per}):
        names = {c.signal for a in ALERTS.values() if _per(a) == label for c in a.conditions()}
        values = set().union(
            *(window.label_values(label, SIGNALS[n].local) for n in names if SIGNALS[n].local)
        )
        for value in sorted(values):
            one = Window(
                window.before, window.after, window.seconds, window.spec, scope={label: value}
            )
            readings = {name: one.reading(name) for name in names}
            out += [({label: value}, a, ev) for a, ev in holding(readings, spec, label)]
    return out
