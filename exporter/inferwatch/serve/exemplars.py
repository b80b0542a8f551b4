"""Exemplars on the server's latency histograms: a recent traced request of each bucket.

Each request span received (:mod:`inferwatch.serve.otlp`) is filed under every histogram of
the contract whose definition names a field of the request (``MetricDef.exemplar``: TTFT,
time per output token, end to end, queue, prefill, decode), by that value. The OpenMetrics
page then carries, on each bucket, the latest such request of the rate window whose value
falls in the bucket, so that a click on a slow bucket in Grafana leads to its trace::

    inferwatch_time_to_first_token_seconds_bucket{backend="vllm",model="m",le="0.25"} 7 \
# {trace_id="5b8efff798038103d269b633813fc60c"} 0.212 1796474390.081

The timestamp is when the sidecar received the span (the server's clock is not ours). A
request without a W3C trace id (16 bytes, not all zero) gives no exemplar. The spans do not
name the model or engine, so only a histogram with one series carries exemplars: with
several, no request could be put on the right one.

Memory is bounded whatever the span rate: values are filed in a log grid of
:data:`CELLS_PER_OCTAVE` cells an octave over a fixed range, each cell keeping its latest
request, so a bucket's exemplar is the latest of the cells' requests inside it.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from inferwatch.metrics import ALL
from inferwatch.model import Exemplar
from inferwatch.serve.slow_requests import Request

# The histogram keys that carry exemplars, with the request's field each observes.
FIELDS = {key: spec.exemplar for key, spec in ALL.items() if spec.exemplar}
CELLS_PER_OCTAVE = 8
# The octaves filed apart: from 2**-30 s (1 ns) to 2**24 s (194 days); beyond, the end cells.
LOWEST_OCTAVE, HIGHEST_OCTAVE = -30, 24
_ZERO_CELL = LOWEST_OCTAVE * CELLS_PER_OCTAVE - 1


def _cell(value: float) -> int:
    if value <= 0.0:
        return _ZERO_CELL
    octaves = min(max(math.log2(value), LOWEST_OCTAVE), HIGHEST_OCTAVE)
    return math.floor(octaves * CELLS_PER_OCTAVE)


def w3c_trace_id(trace_id: str | None) -> bool:
    """Whether this is a W3C trace id as OpenTelemetry writes it: 32 lowercase hex digits,
    not all zero."""
    return (
        trace_id is not None
        and len(trace_id) == 32
        and trace_id != "0" * 32
        and all(c in "0123456789abcdef" for c in trace_id)
    )


class Exemplars:
    """The latest traced request per cell of each exemplar histogram, over ``window`` s."""

    def __init__(self, window: float, *, clock: Callable[[], float] = time.time) -> None:
        self.window = window
        self._clock = clock
        self._cells: dict[str, dict[int, Exemplar]] = {key: {} for key in FIELDS}
        self._lock = threading.Lock()  # added to on the event loop, read by page renders

    def add(self, requests: Iterable[Request]) -> None:
        """File finished requests, received now."""
        now = self._clock()
        with self._lock:
            for request in requests:
                if not w3c_trace_id(request.trace_id):
                    continue
                for key, field in FIELDS.items():
                    value = getattr(request, field)
                    if value is None or not math.isfinite(value) or value < 0:
                        continue
                    cells = self._cells[key]
                    cells[_cell(value)] = Exemplar(str(request.trace_id), value, now)

    def of_buckets(self, key: str, bounds: Sequence[float]) -> list[Exemplar | None]:
        """For buckets of these upper bounds (increasing, ``+Inf`` last), the latest request
        of the window in each (a bucket holds what is above the bound before it), or None."""
        out: list[Exemplar | None] = [None] * len(bounds)
        if key not in self._cells:
            return out
        oldest = self._clock() - self.window
        with self._lock:
            cells = self._cells[key]
            for cell in [c for c, e in cells.items() if e.at < oldest]:
                del cells[cell]
            kept = list(cells.values())
        for exemplar in kept:
            i = bisect_left(bounds, exemplar.value)  # the first bound >= the value
            if i < len(bounds) and ((held := out[i]) is None or exemplar.at > held.at):
                out[i] = exemplar
        return out
