"""The alert table: when each cause alert fires, what it says, where it points.

Each alert lives in one module of its layer, with everything about it: its conditions and
text, the capture evidence, its promtool scenarios; its runbook is the Markdown template
``runbooks/<name>.md`` beside them. A layer is a module (``compute.py``, ``communication.py``,
``system.py``, ``hardware.py``, ``baseline.py``) or, once it grows, a package of one module
per alert (``availability/``, ``scheduling/``, ``memory/``). Adding one is one
:class:`Alert` in a module's ``ALERTS``, its template, and ``make generate``.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from inferwatch.method.alerts import (
    availability,
    baseline,
    communication,
    compute,
    hardware,
    memory,
    scheduling,
    system,
)
from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.scenario import A, B, Scenario, healthy
from inferwatch.method.signals import INSTANCE

__all__ = [
    "ALERTS",
    "FLEET_SCENARIOS",
    "OUTSIDE_THE_SLIS",
    "RELATIONS",
    "STEP_SPAN",
    "USERS_SEE",
    "Alert",
    "Cond",
]

LAYERS = (availability, scheduling, compute, memory, communication, system, hardware, baseline)


def _modules(layer: ModuleType) -> list[ModuleType]:
    """A layer's modules: the layer itself, or each module of a layer that is a package."""
    if not hasattr(layer, "__path__"):
        return [layer]
    return [
        importlib.import_module(f"{layer.__name__}.{found.name}")
        for found in pkgutil.iter_modules(layer.__path__)
    ]


def _table() -> dict[str, Alert]:
    """Every layer's alerts by name, in their ``order`` (the rules file's); the layer of each
    is the name of the module or package it lives in."""
    alerts: list[Alert] = []
    for layer in LAYERS:
        name = layer.__name__.rpartition(".")[2]
        for module in _modules(layer):
            for alert in getattr(module, "ALERTS", ()):
                if alert.layer != name:
                    raise ValueError(f"{alert.name} of layer {alert.layer} is in {module.__name__}")
                alerts.append(alert)
    for what, values in (("name", [a.name for a in alerts]), ("order", [a.order for a in alerts])):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"two alerts have one {what}: {twice}")
    return {a.name: a for a in sorted(alerts, key=lambda a: a.order)}


# The alert table, in the order of the rules file.
ALERTS: dict[str, Alert] = _table()

# Critical alerts about requests the server never counts: they page even where the SLOs do
# the paging (``Alert.outside_the_slis``).
OUTSIDE_THE_SLIS = tuple(a.name for a in ALERTS.values() if a.outside_the_slis)

# The method's causal graph: (cause, what it explains, labels that must be equal). A dead
# backend explains everything about its pod; the rest is each alert's ``explains``. The
# verdict page and ``diagnose`` list an explained finding under its cause; the generated
# Alertmanager config inhibits it (where the cause's severity is at least its own).
Relation = tuple[str, tuple[str, ...], tuple[str, ...]]


def _relations() -> tuple[Relation, ...]:
    down = "InferenceBackendDown"
    out: list[Relation] = [
        (
            down,
            tuple(a.name for a in ALERTS.values() if a.level == INSTANCE and a.name != down),
            ("instance",),
        )
    ]
    for alert in ALERTS.values():
        unknown = sorted(set(alert.explains) - set(ALERTS) | ({alert.name} & set(alert.explains)))
        if unknown:
            raise ValueError(f"{alert.name} explains {unknown}: not another alert of the table")
        for equal in (("instance",), ("model",)):
            same = tuple(
                name
                for name in alert.explains
                if (equal == ("instance",))
                == (alert.level == INSTANCE and ALERTS[name].level == INSTANCE)
            )
            if same:
                out.append((alert.name, same, equal))
    _check_acyclic(out)
    # The page says it; the ticket for the same objective would say it again.
    out.append(
        (
            "InferenceSLOFastBurn",
            ("InferenceSLOSlowBurn",),
            ("slo", "namespace", "backend", "model"),
        )
    )
    return tuple(out)


def _check_acyclic(relations: list[Relation]) -> None:
    """No alert explains itself through others (the listing nests causes above effects)."""
    explains = {}
    for source, targets, _ in relations:
        explains.setdefault(source, set()).update(targets)

    def reach(name: str, path: tuple[str, ...]) -> None:
        for target in sorted(explains.get(name, ())):
            if target in path:
                raise ValueError(f"the alerts explain each other: {' -> '.join((*path, target))}")
            reach(target, (*path, target))

    for name in explains:
        reach(name, (name,))


RELATIONS: tuple[Relation, ...] = _relations()


# The scenarios of no one alert: a healthy fleet, where nothing fires. (Its promtool test
# also counts every firing alert, so an alert missing from ``silent`` is judged there too.)
FLEET_SCENARIOS = (
    Scenario(
        "healthy fleet: nothing fires",
        (healthy(A), healthy(B)),
        file="phase.yaml",
        place=1,
        fires={},
        silent=(
            "InferenceBackendDown",
            "InferenceQueuedWhileIdle",
            "InferenceQueueingDelay",
            "InferencePrefillBottleneck",
            "InferenceDecodeBottleneck",
            "InferenceDecodeAtHardwareFloor",
            "InferenceKVCachePressure",
            "InferencePrefillStallsDecode",
            "InferenceGPUUnderutilized",
            "InferenceFrontendCPUSaturated",
            "InferenceRequestErrors",
            "InferenceLatencyRegression",
            "InferenceGPUThrottling",
            "InferenceExporterGPUMissing",
            "InferenceClientGap",
            "InferenceCanaryFailing",
            "InferenceNearCapacity",
            "InferenceGPUFailing",
            "InferenceEngineHung",
            "InferenceKVCacheGaugeFrozen",
        ),
    ),
)
