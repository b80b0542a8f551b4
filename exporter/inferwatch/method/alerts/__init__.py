"""The alert table: when each cause alert fires, what it says, where it points.

Each alert lives in the module of its layer (``availability.py``, ``scheduling.py``,
``compute.py``, ``memory.py``, ``communication.py``, ``system.py``, ``baseline.py``) with
everything about it: its conditions and text, the capture evidence, its promtool scenarios;
its runbook is the Markdown template ``runbooks/<name>.md`` beside them. Adding one is one
:class:`Alert` in its layer's ``ALERTS``, its template, and ``make generate``.
"""

from __future__ import annotations

from inferwatch.method.alerts import (
    availability,
    baseline,
    communication,
    compute,
    memory,
    scheduling,
    system,
)
from inferwatch.method.alerts.alert import STEP_SPAN, Alert, Cond
from inferwatch.method.scenario import A, B, Scenario, healthy
from inferwatch.method.signals import INSTANCE

__all__ = [
    "ALERTS",
    "FLEET_SCENARIOS",
    "INHIBITIONS",
    "OUTSIDE_THE_SLIS",
    "STEP_SPAN",
    "Alert",
    "Cond",
]

LAYERS = (availability, scheduling, compute, memory, communication, system, baseline)


def _table() -> dict[str, Alert]:
    """Every layer's alerts by name, in their ``order`` (the rules file's)."""
    alerts: list[Alert] = []
    for module in LAYERS:
        layer = module.__name__.rpartition(".")[2]
        for alert in module.ALERTS:
            if alert.layer != layer:
                raise ValueError(f"{alert.name} of layer {alert.layer} is in {layer}.py")
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

# Alertmanager inhibitions: (source alert, target alerts, labels that must be equal).
INHIBITIONS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "InferenceBackendDown",
        tuple(
            a.name
            for a in ALERTS.values()
            if a.level == INSTANCE and a.name != "InferenceBackendDown"
        ),
        ("instance",),
    ),
    ("InferenceQueuedWhileIdle", ("InferenceQueueingDelay",), ("model",)),
    # The page says it; the ticket for the same objective would say it again.
    ("InferenceSLOFastBurn", ("InferenceSLOSlowBurn",), ("slo", "namespace", "backend", "model")),
)

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
        ),
    ),
)
