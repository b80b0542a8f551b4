"""The exporter's own ``process_*`` and ``python_*`` series, for the end of ``/metrics``.

prometheus_client's collectors measure this process and its encoders write them, in the
format of the page they end. Sample::

    # HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
    # TYPE process_cpu_seconds_total counter
    process_cpu_seconds_total 0.11
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable

from prometheus_client import exposition as text_format
from prometheus_client.gc_collector import GCCollector
from prometheus_client.openmetrics import exposition as openmetrics_format
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger(__name__)

# Seconds the process and runtime series are kept before they are collected again.
MAX_AGE = 1.0


# What ProcessCollector gives on Linux (family names: counters without _total).
PROCESS_FAMILIES = frozenset(
    {
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "process_max_fds",
    }
)


class _Families:
    """Metric families already collected, in the shape prometheus_client's encoders take."""

    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self) -> list:
        return self._families


class SelfMetrics:
    """The exporter's own ``process_*`` (CPU, memory, file descriptors, start time; Linux
    only) and ``python_info``/``python_gc_*`` series, from prometheus_client's collectors,
    encoded by its encoders (16 samples; their cost per render is in ``bench/exposition.py``).

    They are collected at most once every :data:`MAX_AGE` seconds whatever the poll
    interval (reading ``/proc`` and encoding them cost more than the rest of a page), when a
    page is rendered: once per poll at most, at the first scrape after it. They move slowly,
    so they are at most ``MAX_AGE`` plus one poll interval old (plus the backend timeout
    while a poll waits on a hung backend). A collector that raises, or whose output an encoder
    refuses, is left out of the page (the rest is served) and logged once; so is a
    ProcessCollector that leaves some of its series out (it swallows read errors).
    """

    def __init__(
        self,
        collectors: Iterable[Collector] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if collectors is None:
            own = CollectorRegistry()  # not the global REGISTRY; each is encoded on its own
            collectors = (
                ProcessCollector(registry=own),
                PlatformCollector(registry=own),
                GCCollector(registry=own),
            )
        self._collectors = tuple(collectors)
        self._logged: set[tuple[int, str]] = set()
        self._clock = clock
        self._sections: dict[bool, tuple[float, str]] = {}  # format -> (collected at, text)

    def section(self, openmetrics: bool) -> str:
        """Their families in that format (no ``# EOF``), at most ``MAX_AGE`` old; never
        raises."""
        now = self._clock()
        collected = self._sections.get(openmetrics)
        if collected is not None and now - collected[0] < MAX_AGE:
            return collected[1]
        text = self._collect(openmetrics)
        self._sections[openmetrics] = (now, text)
        return text

    def _collect(self, openmetrics: bool) -> str:
        parts = []
        for n, collector in enumerate(self._collectors):
            try:
                families = list(collector.collect())
                if openmetrics:
                    text = openmetrics_format.generate_latest(_Families(families)).decode()
                    text = text.removesuffix("# EOF\n")
                else:
                    text = text_format.generate_latest(_Families(families)).decode()
            except Exception as exc:
                self._once(
                    n,
                    "failed",
                    "%s left out of /metrics: %s: %s",
                    collector,
                    type(exc).__name__,
                    exc,
                )
                continue
            if isinstance(collector, ProcessCollector) and os.path.exists("/proc/self/stat"):
                missing = PROCESS_FAMILIES - {f.name for f in families}
                if missing:
                    self._once(n, "missing", "%s could not read %s", collector, sorted(missing))
            parts.append(text)
        return "".join(parts)

    def _once(self, n: int, what: str, message: str, collector: Collector, *args) -> None:
        if (n, what) not in self._logged:
            self._logged.add((n, what))
            log.warning(message, type(collector).__name__, *args)
