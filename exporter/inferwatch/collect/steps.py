"""How long an engine's own steps take, to tell a long step from a stall without NVML.

An engine that made no step since the last poll may be stalled, or busy with one long step (a
big prefill batch, recomputing preempted requests). Every stretch without progress while it
had work that ended with progress and outlasted :data:`STEP_FLOOR` is remembered for
:data:`STEP_MEMORY` seconds; a stall is a stretch longer than :data:`STEP_MARGIN` x the longer
of ``--engine-step-seconds`` and the :data:`RECURRENCE`-th longest remembered stretch. The
rank, not the longest: a load's long steps recur, a stall is one stretch and never raises the
bar for the next.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inferwatch.model import Labels

# No stretch shorter than this is a stall: one scheduler step of a large model over a big
# prefill chunk can outlast a poll.
STEP_FLOOR = 1.0
# A stall outlasts this multiple of the engine's long steps.
STEP_MARGIN = 2.0
# The rank of the remembered stretch the bar is set from.
RECURRENCE = 3
# The longest step assumed where the operator says none (--engine-step-seconds): a stall
# then outlasts the floor.
DEFAULT_KNOWN_STEP = STEP_FLOOR / STEP_MARGIN
# Seconds a long step is remembered, and at most how many per engine.
STEP_MEMORY = 600.0
REMEMBERED = 32


@dataclass
class StepRecord:
    """Per engine: the long steps it completed recently, and the stretch in progress;
    ``known_step``: the longest step the operator says the engine takes."""

    known_step: float = DEFAULT_KNOWN_STEP
    _progress_at: dict[Labels, float] = field(default_factory=dict)
    _worked: dict[Labels, bool] = field(default_factory=dict)
    _long: dict[Labels, deque[tuple[float, float]]] = field(default_factory=dict)

    def observe(self, now: float, key: Labels, stepped: bool | None, working: bool) -> None:
        """One poll of engine ``key``: whether it stepped since the last (None: cannot
        tell) and whether it has requests running or waiting now."""
        if stepped is None or key not in self._progress_at:
            self._progress_at[key], self._worked[key] = now, working
            return
        if not stepped:
            self._worked[key] = self._worked[key] and working
            return
        stretch = now - self._progress_at[key]
        if self._worked[key] and stretch > STEP_FLOOR:
            self._long.setdefault(key, deque(maxlen=REMEMBERED)).append((now, stretch))
        self._progress_at[key], self._worked[key] = now, working

    def stall_min(self, now: float, key: Labels) -> float:
        """Seconds without progress after which engine ``key`` counts as stalled."""
        recent = sorted(
            (s for at, s in self._long.get(key, ()) if now - at <= STEP_MEMORY), reverse=True
        )
        learned = recent[RECURRENCE - 1] if len(recent) >= RECURRENCE else 0.0
        longest = max(self.known_step, learned)
        return max(STEP_FLOOR, STEP_MARGIN * longest)

    def keep(self, keys: set[Labels]) -> None:
        """Forget the engines the page no longer shows."""
        for record in (self._progress_at, self._worked, self._long):
            for key in [k for k in record if k not in keys]:
                del record[key]
