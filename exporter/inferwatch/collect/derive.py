"""Signals derived from backend and GPU samples together, per engine (one scheduler and its
queue: ``model``, plus ``engine`` on a data-parallel server), at poll resolution::

    inferwatch_queued_while_idle{backend="vllm",model="tiny",engine="0"} 1.0
    inferwatch_queued_while_idle_seconds_total{backend="vllm",model="tiny",engine="0"} 12.5
    inferwatch_decode_floor_seconds{backend="vllm",model="tiny",engine="0"} 0.0021

*Queued while idle*: requests wait while each of the engine's GPUs (:class:`EngineLayout`)
is busy under ``idle_threshold`` or, without NVML or a known layout, while the engine makes
no step for longer than its own long steps (:mod:`inferwatch.collect.steps`); a stall then
counts from its start. A queue gauge that the backend's own idle counter
(``scheduler_idle_seconds``) contradicts is not believed.

The *decode floor*: a decode step reads all the weights, so it takes at least weight bytes /
the peak memory bandwidth of the engine's tensor-parallel GPUs (each data-parallel engine
reads its own copy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from inferwatch.collect.steps import StepRecord
from inferwatch.model import BackendSample, Derived, GpuSample, Labels

# SGLang refreshes its queue gauge only every few dozen steps (once idle, every 30 s), so
# after a burst it may show requests for half a minute while nothing waits. It adds to its
# idle counter (time with nothing running or queued) at most once a second (a loop that finds
# nothing to do reports the idle time since its last report); two seconds cover one report
# however the polls fall.
IDLE_REPORT_WINDOW = 2.0


def engines(sample: BackendSample) -> list[Labels]:
    """The engines of a page: the label sets of its queue series (the page's model if none)."""
    waiting = sample.values.get("requests_waiting")
    return list(waiting) if waiting else [(("model", sample.model),)]


def _series_key(sample: BackendSample, engine: Labels) -> Labels:
    return (("backend", sample.backend), *engine)


def _engine(unit: Labels) -> str:
    return dict(unit).get("engine", "")


def _numeric_first(value: str) -> tuple[int, int | str]:
    return (0, int(value)) if value.isdigit() else (1, value)


class EngineLayout:
    """Which of the GPUs NVML sees each engine of the server runs on.

    The k-th distinct ``engine`` label (in numeric order; a page without the label has one
    engine) uses GPUs [k*N, (k+1)*N) for a tensor-parallel size N: the one given, else the
    GPUs seen divided by the engines when they divide evenly, as vLLM and SGLang place their
    data-parallel ranks. GPUs are remembered across polls (with their peak bandwidth, a static
    fact), so a GPU that fails one poll does not shift the layout.
    """

    def __init__(self, tensor_parallel_size: int | None = None) -> None:
        self.tensor_parallel_size = tensor_parallel_size
        self._peaks: dict[int, float | None] = {}

    def gpus_of(self, units: Sequence[Labels], gpus: Sequence[GpuSample]) -> dict[Labels, range]:
        """GPU indices of each engine (label set in ``units``) whose GPUs are known."""
        for gpu in gpus:
            self._peaks[gpu.index] = gpu.memory_bandwidth_peak_bytes_per_second
        count = len(self._peaks)
        if not count:
            return {}
        order = sorted({_engine(unit) for unit in units}, key=_numeric_first)
        size = self.tensor_parallel_size
        if size is None and count and count % len(order) == 0:
            size = count // len(order)
        if size is None:
            return {}
        position = {engine: k for k, engine in enumerate(order)}
        groups = {}
        for unit in units:
            k = position[_engine(unit)]
            if (k + 1) * size <= count:
                groups[unit] = range(k * size, (k + 1) * size)
        return groups

    def peak_bandwidth(self, indices: range) -> float | None:
        """Summed peak memory bandwidth of these GPUs; None if any is unknown."""
        peaks = [self._peaks.get(i) for i in indices]
        if any(p is None for p in peaks):
            return None
        return math.fsum(p for p in peaks if p is not None)


@dataclass
class QueuedWhileIdle:
    """Integrates queued-while-idle seconds per engine over successive polls."""

    idle_threshold: float = 0.1
    layout: EngineLayout = field(default_factory=EngineLayout)
    steps: StepRecord = field(default_factory=StepRecord)
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

        Returns the current state and the integrated seconds per engine, keyed by
        ``backend``, ``model`` and, on a data-parallel server, ``engine``.
        """
        if sample is None:
            # Backend down: the queue is unknown, so nothing is counted; keep the totals.
            self._previous, self._previous_at = None, None
            self._state = dict.fromkeys(self._state, False)
            self._idle_reported_at.clear()
            self._stall_since.clear()
            return dict(self._state), dict(self._seconds)
        previous, previous_at = self._previous, self._previous_at
        if previous is not None:
            self._note_idle_reports(now, sample, previous)
        units = engines(sample)
        gpus_of = self.layout.gpus_of(units, gpus or ())
        state: dict[Labels, bool] = {}
        for unit in units:
            key = _series_key(sample, unit)
            self._seconds.setdefault(key, 0.0)
            stepped = _stepped(sample, previous, unit)
            self.steps.observe(now, key, stepped, _working(sample, unit))
            state[key] = (
                previous is not None
                and previous_at is not None
                and self._judge(now, key, unit, sample, stepped, previous_at, gpus, gpus_of)
            )
        # The series of an engine or model the page no longer shows go. Totals, stalls and
        # steps are only ever kept for a poll's engines: they change only with the engines.
        # An idle report may name series of no engine: those go at every poll.
        if state.keys() != self._state.keys():
            self._seconds = {k: v for k, v in self._seconds.items() if k in state}
            self._stall_since = {k: v for k, v in self._stall_since.items() if k in state}
            self.steps.keep(set(state))
        if self._idle_reported_at:
            self._idle_reported_at = {k: v for k, v in self._idle_reported_at.items() if k in state}
        self._state = state
        self._previous, self._previous_at = sample, now
        return dict(state), dict(self._seconds)

    def _judge(
        self,
        now: float,
        key: Labels,
        unit: Labels,
        sample: BackendSample,
        stepped: bool | None,
        previous_at: float,
        gpus: Sequence[GpuSample] | None,
        gpus_of: Mapping[Labels, range],
    ) -> bool:
        """Whether engine ``unit`` is queued while idle now; adds the time to its total.
        ``stepped``: whether it made a step since the previous poll (None: it cannot tell)."""
        waiting = (sample.values.get("requests_waiting") or {}).get(unit, 0.0)
        believed = now - self._idle_reported_at.get(key, -math.inf) > IDLE_REPORT_WINDOW
        gpu_idle = self._gpus_idle(gpus, gpus_of.get(unit))
        idle = gpu_idle if gpu_idle is not None else stepped is False
        if not (waiting > 0 and believed and idle):
            self._stall_since.pop(key, None)
            return False
        since = self._stall_since.setdefault(key, previous_at)
        # Without a GPU verdict, no step between two polls may be one long step (a big
        # prefill chunk): it counts once it has outlasted the engine's long steps, from its
        # start.
        # A backend that reports its idle time gets the time to report it: a report in
        # the meantime proves the queue gauge stale and ends the stall uncounted.
        wait = self.steps.stall_min(now, key) if gpu_idle is None else 0.0
        if sample.values.get("scheduler_idle_seconds"):
            wait = max(wait, IDLE_REPORT_WINDOW)
        if now - since <= wait:
            return False
        self._seconds[key] += now - (previous_at if self._state.get(key) else since)
        return True

    def _gpus_idle(self, gpus: Sequence[GpuSample] | None, indices: range | None) -> bool | None:
        """Every GPU of an engine busy under the threshold; None if none can tell."""
        if not gpus or indices is None:
            return None
        ratios = [
            g.busy_ratio if g.busy_ratio is not None else g.utilization_ratio
            for g in gpus
            if g.index in indices
        ]
        known = [r for r in ratios if r is not None]
        if not known:
            return None
        return max(known) < self.idle_threshold

    def _note_idle_reports(
        self, now: float, sample: BackendSample, previous: BackendSample
    ) -> None:
        """Remember when each engine's own idle counter last grew."""
        idle = sample.values.get("scheduler_idle_seconds")
        before = previous.values.get("scheduler_idle_seconds")
        if not idle or not before:
            return
        for labels, seconds in idle.items():
            if labels in before and seconds > before[labels]:
                self._idle_reported_at[_series_key(sample, labels)] = now


def _stepped(sample: BackendSample, previous: BackendSample | None, unit: Labels) -> bool | None:
    """Whether engine ``unit`` made a step since the last poll; None if it cannot tell."""
    steps = sample.values.get("engine_steps") or {}
    before = (previous.values.get("engine_steps") or {}) if previous else {}
    if unit not in steps or unit not in before:
        return None
    return steps[unit] != before[unit]


def _working(sample: BackendSample, unit: Labels) -> bool:
    """Whether engine ``unit`` has requests running or waiting."""
    return any(
        (sample.values.get(name) or {}).get(unit, 0.0) > 0
        for name in ("requests_running", "requests_waiting")
    )


def decode_floor(
    sample: BackendSample | None,
    gpus: Sequence[GpuSample],
    layout: EngineLayout,
    weight_bytes: float | None,
    bandwidth: float | None,
) -> dict[Labels, float]:
    """Weight bytes / peak bandwidth of each engine's GPUs, or of ``bandwidth`` when given.

    An engine whose GPUs are unknown (see :class:`EngineLayout`) gets no floor: absent
    rather than a floor computed over GPUs it does not read from.
    """
    if sample is None or not weight_bytes:
        return {}
    units = engines(sample)
    if bandwidth:
        per_engine: dict[Labels, float | None] = dict.fromkeys(units, bandwidth)
    else:
        per_engine = {
            unit: layout.peak_bandwidth(group)
            for unit, group in layout.gpus_of(units, gpus).items()
        }
    return {_series_key(sample, u): weight_bytes / b for u, b in per_engine.items() if b}


def derived(
    queued_while_idle: tuple[dict[Labels, bool], dict[Labels, float]],
    floor: dict[Labels, float],
    latency_window: Mapping[str, Mapping[Labels, float]],
) -> Derived:
    """The poll's derived signals; ``latency_window`` read-only already (the window's
    quantiles are computed when first read: :class:`~inferwatch.collect.window.Quantiles`)."""
    state, seconds = queued_while_idle
    return Derived(
        queued_while_idle=MappingProxyType(state),
        queued_while_idle_seconds_total=MappingProxyType(seconds),
        decode_floor_seconds=MappingProxyType(floor),
        latency_window=latency_window,
    )


def weights_bytes_in(directory: Path) -> int:
    """Total size of the ``*.safetensors`` files of a model directory."""
    if not directory.is_dir():
        raise ValueError(f"--model-path {directory}: not a directory")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"--model-path {directory}: no *.safetensors files")
    return sum(f.stat().st_size for f in files)
