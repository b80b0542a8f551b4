"""The backend's load over the rate window: what the baseline cell is chosen by.

``inferwatch_baseline_*`` hold the baseline cell comparable to the live load, and the rules,
the verdict page and ``diagnose`` divide the window's latency p95 by them. The load is the
backend's running requests averaged over the same window (time-weighted, poll to poll), not
the last poll's count: under light load that count flickers between concurrencies (0, 1,
2...), and the latency of a window of mixed load was held to the cell of one instant
(a healthy service read as a regression in one 15 s round in two).

Sample: polls one second apart that see 1, 1, 2 and 2 running: :meth:`WindowedLoad.update`
gives 1, 1, 1 and then 4/3 (each count holds until the next poll).
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
