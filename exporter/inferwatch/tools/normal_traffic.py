"""Normal traffic as the sidecar reads it: what ``inferwatch calibrate`` measures besides the
sweep.

The sidecar's own parts (:class:`EmbeddedSidecar`, as ``serve`` builds them) run under normal
traffic, and each signal is evaluated as ``diagnose`` does
(:class:`~inferwatch.method.local.Window`) over every whole rate window, one reading a
second. Sample of what it returns (``calibration.NormalReadings``)::

    values: {server_cpu_wait_share: (0.31, 0.29, ...), canary_ttft_gap: (0.012, ...), ...}
    absent: {frontend_cpu: "the server's page has no frontend CPU series"}
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from inferwatch.calibration import READ_UNDER_NORMAL_TRAFFIC, NormalReadings
from inferwatch.collect.stream import Client, Sample
from inferwatch.collect.textparse import read_page
from inferwatch.method.local import Samples, Window
from inferwatch.method.spec import Spec
from inferwatch.model import Snapshot
from inferwatch.serve.command import build_poller
from inferwatch.serve.config import ServeConfig
from inferwatch.serve.exposition import Renderer
from inferwatch.serve.sidecar import run_canary
from inferwatch.tools.sweep.prompts import Prompts

# A reading a second: the rules evaluate every few seconds to a minute; finer adds nothing.
READ_EVERY = 1.0
# The collectors whose failure says why a signal has no reading.
_COLLECTOR_OF = {
    "server_cpu_wait_share": "server_cpu",
    "canary_ttft_gap": "canary",
}


class EmbeddedSidecar:
    """The sidecar's poller (backend, NVML, server CPU) and canary, without its HTTP side:
    what ``serve`` would read with ``config``, for calibrate's readings."""

    def __init__(self, config: ServeConfig, spec: Spec) -> None:
        self.config = config
        self.spec = spec
        self.poller = build_poller(config, spec.window_seconds)
        self._renderer = Renderer(lambda: self.poller.snapshot)
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> EmbeddedSidecar:
        self._tasks.append(asyncio.create_task(self.poller.run(), name="calibrate-poller"))
        canary = self.config.canary_settings(gap_window=self.spec.window_seconds)
        if canary is not None:
            self._tasks.append(asyncio.create_task(run_canary(canary, self.poller)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.poller.upstream.close()
        if self.poller.gpu is not None:
            self.poller.gpu.close()

    @property
    def snapshot(self) -> Snapshot:
        return self.poller.snapshot

    def page(self) -> Samples:
        """The page ``/metrics`` would serve now, read as diagnose reads it."""
        return read_page(self._renderer.render().decode())

    async def wait_until_up(self, timeout: float) -> None:
        """Until a poll has read the backend; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.snapshot.backend_up:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sidecar read no page of the server in {timeout:g} s")
            await asyncio.sleep(self.poller.settings.interval)


async def closed_loop(
    client: Client,
    prompts: Prompts,
    shapes: Sequence[tuple[int, int]],
    concurrency: int,
    tag: int,
    stop: asyncio.Event,
) -> list[Sample]:
    """``concurrency`` workers, each sending its next request when its last one ends, over
    the shapes (prompt, output tokens) in turn, until ``stop``; the samples, in order."""
    samples: list[Sample] = []
    counter = itertools.count()

    async def worker() -> None:
        while not stop.is_set():
            index = next(counter)
            prompt_tokens, output_tokens = shapes[index % len(shapes)]
            prompt = prompts.for_request(tag, index, prompt_tokens)
            samples.append(await client.stream(prompt, output_tokens))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def read_normal(
    sidecar: EmbeddedSidecar,
    windows: int,
    traffic: Callable[[asyncio.Event], Awaitable[object]] | None,
    note: Callable[[str], None],
) -> NormalReadings:
    """Every signal of :data:`READ_UNDER_NORMAL_TRAFFIC` over each whole rate window of
    ``windows`` windows of normal traffic (after one window for it to fill), one reading a
    second. ``traffic`` sends it until its event is set (None: the server's own traffic)."""
    spec = sidecar.spec
    window = spec.window_seconds
    stop = asyncio.Event()
    load = asyncio.create_task(traffic(stop)) if traffic is not None else None
    pages: deque[tuple[float, Samples]] = deque()
    values: dict[str, list[float]] = {signal: [] for _, signal, _ in READ_UNDER_NORMAL_TRAFFIC}
    started = time.monotonic()
    end = started + (1 + windows) * window
    note(f"reading {windows} rate windows of {window:g} s of normal traffic, after one to fill")
    try:
        while (now := time.monotonic()) < end:
            pages.append((now, sidecar.page()))
            while len(pages) > 1 and now - pages[1][0] >= window:
                pages.popleft()  # the first page is the latest one a whole window old
            then, first = pages[0]
            if now - then >= window * 0.99:
                reading = Window(first, pages[-1][1], now - then, spec)
                for signal, found in values.items():
                    value = reading.signal(signal)
                    if value is not None:
                        found.append(value)
            await asyncio.sleep(READ_EVERY)
    finally:
        stop.set()
        if load is not None:
            await load
    absent = {s: _why_absent(sidecar.snapshot, s) for s, found in values.items() if not found}
    return NormalReadings(
        {s: tuple(v) for s, v in values.items() if v}, time.monotonic() - started, absent
    )


def _why_absent(snapshot: Snapshot, signal: str) -> str:
    """Why the sidecar read nothing for ``signal`` under normal traffic."""
    status = snapshot.collectors.get(_COLLECTOR_OF.get(signal, "backend"))
    if status is not None and not status.success and status.error:
        return f"the sidecar could not read it: {status.error}"
    if signal == "canary_ttft_gap" and "canary" not in snapshot.sources:
        return "no canary ran (the config's canary: off)"
    return "the sidecar's page had no series for it under normal traffic"
