"""What a signal is: a quantity in two forms (PromQL and a local recipe) at one level.

Levels say which labels a signal's series carry:

  INSTANCE  target labels + backend + model      MODEL  the fleet labels
  NODE      target labels (+ gpu labels)         (joined to others on instance, job)
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.method.recipes import Recipe

# Per instance: keep every target label (instance, job, pod, namespace...), drop the
# backend's data-parallel rank. Per model: the fleet labels.
INSTANCE = "instance"
MODEL = "model"
NODE = "node"

# The latency histograms, without prefix.
TTFT = "time_to_first_token_seconds"
ITL = "inter_token_latency_seconds"
QUEUE = "request_queue_time_seconds"


@dataclass(frozen=True, kw_only=True)
class Signal:
    """A quantity the alerts judge, in both forms, named at every field where it is declared."""

    name: str
    label: str  # how diagnose names it: "TTFT p95"
    unit: str  # seconds, ratio, per_second, tokens, cores, factor, count
    level: str
    promql: str  # %-template (see Alert)
    local: Recipe | None  # None: not computable from two scrapes of one exporter
    # The signal read in its place where this one's series are absent (not where they
    # merely saw nothing): a server without a TTFT histogram has the canary's first token.
    fallback: str | None = None
    # The label whose every value the local form judges alone (a router's ``worker``): the
    # PromQL form keeps it, so one exporter's pages hold one value of the signal per value.
    per: str | None = None
