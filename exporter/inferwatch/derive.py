"""Signals derived from backend and GPU samples together, integrated at poll resolution.

*Queued while idle* is the sharpest symptom of a scheduling or CPU problem: requests wait
while the accelerator sits idle. At each poll, for each model:

- queued: the backend reports ``requests_waiting > 0``;
- idle: with NVML, every GPU was busy less than ``idle_threshold`` of the poll interval;
  without NVML, the engine made no progress (``engine_steps`` unchanged for every engine
  that has requests waiting).

When both hold, the interval since the previous poll is added to
``inferwatch_queued_while_idle_seconds_total``; with NVML a stall is therefore counted by the
next poll. Judged from engine progress, a stall counts once it has lasted longer than
:data:`ENGINE_STALL_MIN` (one long scheduler step is not a stall), and then from its start.
Busy time (the queue draining while the GPU works) is never counted.

A queue gauge can be stale: SGLang refreshes its gauges only every few dozen engine steps
(and, once idle, every 30 s), so after a burst it may show waiting requests for half a
minute while nothing waits. Where the backend also counts its own idle time
(``scheduler_idle_seconds``: time with nothing running *or queued*), an engine whose idle
counter grew within the last :data:`IDLE_REPORT_WINDOW` seconds had an empty queue in that
time, and its queue gauge is not believed. Since that report comes up to a second late, a
stall on such a backend counts only once it has lasted longer than the window without one,
and is then counted from its start: the gauge and the counter lag the stall by ~2 s, and
a burst's stale queue gauge never counts.

The *decode floor* is the hardware limit of per-token decode latency: every decode step
reads all model weights once, so it cannot be faster than weight bytes / aggregate peak
memory bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from inferwatch.model import BackendSample, Derived, GpuSample, Labels

# SGLang adds to its idle counter at most once a second (a scheduler loop that finds
# nothing to do reports the idle time since its last report); two seconds cover one report
# however the polls fall.
IDLE_REPORT_WINDOW = 2.0

# Judged from engine progress alone, a stall must last longer than this before it counts
# (from its start): one scheduler step of a large model over a big prefill chunk can outlast
# a poll.
ENGINE_STALL_MIN = 1.0


def _model_labels(sample: BackendSample) -> Labels:
    return (("backend", sample.backend), ("model", sample.model))


@dataclass
class QueuedWhileIdle:
    """Integrates queued-while-idle seconds over successive polls."""

    idle_threshold: float = 0.1
    _previous: BackendSample | None = None
    _previous_at: float | None = None
    _seconds: dict[Labels, float] = field(default_factory=dict)
    _state: dict[Labels, bool] = field(default_factory=dict)
    _idle_reported_at: dict[Labels, float] = field(default_factory=dict)
    _stall_since: dict[Labels, float] = field(default_factory=dict)

    def update(
        self, now: float, sample: BackendSample | None, gpus: Sequence[GpuSample] | None
    ) -> tuple[dict[Labels, bool], dict[Labels, float]]:
        """Fold in one poll; ``gpus`` is None when there is no NVML data this poll.

        Returns the current state and the integrated seconds per (backend, model).
        """
        if sample is None:
            # Backend down: the queue is unknown, so nothing is counted; keep the totals.
            self._previous, self._previous_at = None, None
            self._state = dict.fromkeys(self._state, False)
            self._idle_reported_at.clear()
            self._stall_since.clear()
            return dict(self._state), dict(self._seconds)
        key = _model_labels(sample)
        self._seconds.setdefault(key, 0.0)
        previous, previous_at = self._previous, self._previous_at
        if previous is not None:
            self._note_idle_reports(now, sample, previous)
        waiting = sample.signals.get("requests_waiting") or {}
        queued = [
            labels
            for labels, count in waiting.items()
            if count > 0
            and now - self._idle_reported_at.get(labels, -math.inf) > IDLE_REPORT_WINDOW
        ]
        stalled = active = False
        if queued and previous is not None and previous_at is not None:
            gpu_idle = self._gpus_idle(gpus) if gpus else None
            idle = gpu_idle
            if idle is None:
                idle = self._engine_stalled(sample, previous, queued)
            stalled = bool(idle)
            if stalled:
                since = self._stall_since.setdefault(key, previous_at)
                # Without a GPU verdict, no step between two polls may be one long step (a big
                # prefill chunk): it counts once it has lasted ENGINE_STALL_MIN, from its start.
                # A backend that reports its idle time gets the time to report it: a report in
                # the meantime proves the queue gauge stale and ends the stall uncounted.
                wait = ENGINE_STALL_MIN if gpu_idle is None else 0.0
                if sample.signals.get("scheduler_idle_seconds"):
                    wait = max(wait, IDLE_REPORT_WINDOW)
                active = now - since > wait
                if active:
                    self._seconds[key] += now - (previous_at if self._state.get(key) else since)
        if not stalled:
            self._stall_since.pop(key, None)
        self._state[key] = active
        self._previous, self._previous_at = sample, now
        return dict(self._state), dict(self._seconds)

    def _gpus_idle(self, gpus: Sequence[GpuSample]) -> bool | None:
        ratios = [g.busy_ratio if g.busy_ratio is not None else g.utilization_ratio for g in gpus]
        known = [r for r in ratios if r is not None]
        if not known:
            return None
        return max(known) < self.idle_threshold

    def _note_idle_reports(
        self, now: float, sample: BackendSample, previous: BackendSample
    ) -> None:
        """Remember when each engine's own idle counter last grew."""
        idle = sample.signals.get("scheduler_idle_seconds")
        before = previous.signals.get("scheduler_idle_seconds")
        if not idle or not before:
            return
        for labels, seconds in idle.items():
            if labels in before and seconds > before[labels]:
                self._idle_reported_at[labels] = now

    @staticmethod
    def _engine_stalled(
        sample: BackendSample, previous: BackendSample, queued: list[Labels]
    ) -> bool | None:
        """True when an engine with waiting requests made no step since the last poll."""
        steps = sample.signals.get("engine_steps")
        before = previous.signals.get("engine_steps")
        if steps is None or before is None:
            return None
        return any(
            labels in steps and labels in before and steps[labels] == before[labels]
            for labels in queued
        )


def decode_floor(
    sample: BackendSample | None, weight_bytes: float | None, bandwidth: float | None
) -> dict[Labels, float]:
    """Weight bytes / aggregate peak bandwidth, labelled with the backend's model."""
    if sample is None or not weight_bytes or not bandwidth:
        return {}
    return {_model_labels(sample): weight_bytes / bandwidth}


def aggregate_bandwidth(gpus: Sequence[GpuSample], override: float | None) -> float | None:
    """The configured peak bandwidth, else the sum over the GPUs NVML reports."""
    if override:
        return override
    peaks = [g.memory_bandwidth_peak_bytes_per_second for g in gpus]
    if not peaks or any(p is None for p in peaks):
        return None
    return float(sum(p for p in peaks if p is not None))


def weights_bytes_in(directory: Path) -> int:
    """Total size of the ``*.safetensors`` files of a model directory."""
    if not directory.is_dir():
        raise ValueError(f"--model-path {directory}: not a directory")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"--model-path {directory}: no *.safetensors files")
    return sum(f.stat().st_size for f in files)


def derived(
    qwi: tuple[dict[Labels, bool], dict[Labels, float]], floor: dict[Labels, float]
) -> Derived:
    state, seconds = qwi
    return Derived(
        queued_while_idle=MappingProxyType(state),
        queued_while_idle_seconds_total=MappingProxyType(seconds),
        decode_floor_seconds=MappingProxyType(floor),
    )
