"""What a series of the contract is: its key, kind, help and labels."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

PREFIX = "inferwatch_"


class Kind(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    SUMMARY = "summary"  # quantiles only, as a Prometheus summary exposes them


@dataclass(frozen=True)
class MetricDef:
    """One exposed series family. ``key`` is the name without prefix (and without ``_total``)."""

    key: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()  # beyond the ones every series of its group carries
    # A histogram whose buckets carry exemplars (OpenMetrics): the field of a traced
    # request (inferwatch.serve.slow_requests.Request) whose value is observed in it.
    exemplar: str = ""

    @property
    def name(self) -> str:
        """The exposed family name; counters carry ``_total`` on every sample."""
        suffix = "_total" if self.kind is Kind.COUNTER else ""
        return f"{PREFIX}{self.key}{suffix}"


def defs(*definitions: MetricDef) -> dict[str, MetricDef]:
    """Definitions by key."""
    return {d.key: d for d in definitions}


G, C, H, S = Kind.GAUGE, Kind.COUNTER, Kind.HISTOGRAM, Kind.SUMMARY
