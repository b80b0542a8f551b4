"""The backend's load over the rate window: what the baseline cell is chosen by, and the
shape of its requests: what the capacity is scaled to.

The load is the backend's running requests averaged over the window (time-weighted, poll to
poll), not the last poll's count, which flickers between concurrencies under light load.
Polls one second apart that see 1, 1, 2 and 2 running: :meth:`WindowedLoad.update` gives
1, 1, 1 and then 4/3. The shape (:class:`WindowedShape`) is the mean prompt and output length
of the requests finished over the window: 10 requests of 1,280 prompt and 640 output tokens
in all give (128.0, 64.0).
"""

from __future__ import annotations

from collections import deque

from inferwatch.model import BackendSample


class WindowedLoad:
    """Time-weighted mean of ``requests_running`` (summed over engines) over ``window``
    seconds of polls; None until a poll reported it."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._points: deque[tuple[float, float]] = deque()  # (at, running)
        self._area = 0.0  # running x seconds, between consecutive points kept

    def update(self, now: float, sample: BackendSample | None) -> float | None:
        """Fold in one poll; the mean over the window up to ``now``."""
        running = sample.total("requests_running") if sample is not None else None
        if running is not None:
            if self._points:
                at, value = self._points[-1]
                self._area += value * (now - at)
            self._points.append((now, running))
        while len(self._points) > 1 and self._points[1][0] <= now - self.window:
            at, value = self._points.popleft()
            self._area -= value * (self._points[0][0] - at)
        if not self._points:
            return None
        first, (last_at, last) = self._points[0][0], self._points[-1]
        span = last_at - first
        return self._area / span if span > 0 else last


# The histograms of finished requests' lengths, in the order of a shape.
SHAPE_HISTOGRAMS = ("request_prompt_tokens", "request_generation_tokens")


class WindowedShape:
    """Mean prompt and output tokens per request finished over ``window`` seconds of polls:
    (prompt, output), None until two polls apart saw a request finish. A histogram that
    went back (a restarted server) starts the window again."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._points: deque[tuple[float, tuple[float, ...]]] = deque()  # (at, sums and counts)

    def update(self, now: float, sample: BackendSample | None) -> tuple[float, float] | None:
        totals = _length_totals(sample)
        if totals is not None:
            if self._points and any(map(float.__lt__, totals, self._points[-1][1])):
                self._points.clear()
            self._points.append((now, totals))
        while len(self._points) > 2 and self._points[1][0] <= now - self.window:
            self._points.popleft()
        if len(self._points) < 2:
            return None
        first, last = self._points[0][1], self._points[-1][1]
        prompt_sum, prompts, output_sum, outputs = (b - a for a, b in zip(first, last, strict=True))
        if prompts <= 0 or outputs <= 0:
            return None
        return prompt_sum / prompts, output_sum / outputs


def _length_totals(sample: BackendSample | None) -> tuple[float, ...] | None:
    """(prompt tokens, prompts, output tokens, outputs) over every series, or None without
    both histograms."""
    if sample is None:
        return None
    totals: list[float] = []
    for key in SHAPE_HISTOGRAMS:
        series = sample.histograms.get(key)
        if not series:
            return None
        totals += [sum(h.sum for h in series.values()), sum(h.count for h in series.values())]
    return tuple(totals)
