"""The fleet view of ``diagnose --prometheus``: which replica of each model holds the load,
which worker a router fails, and the findings about each, causes only (what they explain is
listed under them in the report); a finding about a model across its replicas (the capacity
ticket: every replica busy at once) on the model's line, not on a replica's.

Built from the fleet's signals (:mod:`~inferwatch.method.router_signals`) as Prometheus answers
them, one list of ``(labels, value)`` per signal. A sample of what the report prints::

    fleet: backend=vllm model=tiny namespace=prod  2 replicas, 20 in flight
      instance=a:10177  18 in flight (90 %), 6 waiting  InferenceReplicaImbalance (scheduling)
      instance=b:10177  2 in flight (10 %), 0 waiting
    router: backend=vllm-router instance=r:10177 model=unknown  2 workers
      http://a:8000  1 requests/s, 0 % failed, health check passes, circuit closed
      http://b:8000  1 requests/s, 90 % failed, health check passes, circuit closed  Inference...
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferwatch.method.alerts import Alert

Series = Sequence[tuple[Mapping[str, str], float]]

# The signals the view reads (each a list of series from Prometheus).
REPLICA_SIGNALS = ("in_flight", "waiting")
WORKER_SIGNALS = (
    "router_worker_request_rate",
    "router_worker_failure_share",
    "router_worker_healthy",
    "router_worker_circuit_state",
)
# What a series carries that says nothing about which replica or router it is.
_NOT_WHERE = ("__name__", "job", "engine")


class Found(Protocol):
    """A finding of the report (:class:`~inferwatch.method.findings.Finding`), as read here."""

    alert: Alert
    labels: Mapping[str, str]
    explained_by: str | None


@dataclass(frozen=True)
class Replica:
    labels: dict[str, str]  # the replica's own (instance, and the fleet labels)
    in_flight: float
    waiting: float | None
    share: float | None  # of its model's requests in flight
    causes: tuple[Alert, ...]  # the findings about it that no other explains, ranked


@dataclass(frozen=True)
class Model:
    labels: dict[str, str]  # the fleet labels, and the role of a disaggregated pool
    replicas: list[Replica]  # the most loaded first
    causes: tuple[Alert, ...]  # about the model across its replicas (its capacity), ranked


@dataclass(frozen=True)
class Worker:
    worker: str  # the replica as the router names it (its URL)
    readings: dict[str, float | None]  # by WORKER_SIGNALS name
    causes: tuple[Alert, ...]


@dataclass(frozen=True)
class RouterView:
    labels: dict[str, str]  # the sidecar next to the router
    workers: list[Worker]
    causes: tuple[Alert, ...]  # about the router itself (its overhead), not one worker


@dataclass(frozen=True)
class Fleet:
    models: list[Model]  # models with two replicas or more
    routers: list[RouterView]

    def __bool__(self) -> bool:
        return bool(self.models or self.routers)


def _where(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in _NOT_WHERE}


def _about(labels: Mapping[str, str]) -> str | None:
    """What a finding is about, by the labels its series carries: one replica (or the router
    itself), a router's worker, or a model across its replicas."""
    if "instance" in labels:
        return "worker" if "worker" in labels else "replica"
    return None if "worker" in labels else "model"


def _causes(
    findings: Sequence[Found], labels: Mapping[str, str], about: str = "replica"
) -> tuple[Alert, ...]:
    """The alerts of the findings about the series ``labels`` (every label both carry the
    same) that no other finding explains; of those ``about`` a replica, a router's worker or
    a model (:func:`_about`)."""
    return tuple(
        f.alert
        for f in findings
        if f.explained_by is None
        and _about(f.labels) == about
        and all(labels.get(k, v) == v for k, v in f.labels.items())
    )


def fleet_of(
    readings: Mapping[str, Series], findings: Sequence[Found], fleet_labels: Sequence[str]
) -> Fleet:
    """The fleet view from the signals' series (``readings``, by signal name) and the report's
    findings (ranked); a model's replicas are the series that share ``fleet_labels`` and
    their role, where their sidecars know it."""
    waiting = {_key(s): v for s, v in readings.get("waiting", ())}
    models: dict[tuple, list[tuple[dict[str, str], float]]] = {}
    for series, value in readings.get("in_flight", ()):
        if math.isnan(value):
            continue
        labels = _where(series)
        # A disaggregated deployment's prefill and decode instances apart (their role).
        model = {k: labels[k] for k in (*fleet_labels, "role") if k in labels}
        models.setdefault(tuple(model.items()), []).append((labels, value))
    views = []
    for model, members in models.items():
        if len(members) < 2:
            continue
        total = sum(v for _, v in members)
        views.append(
            Model(
                dict(model),
                [
                    Replica(
                        labels,
                        value,
                        waiting.get(_key(labels)),
                        value / total if total > 0 else None,
                        _causes(findings, labels),
                    )
                    for labels, value in sorted(members, key=lambda m: -m[1])
                ],
                _causes(findings, dict(model), "model"),
            )
        )
    routers: dict[tuple, dict[str, dict[str, float | None]]] = {}
    for name in WORKER_SIGNALS:
        for series, value in readings.get(name, ()):
            labels = _where(series)
            worker = labels.pop("worker", None)
            if worker is None:
                continue
            by_worker = routers.setdefault(tuple(sorted(labels.items())), {})
            row = by_worker.setdefault(worker, dict.fromkeys(WORKER_SIGNALS))
            row[name] = None if math.isnan(value) else value
    return Fleet(
        sorted(views, key=lambda m: sorted(m.labels.items())),
        [
            RouterView(
                dict(router),
                [
                    Worker(w, row, _causes(findings, {**dict(router), "worker": w}, "worker"))
                    for w, row in sorted(workers.items())
                ],
                _causes(findings, dict(router)),
            )
            for router, workers in sorted(routers.items())
        ],
    )


def _key(labels: Mapping[str, str]) -> tuple:
    """A replica's series, whether or not it carries the role (its load does)."""
    return tuple(sorted((k, v) for k, v in _where(labels).items() if k != "role"))
