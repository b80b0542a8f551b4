"""The poll loop: samples backend and GPUs together and publishes immutable snapshots.

Every ``poll_interval`` seconds it reads the backend's ``/metrics`` (bounded, with a
timeout) and samples NVML, derives the queued-while-idle state and the decode floor, and
swaps in a new :class:`Snapshot`. A dead, slow or garbage-spewing backend only flips
``backend_up`` to 0 (and logs the cause once, then at most once a minute); GPU data keeps
flowing. The HTTP app never waits on any of this: it serves the latest snapshot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.backends import Backend, UnknownBackend, detect
from inferwatch.baseline import Baseline
from inferwatch.baseline import series as baseline_series
from inferwatch.derive import QueuedWhileIdle, aggregate_bandwidth, decode_floor, derived
from inferwatch.gpu import GpuSource
from inferwatch.model import BackendSample, CollectorStatus, GpuSample, Snapshot
from inferwatch.textparse import ExpositionError
from inferwatch.upstream import Upstream, UpstreamError

log = logging.getLogger("inferwatch.poller")


@dataclass(frozen=True)
class PollSettings:
    interval: float = 0.5
    idle_threshold: float = 0.1
    model_weights_bytes: float | None = None
    peak_memory_bandwidth: float | None = None
    baseline: Baseline | None = None


class CauseLog:
    """Logs a failure cause once, again when it changes, and at most every ``repeat`` s."""

    def __init__(
        self, what: str, repeat: float = 60.0, clock: Callable[[], float] = time.monotonic
    ):
        self._what = what
        self._repeat = repeat
        self._clock = clock
        self._cause = ""
        self._logged_at = 0.0
        self.failures = 0

    def failed(self, cause: str) -> None:
        now = self._clock()
        self.failures += 1
        if cause != self._cause or now - self._logged_at >= self._repeat:
            if cause == self._cause:
                log.warning("%s still failing (%d polls): %s", self._what, self.failures, cause)
            else:
                log.warning("%s failing: %s", self._what, cause)
            self._cause, self._logged_at = cause, now

    def ok(self) -> None:
        if self._cause:
            log.info("%s recovered after %d failed polls", self._what, self.failures)
        self._cause, self.failures = "", 0


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
        self.backend = backend  # None until --backend auto has recognised the server
        self.gpu = gpu
        self.settings = settings
        self._clock = clock
        self._qwi = QueuedWhileIdle(settings.idle_threshold)
        self._version = ""
        self._model_hint = ""  # the model a server without model labels names elsewhere
        self._info_known = False
        self._bandwidth: float | None = None
        self._backend_log = CauseLog("backend scrape")
        self._gpu_log = CauseLog("GPU collection")
        self.last_poll_at: float | None = None
        self.snapshot = Snapshot(
            backend_kind=backend.name if backend else "unknown",
            backend_up=False,
            backend_scrape_seconds=0.0,
            backend=None,
            collectors={},
        )

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
        collectors = {"backend": backend_status}
        if gpu_task is not None:
            gpus, gpu_status = await gpu_task
            collectors["gpu"] = gpu_status
        now = self._clock()
        bandwidth = aggregate_bandwidth(gpus, self.settings.peak_memory_bandwidth)
        if bandwidth is not None:
            self._bandwidth = bandwidth
        qwi = self._qwi.update(now, sample, gpus or None)
        floor = decode_floor(sample, self.settings.model_weights_bytes, self._bandwidth)
        self.snapshot = Snapshot(
            backend_kind=self.backend.name if self.backend else "unknown",
            backend_up=sample is not None,
            backend_scrape_seconds=backend_status.duration_seconds,
            backend=sample,
            collectors=collectors,
            gpus=gpus,
            derived=derived(qwi, floor),
            baseline=baseline_series(self.settings.baseline, sample)
            if self.settings.baseline is not None and sample is not None
            else {},
        )
        self.last_poll_at = now
        return self.snapshot

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
                log.exception("poll failed")
            next_at += interval
            now = self._clock()
            if next_at < now:
                next_at = now  # fell behind (slow backend): skip the missed ticks
            await asyncio.sleep(next_at - now)

    async def _scrape_backend(self) -> tuple[BackendSample | None, CollectorStatus]:
        started = time.perf_counter()
        try:
            backend = self.backend
            text = await self.upstream.get_exposition(
                backend.metrics_path if backend else "/metrics"
            )
            if backend is None:
                backend = self.backend = detect(text)
                log.info("backend recognised as %s", backend.name)
            if not self._info_known:
                backend.normalize(text)  # a page that is not this server's asks nothing more
                await self._fetch_info(backend)
            sample = backend.normalize(text, self._model_hint)
            sample = dataclasses.replace(sample, version=self._version)
        except (UpstreamError, ExpositionError, UnknownBackend) as exc:
            self._backend_log.failed(str(exc))
            self._info_known = False  # the server may come back as another release or model
            return None, CollectorStatus(False, time.perf_counter() - started, str(exc))
        self._backend_log.ok()
        return sample, CollectorStatus(True, time.perf_counter() - started)

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
            self._gpu_log.failed(status.error)
        return gpus, status
