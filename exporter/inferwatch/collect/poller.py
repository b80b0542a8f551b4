"""The poll loop: samples backend and GPUs together and publishes immutable snapshots.

Every ``poll_interval`` seconds it reads the backend's page (bounded, with a timeout) and
NVML, reads each registered :class:`Source`, derives the queued-while-idle state, the decode
floor and the latency quantiles over the rate window, and swaps in a new :class:`Snapshot`.
A dead, slow or garbage-spewing backend only flips ``backend_up`` to 0; the HTTP app never
waits on any of this: it serves the latest snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from inferwatch.baseline import Baseline
from inferwatch.baseline import series as baseline_series
from inferwatch.collect.backends import Backend, Mapper, UnknownBackend, detect
from inferwatch.collect.derive import EngineLayout, QueuedWhileIdle, decode_floor, derived
from inferwatch.collect.gpu import GpuSource
from inferwatch.collect.load import WindowedLoad, WindowedShape
from inferwatch.collect.steps import DEFAULT_KNOWN_STEP, StepRecord
from inferwatch.collect.textparse import ExpositionError
from inferwatch.collect.upstream import Upstream, UpstreamError
from inferwatch.collect.window import LatencyWindow
from inferwatch.logs import CauseLog, LogLimiter
from inferwatch.metrics import SERIES_DROPPED_REASONS
from inferwatch.model import (
    BackendSample,
    CollectorStatus,
    Dropped,
    GpuSample,
    Labels,
    Snapshot,
    SourceSample,
)
from inferwatch.urls import redact_url

log = logging.getLogger("inferwatch.poller")


# The most samples of mapped families a page may hold (--backend-max-series): the largest
# real capture in tests/fixtures maps 244 (SGLang, 2026), a vLLM 0.32 engine ~200, so this
# is room for ~40x the largest page seen, e.g. a vLLM server with 32 data-parallel engines.
# A bigger page marks the backend down before anything of it is parsed further.
DEFAULT_MAX_SERIES = 10_000

# The longest label set of a series, in bytes (--backend-max-label-bytes): the longest in a
# real capture in tests/fixtures is 1,034 (vLLM 0.32's cache_config_info), so this is room
# for four times it. A longer series is left out and counted; it holds no memory past the
# scan that reads its line.
DEFAULT_MAX_LABEL_BYTES = 4096


# The collectors every poll reports, besides the registered sources'.
CORE_COLLECTORS = ("backend", "gpu")

# The largest page mapped on the event loop: about four times the biggest real capture in
# tests/fixtures. A thread hop costs more than mapping a page of a usual size; a bigger page
# is mapped in a worker thread (bench/exporter.py measures both).
INLINE_PAGE_CHARS = 256 * 1024


class Source(Protocol):
    """What a poll reads besides the backend and NVML: a part of the sidecar whose state
    each snapshot carries (the canary's probes, evidence captures, the server's CPU), under
    the collector name it is registered with (:meth:`Poller.register`). A sample with a
    ``problem`` makes its collector report failure with that cause, logged once per cause."""

    def sample(self, now: float, server: BackendSample | None) -> SourceSample:
        """The source's state for the snapshot of this poll (``server``: its page, or None
        when the backend is down)."""
        ...


@dataclass
class _Registered:
    name: str  # its collector label
    source: Source


@dataclass(frozen=True)
class PollSettings:
    interval: float = 0.5
    idle_threshold: float = 0.1
    # The longest step the engine is known to take (collect/steps.py).
    engine_step_seconds: float = DEFAULT_KNOWN_STEP
    model_weights_bytes: float | None = None
    peak_memory_bandwidth: float | None = None
    tensor_parallel_size: int | None = None
    baseline: Baseline | None = None
    max_series: int = DEFAULT_MAX_SERIES
    max_label_bytes: int = DEFAULT_MAX_LABEL_BYTES
    # The rate window of the rules (the spec's): the latency quantiles' (collect/window.py)
    # and the load the baseline cell is chosen by (collect/load.py).
    latency_window: float = 300.0
    # The server's role (metrics.ROLES), or "auto": what its page says.
    role: str = "auto"


class Poller:
    """Owns the sampling state; ``snapshot`` is always the latest complete poll."""

    def __init__(
        self,
        upstream: Upstream,
        backend: Backend | None,
        gpu: GpuSource | None,
        settings: PollSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self._sources: list[_Registered] = []
        self._source_logs: dict[str, CauseLog] = {}
        self.backend = backend  # None until --backend auto has recognised the server
        self._mapper: Mapper | None = None  # this poller's, for the recognised backend
        self._last_mapped: tuple[tuple, BackendSample] | None = None  # (page and how, sample)
        self.gpu = gpu
        self.settings = settings
        self._clock = clock
        self._layout = EngineLayout(settings.tensor_parallel_size)
        self._queued_while_idle = QueuedWhileIdle(
            settings.idle_threshold, self._layout, StepRecord(settings.engine_step_seconds)
        )
        self._latency = LatencyWindow(settings.latency_window)
        self._load = WindowedLoad(settings.latency_window)
        self._shape = WindowedShape(settings.latency_window)
        self._version = ""
        self._model_hint = ""  # the model a server without model labels names elsewhere
        self._info_known = False
        self._backend_log = CauseLog("backend scrape", log)
        self._gpu_log = CauseLog("GPU collection", log)
        self._dropped_log = LogLimiter()
        self._bug_log = LogLimiter()
        self.last_poll_at: float | None = None
        # Series the mapping left out since start, by reason (label sets over the bound).
        self._series_dropped = dict.fromkeys(SERIES_DROPPED_REASONS, 0.0)
        self.snapshot = Snapshot(
            backend_kind=backend.name if backend else "unknown",
            backend_up=False,
            backend_scrape_seconds=0.0,
            backend=None,
            collectors={},
            series_dropped=MappingProxyType(dict(self._series_dropped)),
        )

    def register(self, name: str, source: Source) -> None:
        """Each snapshot carries ``source``'s state, and its collector status as ``name``."""
        if name in (*CORE_COLLECTORS, *(r.name for r in self._sources)):
            raise ValueError(f"a collector named {name!r} is registered already")
        self._sources.append(_Registered(name, source))

    async def recognised(self) -> Backend:
        """The backend, once known (``--backend auto``: once a poll has recognised it)."""
        while self.backend is None:
            await asyncio.sleep(self.settings.interval)
        return self.backend

    def metrics_url(self) -> str:
        return self.upstream.url(self.backend.metrics_path if self.backend else "/metrics")

    def seconds_since_poll(self) -> float | None:
        return None if self.last_poll_at is None else self._clock() - self.last_poll_at

    def stale_after(self) -> float:
        """How long without a completed poll means the loop is stuck."""
        return max(10 * self.settings.interval, 5.0) + self.upstream.timeout

    async def poll_once(self) -> Snapshot:
        """Run one poll and publish its snapshot."""
        gpu_task = asyncio.create_task(self._sample_gpus()) if self.gpu is not None else None
        sample, backend_status = await self._scrape_backend()
        gpus: tuple[GpuSample, ...] = ()
        collectors: dict[str, CollectorStatus] = {"backend": backend_status}
        if gpu_task is not None:
            gpus, gpu_status = await gpu_task
            collectors["gpu"] = gpu_status
        now = self._clock()
        queued_while_idle = self._queued_while_idle.update(now, sample, gpus or None)
        floor = decode_floor(
            sample,
            gpus,
            self._layout,
            self.settings.model_weights_bytes,
            self.settings.peak_memory_bandwidth,
        )
        # The load only chooses a baseline cell; the shape only scales its capacity.
        baseline = self.settings.baseline
        load = self._load.update(now, sample) if baseline is not None else None
        shape = self._shape.update(now, sample) if baseline and baseline.capacity else None
        sources = {
            registered.name: value
            for registered in self._sources
            if (value := self._read(registered, now, sample, collectors)) is not None
        }
        if sample is not None and sample.oversized:
            self._series_dropped["label_bytes"] += sample.oversized
        self.snapshot = Snapshot(
            backend_kind=self.backend.name if self.backend else "unknown",
            backend_up=sample is not None,
            backend_scrape_seconds=backend_status.duration_seconds,
            backend=sample,
            collectors=collectors,
            gpus=gpus,
            derived=derived(queued_while_idle, floor, self._latency_window(now, sample)),
            baseline=baseline_series(baseline, sample, load or 0.0, shape)
            if baseline is not None and sample is not None
            else {},
            sources=MappingProxyType(sources),
            series_dropped=MappingProxyType(dict(self._series_dropped)),
            server=redact_url(self.upstream.origin()),
            role=self._role(sample),
        )
        self.last_poll_at = now
        return self.snapshot

    def _role(self, sample: BackendSample | None) -> str:
        """``--role``, else what the page says (nothing while the server is down)."""
        if self.settings.role != "auto":
            return self.settings.role
        return sample.role if sample is not None else ""

    def _latency_window(
        self, now: float, sample: BackendSample | None
    ) -> Mapping[str, Mapping[Labels, float]]:
        """The window's quantiles for this snapshot; a bug there leaves them out, nothing else."""
        try:
            return self._latency.update(now, sample)
        except Exception:
            if self._bug_log.allow("latency window") is not None:
                log.exception("computing the latency window failed; its series are left out")
            return {}

    def _read(
        self,
        registered: _Registered,
        now: float,
        sample: BackendSample | None,
        collectors: dict[str, CollectorStatus],
    ) -> SourceSample | None:
        """A registered source's state for this snapshot, its collector status added to
        ``collectors``; a bug there leaves its series out, nothing else."""
        started = time.perf_counter()
        try:
            value = registered.source.sample(now, sample)
        except Exception as exc:
            if self._bug_log.allow(registered.name) is not None:
                log.exception("reading the %s failed; its series are left out", registered.name)
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            collectors[registered.name] = CollectorStatus(
                False, time.perf_counter() - started, error
            )
            return None
        problem = value.problem
        if problem:
            cause_log = self._source_logs.setdefault(
                registered.name, CauseLog(f"reading the {registered.name}", log)
            )
            cause_log.failed(problem, problem)
        collectors[registered.name] = CollectorStatus(
            not problem, time.perf_counter() - started, problem
        )
        return value

    async def run(self) -> None:
        """Poll forever on a fixed cadence; a slow poll delays, never stacks, the next."""
        interval = self.settings.interval
        next_at = self._clock()
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the exporter; log it with its traceback
                if self._bug_log.allow("poll") is not None:
                    log.exception("poll failed")
            next_at += interval
            now = self._clock()
            if next_at < now:
                next_at = now  # fell behind (slow backend): skip the missed ticks
            await asyncio.sleep(next_at - now)

    async def _scrape_backend(self) -> tuple[BackendSample | None, CollectorStatus]:
        started = time.perf_counter()
        try:
            text = await self.upstream.get_exposition(
                self.backend.metrics_path if self.backend else "/metrics"
            )
            sample = await self._mapped(text)
            if not self._info_known:  # a page that is not this server's asks nothing more
                assert self.backend is not None
                await self._fetch_info(self.backend)
                sample = await self._mapped(text)  # with the version (and model) it names
        except (UpstreamError, ExpositionError, UnknownBackend) as exc:
            self._backend_log.failed(exc.kind, str(exc))
            self._info_known = False  # the server may come back as another release or model
            return None, CollectorStatus(False, time.perf_counter() - started, str(exc))
        self._backend_log.ok()
        return sample, CollectorStatus(True, time.perf_counter() - started)

    def _log_dropped(self, dropped: Dropped) -> None:
        """Log what a page's mapping left out: once per family and kind of defect a minute
        (told as the poll or, for a feed mapped when read, a scrape maps it)."""
        held = self._dropped_log.allow((dropped.family, dropped.kind))
        if held is not None:
            more = f" ({held} more like this in the last minute)" if held else ""
            backend = self.backend.name if self.backend else "backend"
            log.warning("%s page: %s%s", backend, dropped.detail, more)

    async def _mapped(self, text: str) -> BackendSample:
        """The page mapped: a page of a usual size on the event loop (a thread hop would cost
        more than the mapping), a bigger one off it, so that /metrics and /healthz keep
        answering meanwhile. A page of a usual size equal to the last one mapped (an idle
        server's, polled faster than anything on it moves) is that page's mapping again, the
        same object; what it left out was told when it was first mapped. (A bigger page is
        not kept to be compared: it would be held twice while the next is read.)"""
        if len(text) > INLINE_PAGE_CHARS:
            self._last_mapped = None
            return await asyncio.to_thread(self._normalize, text)
        given = (text, self.backend, self._model_hint, self.settings.max_series, self._version)
        if self._last_mapped is None or self._last_mapped[0] != given:
            self._last_mapped = (given, self._normalize(text))
        return self._last_mapped[1]

    def _normalize(self, text: str) -> BackendSample:
        """Recognise the server (``--backend auto``) and map its page onto the contract, with
        the role the page tells (:attr:`Backend.role_of`)."""
        if self.backend is None:
            self.backend = detect(text)
            log.info("backend recognised as %s", self.backend.name)
        if self._mapper is None or self._mapper.backend is not self.backend:
            limit = self.settings.max_label_bytes
            self._mapper = Mapper(self.backend, self._log_dropped, limit)
        sample = self._mapper.normalize(
            text, self._model_hint, self.settings.max_series, self._version
        )
        role = self.backend.role_of(text) if self.backend.role_of is not None else ""
        return replace(sample, role=role) if role else sample

    async def _fetch_info(self, backend: Backend) -> None:
        """Version and (for servers without model labels) model, once per connection."""
        if backend.version_path:
            self._version = await self.upstream.get_json_field(
                backend.version_path, backend.version_field
            )
        if backend.model_path:
            self._model_hint = await self.upstream.get_json_field(
                backend.model_path, backend.model_field
            )
        self._info_known = True

    async def _sample_gpus(self) -> tuple[tuple[GpuSample, ...], CollectorStatus]:
        assert self.gpu is not None
        # NVML calls block (a lost GPU can stall them); keep them off the event loop.
        gpus, status = await asyncio.to_thread(self.gpu.sample)
        if status.success:
            self._gpu_log.ok()
        elif self.gpu.started_once:  # NVML never worked here: no GPU, nothing to warn about
            self._gpu_log.failed("nvml", status.error)
        return gpus, status
