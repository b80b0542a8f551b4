"""Quantiles: Prometheus' ``histogram_quantile`` on scraped histograms, and sample quantiles.

:func:`histogram_quantile` follows PromQL's classic-histogram semantics (``promql/quantile.go``:
buckets sorted and made monotonic, NaN without a ``+Inf`` bucket or observations, linear
interpolation inside the bucket that holds the rank), so a quantile computed here from two
scrapes equals Prometheus' ``histogram_quantile(q, increase(..._bucket[window]))``.
:func:`increase` gives the histogram of a window from its scrapes at both ends.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

from inferwatch.model import Histogram


def histogram_quantile(q: float, buckets: Iterable[tuple[str | float, float]]) -> float:
    """The ``q``-quantile of cumulative ``(upper bound, count)`` buckets, as PromQL computes it.

    Bounds may be given as the exposition writes them (``"0.005"``, ``"+Inf"``), e.g. the
    ``buckets`` of a :class:`~inferwatch.model.Histogram`.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for bound, count in buckets:
        upper = float(bound)
        merged[upper] = merged.get(upper, 0.0) + count
    if not merged:
        return math.nan
    bounds = sorted(merged)
    if bounds[-1] != math.inf:
        return math.nan
    counts = []
    for upper in bounds:
        counts.append(max(merged[upper], counts[-1]) if counts else merged[upper])
    if len(bounds) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    # The first bucket (the +Inf one excluded) whose cumulative count reaches the rank.
    b = next((i for i in range(len(bounds) - 1) if counts[i] >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # q = 0 with an empty first bucket: 0/0, NaN in PromQL too
        return math.nan
    return start + (end - start) * (rank / count)


def increase(before: Histogram, after: Histogram) -> Histogram:
    """The observations made between two scrapes of one histogram.

    A histogram that went backwards or changed its bounds (the server restarted) counts from
    zero, as Prometheus' ``increase()`` treats a counter reset: the window is ``after``.
    """
    les = after.les
    if before.les != les or went_back(before, after):
        return after
    deltas = tuple(map(operator.sub, after.counts, before.counts))
    return Histogram(
        tuple(zip(les, deltas, strict=True)), after.sum - before.sum, after.count - before.count
    )


def went_back(before: Histogram, after: Histogram) -> bool:
    """Whether a later scrape of a histogram with the same bounds counts less anywhere: its
    server restarted (a counter reset)."""
    return after.count < before.count or any(map(operator.lt, after.counts, before.counts))


def sample_quantile(q: float, values: Sequence[float]) -> float:
    """The ``q``-quantile of raw observations, linear between the closest ranks.

    Hyndman and Fan's type 7 (numpy's default): ``h = (n - 1) q``, interpolated between the
    ``floor(h)``-th and the next smallest value. NaN for no values.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    h = (len(ordered) - 1) * min(max(q, 0.0), 1.0)
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])
