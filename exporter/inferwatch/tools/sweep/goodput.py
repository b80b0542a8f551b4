"""Goodput: the requests of a cell that met every objective jointly, and their rate.

The objectives are the config's ``slos:`` for the swept model, their bounds replaced by
``--goodput-ttft`` / ``--goodput-itl`` / ``--goodput-e2e`` where given. A request is good when
it did not fail and met each latency objective (ITL: at least the objective's share of its
own gaps). Per cell, as the baseline file keeps them::

    goodput_share: 0.875
    goodput_requests_per_second: 3.1
    goodput_tokens_per_second: 198.4
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inferwatch.collect.stream import Sample
from inferwatch.method.slo.objectives import SLOs

# The ITL objective's target where only a bound is given (the share of a request's gaps).
DEFAULT_ITL_TARGET = 0.95


@dataclass(frozen=True)
class Objectives:
    """The latency bounds a good request meets (None: no such objective)."""

    ttft: float | None = None
    itl: float | None = None
    itl_target: float = DEFAULT_ITL_TARGET
    e2e: float | None = None

    def met(self, sample: Sample) -> bool:
        """Whether one request met every objective."""
        if not sample.ok:
            return False
        if self.ttft is not None and not sample.ttft <= self.ttft:
            return False
        if self.e2e is not None and not sample.e2e <= self.e2e:
            return False
        if self.itl is not None and sample.gaps:
            within = sum(1 for gap in sample.gaps if gap <= self.itl)
            return within >= self.itl_target * len(sample.gaps)
        return True

    def text(self) -> str:
        """``TTFT <= 0.5 s, 95 % of gaps <= 0.05 s, no error``."""
        parts = [f"TTFT <= {self.ttft:g} s"] if self.ttft is not None else []
        if self.itl is not None:
            parts.append(f"{self.itl_target * 100:g} % of gaps <= {self.itl:g} s")
        if self.e2e is not None:
            parts.append(f"end to end <= {self.e2e:g} s")
        return ", ".join([*parts, "no error"])

    def document(self) -> dict[str, Any]:
        """For the baseline file's metadata: the objectives its goodput was measured with."""
        doc: dict[str, Any] = {}
        if self.ttft is not None:
            doc["ttft_seconds"] = self.ttft
        if self.itl is not None:
            doc["itl_seconds"] = self.itl
            doc["itl_target"] = self.itl_target
        if self.e2e is not None:
            doc["e2e_seconds"] = self.e2e
        return doc


def objectives_for(slos: SLOs, model: str, bounds: Mapping[str, float | None]) -> Objectives:
    """The swept model's objectives: its group's in ``slos`` (else the default group's),
    each latency bound replaced by ``bounds[kind]`` where that is given."""
    group = next((g for g in slos.groups if model in g.models), None)
    group = group or next((g for g in slos.groups if not g.models), None)
    given = {o.kind: o for o in group.objectives} if group else {}
    seconds = {kind: given[kind].seconds if kind in given else None for kind in bounds}
    seconds |= {kind: bound for kind, bound in bounds.items() if bound is not None}
    itl = given.get("itl")
    return Objectives(
        ttft=seconds.get("ttft"),
        itl=seconds.get("itl"),
        itl_target=itl.target if itl is not None else DEFAULT_ITL_TARGET,
        e2e=seconds.get("e2e"),
    )


@dataclass(frozen=True)
class Goodput:
    """A cell's goodput: the good share of its requests, good requests and their output
    tokens per second."""

    share: float
    requests_per_second: float
    tokens_per_second: float

    @classmethod
    def of(cls, samples: Iterable[Sample], seconds: float, objectives: Objectives) -> Goodput:
        samples = list(samples)
        good = [s for s in samples if objectives.met(s)]
        return cls(
            share=round(len(good) / len(samples), 4) if samples else 0.0,
            requests_per_second=round(len(good) / seconds, 3) if seconds > 0 else 0.0,
            tokens_per_second=(
                round(sum(s.output_tokens for s in good) / seconds, 3) if seconds > 0 else 0.0
            ),
        )
