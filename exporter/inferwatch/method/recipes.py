"""Recipes: how a signal is computed locally from two scrapes of one exporter.

Each signal of :mod:`inferwatch.method.signals` names one; :class:`inferwatch.method.local.Window`
evaluates it, combining an exporter's engines and GPUs as the signal's PromQL aggregates them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Quantile:
    """A quantile over the increase of the histogram's buckets, its series merged by bound
    (those that match ``where``: label -> regex)."""

    histogram: str
    q: float
    _: KW_ONLY
    where: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Mean:
    """A histogram's mean over the window, its series (those that match ``where``) added."""

    histogram: str
    _: KW_ONLY
    where: Mapping[str, str] = field(default_factory=dict)


# How a recipe combines the series of one exporter (its engines, its GPUs): as the PromQL
# form aggregates them (``sum``/``avg``/``max without (engine)`` or ``(gpu, uuid, name)``).
Aggregation = Literal["sum", "mean", "max"]


@dataclass(frozen=True)
class Rate:
    """Per-second increase of a counter over the window, its series combined by ``how``.

    ``born_beside``: a counter its source creates at its first event (vllm-router's failure
    outcomes, born at the first failure, often already at ten): a series born inside the
    window counts its whole value, where this other counter had series at the window's
    start (so that a page missing there, a failed poll's, does not count a whole history).
    """

    counter: str
    _: KW_ONLY
    where: Mapping[str, str] = field(default_factory=dict)  # label -> regex
    how: Aggregation = "sum"
    born_beside: str = ""


@dataclass(frozen=True)
class Gauge:
    """A gauge's value, its series combined by ``how``.

    ``averaged``: each series' mean over the window (PromQL's ``avg_over_time``), else its
    last value (an instant selector).
    """

    metric: str
    _: KW_ONLY
    where: Mapping[str, str] = field(default_factory=dict)
    how: Aggregation = "max"
    averaged: bool = False


@dataclass(frozen=True)
class Ratio:
    numerator: Recipe
    denominator: Recipe


@dataclass(frozen=True)
class ShareAbove:
    """The share of a histogram's observations above a threshold's bound, one of its bucket
    bounds: counted exactly, not interpolated (no value where no bucket has that bound)."""

    histogram: str
    _: KW_ONLY
    bound: str  # the name of a threshold in seconds


@dataclass(frozen=True)
class Sum:
    """The sum of recipes (none when any of them has no value), and of the ``optional``
    ones where they have series (PromQL's ``or 0 * ...``: a server without that counter)."""

    parts: tuple[Recipe, ...]
    _: KW_ONLY
    optional: tuple[Recipe, ...] = ()


Recipe = Quantile | Mean | Rate | Gauge | Ratio | ShareAbove | Sum
