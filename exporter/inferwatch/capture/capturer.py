"""When to capture, and one capture from trigger to archive.

Triggers: a cause alert of ``--capture-on`` whose condition has held on the verdict for the
alert's ``for`` (once per spell), or a request (``POST /capture``, ``inferwatch capture``).
Safe by default: one capture at a time, ``--capture-min-interval`` between the starts of
two, a bounded duration and a bounded store; a capture runs on its own task and its own
HTTP connections, so polls and ``/metrics`` never wait for it.

Each trigger is counted in ``inferwatch_captures_total{trigger,result}``: ``ok`` (every
kind of evidence that was possible came), ``partial`` (some failed), ``failed`` (no archive),
or the refusals ``busy`` and ``too_soon`` (once per spell for an alert).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from inferwatch import __version__
from inferwatch.capture import evidence, redact, stacks, trace
from inferwatch.capture.evidence import FAILED, OK, Part
from inferwatch.capture.store import Archive, CaptureStore, OverBound, Workdir
from inferwatch.collect.poller import Poller
from inferwatch.collect.processes import server_pid
from inferwatch.collect.upstream import Upstream
from inferwatch.method.alerts import ALERTS
from inferwatch.method.findings import Finding
from inferwatch.method.spec import Spec, seconds
from inferwatch.model import BackendSample, Sink
from inferwatch.urls import redact_url

log = logging.getLogger(__name__)

MANUAL = "manual"
# Stop calls may take long: the server writes its trace inside them.
STOP_TIMEOUT = 120.0


@dataclass(frozen=True)
class CaptureSample:
    """Evidence captures so far (``serve --capture-dir``): triggers by (trigger, result),
    and the wall-clock time the last capture was complete (None: none yet)."""

    counts: Mapping[tuple[str, str], float]
    last_timestamp: float | None = None
    problem: str = ""

    def write(self, sink: Sink, backend: str) -> None:
        """``inferwatch_captures_total{trigger="InferenceQueuedWhileIdle",result="ok"} 1.0``
        and the time the last one was complete."""
        counts = {(("trigger", t), ("result", r)): n for (t, r), n in self.counts.items()}
        sink.scalars("captures", counts)
        if self.last_timestamp is not None:
            sink.scalars("last_capture_timestamp_seconds", {(): self.last_timestamp})


@dataclass(frozen=True)
class CaptureSettings:
    directory: Path
    on: tuple[str, ...] = ()  # cause alerts that trigger a capture
    seconds: float = 10.0  # profiler and stack sampling duration
    min_interval: float = 600.0
    max_bytes: int = 1024**3
    profiler_dir: Path | None = None
    profiler_steps: int = 100  # engine steps profiled at most (where the server bounds them)
    pid: int | None = None  # the server's process (default: the one on the backend's port)


class Judged(Protocol):
    """A verdict, as far as the triggers read it: the findings that hold now."""

    @property
    def findings(self) -> Sequence[Finding]: ...


@dataclass(frozen=True)
class Decision:
    started: bool
    result: str  # "started", "busy", "too_soon"
    message: str
    id: str = ""


class Capturer:
    """Captures evidence for one exporter; see the module doc.

    It knows the rest of the sidecar through what it is given: the poller (the server's
    identity and the latest snapshot), ``verdict_document`` (the verdict as ``/verdict.json``
    serves it) and ``sidecar_page`` (the exporter's ``/metrics`` page of the latest poll).
    It hears each new verdict through :meth:`observe` and is read by each poll through
    :meth:`sample`.
    """

    def __init__(
        self,
        settings: CaptureSettings,
        poller: Poller,
        verdict_document: Callable[[], Mapping[str, Any]],
        sidecar_page: Callable[[], bytes],
        spec: Spec,
        upstream: Upstream,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = CaptureStore(settings.directory, settings.max_bytes)
        self.poller = poller
        self.verdict_document = verdict_document
        self.sidecar_page = sidecar_page
        self.spec = spec
        self.upstream = upstream  # its own session: a slow stop call never delays a poll
        self._clock, self._wall = clock, wall
        self._for = {a.name: seconds(spec.timing.for_alert(a)) for a in ALERTS.values()}
        self.counts: Counter[tuple[str, str]] = Counter()
        self.last_started: float | None = None  # clock
        self.last_finished_wall: float | None = None
        self.last: dict[str, Any] | None = None  # the last capture's manifest
        self._task: asyncio.Task[None] | None = None
        self._held_since: dict[str, float] = {}  # alert -> clock of the spell's first verdict
        self._spell_done: set[str] = set()  # alerts whose current spell was acted on

    # --- triggers ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def seconds_until_allowed(self) -> float:
        if self.last_started is None:
            return 0.0
        return max(0.0, self.settings.min_interval - (self._clock() - self.last_started))

    def request(self, trigger: str = MANUAL, duration: float | None = None) -> Decision:
        """Start a capture now unless one runs or the last started too recently."""
        now = self._clock()
        if self.running:
            decision = Decision(False, "busy", "a capture is running; one at a time")
        elif wait := self.seconds_until_allowed():
            assert self.last_started is not None
            decision = Decision(
                False,
                "too_soon",
                f"the last capture started {now - self.last_started:.0f} s ago; the minimum "
                f"interval is {self.settings.min_interval:g} s (next in {wait:.0f} s)",
            )
        else:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._wall()))
            stem = f"capture-{stamp}-{trigger}"
            seconds_ = min(duration or self.settings.seconds, self.settings.seconds)
            self.last_started = now
            self._task = asyncio.create_task(
                self._capture(stem, trigger, seconds_, dict(self.verdict_document())),
                name="inferwatch-capture",
            )
            return Decision(True, "started", f"capturing {seconds_:g} s as {stem}", stem)
        self.counts[(trigger, decision.result)] += 1
        return decision

    def observe(self, verdict: Judged) -> None:
        """A new verdict: start a capture for a watched cause held for its ``for``."""
        now = self._clock()
        held = {f.alert.name for f in verdict.findings} & set(self.settings.on)
        for name in list(self._held_since):
            if name not in held:  # the spell ended
                del self._held_since[name]
                self._spell_done.discard(name)
        for name in sorted(held):
            since = self._held_since.setdefault(name, now)
            if name in self._spell_done or now - since < self._for[name]:
                continue
            decision = self.request(name)
            self._spell_done.add(name)  # one capture (or one counted refusal) per spell
            log.info("%s held for %.0f s: %s", name, now - since, decision.message)

    # --- one capture ------------------------------------------------------------------

    async def _capture(self, stem: str, trigger: str, duration: float, at_trigger: dict) -> None:
        started, started_wall = self._clock(), self._wall()
        try:
            manifest = await self._gather(stem, trigger, duration, at_trigger, started_wall)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a full disk: counted, logged, never raised
            log.exception("capture %s failed", stem)
            self.counts[(trigger, FAILED)] += 1
            self.last = {"name": stem, "trigger": trigger, "result": FAILED, "error": str(exc)}
            return
        result = manifest["result"]
        self.counts[(trigger, result)] += 1
        self.last = manifest
        self.last_finished_wall = self._wall()
        log.info(
            "capture %s: %s in %.1f s, %.1f MiB (%s)",
            manifest["archive"],
            result,
            self._clock() - started,
            manifest["archive_bytes"] / 2**20,
            ", ".join(f"{p['name']}: {p['result']}" for p in manifest["parts"]),
        )

    async def _gather(
        self, stem: str, trigger: str, duration: float, at_trigger: dict, started_wall: float
    ) -> dict[str, Any]:
        s, poller = self.settings, self.poller
        work = await asyncio.to_thread(self.store.workdir)
        try:
            parts = [
                await asyncio.to_thread(evidence.write, work, "verdict.json", _json(at_trigger))
            ]
            parts += await self._pages(work, "before")
            backend = poller.backend
            pid, why_not = (
                (s.pid, "") if s.pid else await asyncio.to_thread(server_pid, poller.metrics_url())
            )
            profiled, sampled = await asyncio.gather(
                trace.profile(
                    self.upstream,
                    backend.profiler if backend is not None else None,
                    s.profiler_dir,
                    duration,
                    work,
                    prefix=stem,
                    steps=s.profiler_steps,
                    server_pid=pid,
                ),
                stacks.stacks(pid, why_not, duration, work),
            )
            parts += [profiled, *sampled]
            parts += await self._pages(work, "after")
            snap = poller.snapshot
            manifest = {
                "name": stem,
                "trigger": trigger,
                "started": started_wall,
                "finished": self._wall(),
                "seconds": duration,
                "pod": os.environ.get("POD_NAME") or socket.gethostname(),
                "inferwatch_version": __version__,
                "backend": snap.backend_kind,
                "backend_version": snap.backend.version if snap.backend else "",
                "backend_url": redact_url(poller.metrics_url()),
                "server_pid": pid,
                "result": OK if all(p.result != FAILED for p in parts) else "partial",
                "redaction": redact.RULES,
                "parts": [p.as_dict() for p in parts],
            }
            written = await asyncio.to_thread(
                evidence.write, work, "manifest.json", _json(manifest)
            )
            if written.result != OK:
                raise OverBound(f"manifest.json: {written.detail}")
        except BaseException:
            await asyncio.to_thread(work.remove)
            raise
        archive: Archive = await asyncio.to_thread(self.store.pack, work, stem)
        return {**manifest, "archive": archive.name, "archive_bytes": archive.bytes}

    async def _pages(self, work: Workdir, when: str) -> list[Part]:
        """The server's page (read now) and the exporter's (the latest poll's)."""
        backend = self.poller.backend
        path = backend.metrics_path if backend is not None else "/metrics"
        server = await evidence.server_page(self.upstream, path, work, f"server-metrics-{when}.txt")
        page = await asyncio.to_thread(self.sidecar_page)
        own = await asyncio.to_thread(evidence.write, work, f"inferwatch-metrics-{when}.txt", page)
        return [server, own]

    # --- what the exporter shows ------------------------------------------------------

    def sample(self, now: float, server: BackendSample | None) -> CaptureSample:
        """The counts so far, for the snapshot of a poll (a :class:`~inferwatch.collect.
        poller.Source`)."""
        return CaptureSample(dict(self.counts), self.last_finished_wall)

    async def close(self) -> None:
        if self._task is not None and self.running:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.upstream.close()


def _json(doc: Any) -> bytes:
    return json.dumps(doc, indent=2, sort_keys=True).encode()


def capture_upstream(backend_url: str, headers: dict[str, str], max_bytes: int) -> Upstream:
    """The capture's own connection to the server: the profiler's stop call waits for the
    trace to be written."""
    return Upstream(backend_url, timeout=STOP_TIMEOUT, max_bytes=max_bytes, headers=headers)
