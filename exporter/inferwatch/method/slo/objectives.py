"""What an objective is: its kind (what it measures, from which series), target and bound.

``SLOs`` is the parsed ``slos:`` section (:mod:`inferwatch.method.slo.config`): the
compliance window, the scope and the objectives of each group of models.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.metrics import ALL


@dataclass(frozen=True, kw_only=True)
class ObjectiveKind:
    """What an objective of this kind measures, from which inferwatch series."""

    name: str
    title: str
    events: str  # what one event is
    histogram: str | None  # the latency histogram; None: finished requests by reason


KINDS: dict[str, ObjectiveKind] = {
    kind.name: kind
    for kind in (
        ObjectiveKind(
            name="ttft",
            title="time to first token",
            events="requests",
            histogram=ALL["time_to_first_token_seconds"].name,
        ),
        ObjectiveKind(
            name="itl",
            title="inter-token latency",
            events="output tokens",
            histogram=ALL["inter_token_latency_seconds"].name,
        ),
        ObjectiveKind(
            name="e2e",
            title="end-to-end latency",
            events="requests",
            histogram=ALL["request_duration_seconds"].name,
        ),
        ObjectiveKind(
            name="errors", title="server errors", events="finished requests", histogram=None
        ),
    )
}
# What an ``errors`` objective counts: finished requests, by reason.
FINISHED_REQUESTS = ALL["requests_finished"].name
# Judge a model across its replicas, or each pod (``instance``) on its own.
SCOPES = ("model", "instance")


@dataclass(frozen=True, kw_only=True)
class Objective:
    kind: str
    target: float  # share of good events, e.g. 0.99
    seconds: float | None = None  # the latency bound; None for errors

    @property
    def budget(self) -> float:
        return 1 - self.target

    def text(self) -> str:
        """``99 % of requests within 0.5 s (time to first token)``."""
        kind = KINDS[self.kind]
        pct = f"{self.target * 100:g} %"
        if self.kind == "errors":
            return f"{pct} of {kind.events} end without a server error"
        return f"{pct} of {kind.events} within {self.seconds:g} s ({kind.title})"


@dataclass(frozen=True, kw_only=True)
class ModelObjectives:
    """The objectives of some models; ``models`` empty: every model not named elsewhere."""

    models: tuple[str, ...]
    objectives: tuple[Objective, ...]


@dataclass(frozen=True)
class SLOs:
    window: str = "28d"
    scope: str = "model"
    groups: tuple[ModelObjectives, ...] = (
        ModelObjectives(models=(), objectives=(Objective(kind="errors", target=0.999),)),
    )
