"""Capacity: how much load the service carries while meeting its objectives, as measured.

``inferwatch baseline --search`` finds it (:mod:`inferwatch.tools.sweep.search`) and writes
it into the baseline file's ``capacity:`` section, one entry per measured prompt/output
shape; the file's ``metadata`` says what it was measured on (model, server version, GPU,
date, seed, the goodput objectives)::

    capacity:
    - prompt_tokens: 128
      output_tokens: 64
      requests_per_second: 4.5     # the highest rate measured whose goodput met the target
      concurrency: 3.2             # mean requests in flight at that rate (Little's law)
      goodput_share: 0.969         # the share of good requests at that rate
      target_share: 0.95
      arrivals: poisson            # or constant; seeded by the metadata's seed
      tolerance: 0.1               # the search stopped once good and bad rates were this close
      ended: converged             # or: step limit, time limit, no good rate
      knee_requests_per_second: 4.0    # optional: where latency starts to outgrow the load
      steps:                       # every rate measured, in order: the latency-vs-load curve
      - {rate: 1.0, requests: 16, requests_per_second: 0.97, goodput_share: 1.0,
         concurrency: 0.6, ttft_p95: 0.05, itl_p95: 0.02, e2e_p95: 0.9}

``serve --baseline FILE`` exposes the capacity at the live shape (:func:`at_shape`); the
rules divide the live request rate by it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from inferwatch.settings import check_fields, non_negative_int, non_negative_number

ARRIVALS = ("poisson", "constant")
ENDINGS = ("converged", "step limit", "time limit", "no good rate")
# The most a measured capacity is scaled for a live output length (either way): past it the
# live requests are another workload and the measurement says little about them.
MAX_SCALE = 4.0


@dataclass(frozen=True)
class Step:
    """One rate the search measured."""

    rate: float  # offered requests/s
    requests: int
    requests_per_second: float  # finished without error, over the step's wall time
    goodput_share: float
    concurrency: float  # mean requests in flight
    ttft_p95: float
    itl_p95: float
    e2e_p95: float


@dataclass(frozen=True)
class Capacity:
    """The capacity measured at one prompt/output shape."""

    prompt_tokens: int
    output_tokens: int
    requests_per_second: float | None  # None: not even the lowest rate measured met the target
    concurrency: float | None
    goodput_share: float | None
    target_share: float
    arrivals: str
    tolerance: float
    ended: str
    steps: tuple[Step, ...] = field(default_factory=tuple)
    knee_requests_per_second: float | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.prompt_tokens, self.output_tokens)

    def share(self, replicas: int) -> Capacity:
        """One of ``replicas`` like replicas' share of a capacity measured through their
        router: its rates and requests in flight over ``replicas``."""
        if replicas == 1:
            return self
        steps = tuple(
            replace(
                s,
                rate=per(s.rate, replicas),
                requests_per_second=per(s.requests_per_second, replicas),
                concurrency=per(s.concurrency, replicas),
            )
            for s in self.steps
        )
        return replace(
            self,
            requests_per_second=per(self.requests_per_second, replicas),
            concurrency=per(self.concurrency, replicas),
            knee_requests_per_second=per(self.knee_requests_per_second, replicas),
            steps=steps,
        )


def per(value: float | None, replicas: int) -> float | None:
    """One replica's share of a rate (or a count in flight) measured over ``replicas``."""
    return None if value is None else round(value / replicas, 6)


def at_shape(
    capacities: Sequence[Capacity], prompt_tokens: float | None, output_tokens: float | None
) -> tuple[Capacity, float] | None:
    """The capacity for live requests of these mean lengths (None: not known yet): the
    measured shape nearest them, and its rate scaled to the live output length.

    Nearest: the smallest sum of the log ratios of prompt and output length (a shape twice
    as long is as far as one half as long). Scaled by measured / live output tokens: this
    assumes decode bounds the service, each request holding a place in the batch for as
    many steps as it generates, and prompts cost little next to that; the factor is bounded
    to :data:`MAX_SCALE` either way. Without live lengths: the lowest measured capacity,
    unscaled. None when no shape has a capacity."""
    known = [c for c in capacities if c.requests_per_second]
    if not known:
        return None
    if not prompt_tokens or not output_tokens:
        lowest = min(known, key=lambda c: (c.requests_per_second, c.shape))
        assert lowest.requests_per_second is not None
        return lowest, lowest.requests_per_second

    def distance(c: Capacity) -> tuple[float, tuple[int, int]]:
        return (
            abs(math.log(max(c.prompt_tokens, 1) / prompt_tokens))
            + abs(math.log(c.output_tokens / output_tokens)),
            c.shape,
        )

    nearest = min(known, key=distance)
    assert nearest.requests_per_second is not None
    scale = min(max(nearest.output_tokens / output_tokens, 1 / MAX_SCALE), MAX_SCALE)
    return nearest, nearest.requests_per_second * scale


def document(capacity: Capacity) -> dict[str, Any]:
    """For the baseline file; an absent knee is left out."""
    doc = asdict(capacity)
    if doc["knee_requests_per_second"] is None:
        del doc["knee_requests_per_second"]
    return doc


def parse(doc: Any, where: str) -> Capacity:
    """One entry of the file's ``capacity:`` section; ValueError says what is wrong."""
    check_fields(doc, Capacity, where, optional=("knee_requests_per_second",))
    values: dict[str, Any] = {}
    for name in ("prompt_tokens", "output_tokens"):
        values[name] = non_negative_int(doc[name], f"{where}.{name}")
    for name in ("requests_per_second", "concurrency", "goodput_share"):
        value = doc[name]
        values[name] = None if value is None else non_negative_number(value, f"{where}.{name}")
    for name in ("target_share", "tolerance"):
        values[name] = non_negative_number(doc[name], f"{where}.{name}")
    for name in ("goodput_share", "target_share"):
        if (values[name] or 0.0) > 1:
            raise ValueError(f"{where}.{name}: {values[name]} is not a share")
    if doc.get("knee_requests_per_second") is not None:
        values["knee_requests_per_second"] = non_negative_number(
            doc["knee_requests_per_second"], f"{where}.knee_requests_per_second"
        )
    for name, allowed in (("arrivals", ARRIVALS), ("ended", ENDINGS)):
        if doc[name] not in allowed:
            raise ValueError(f"{where}.{name}: {doc[name]!r} is not one of {', '.join(allowed)}")
        values[name] = doc[name]
    steps = doc["steps"]
    if not isinstance(steps, list):
        raise ValueError(f"{where}.steps: expected a list")
    values["steps"] = tuple(_step(s, f"{where}.steps[{i}]") for i, s in enumerate(steps))
    return Capacity(**values)


def _step(doc: Any, where: str) -> Step:
    check_fields(doc, Step, where)
    values = {
        name: non_negative_number(doc[name], f"{where}.{name}")
        for name in Step.__dataclass_fields__
        if name != "requests"
    }
    return Step(requests=non_negative_int(doc["requests"], f"{where}.requests"), **values)
