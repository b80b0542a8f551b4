"""A promtool scenario: replicas, the alerts expected to fire (labels and annotations), the
alerts that must stay silent; and its promtool test group.

The expected annotations are written by hand next to each scenario: the numbers in them
follow from the stated distributions (histogram_quantile interpolates linearly inside a
bucket: all observations in (2.5, 5] give p95 = 2.5 + 0.95 * 2.5 = 4.875 s). Thresholds are
the shipped defaults (see alerts/runbooks/*.md).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from inferwatch.method.scenario.series import gpu_labels, input_series
from inferwatch.method.scenario.workload import EVAL, SERVED_MODEL, STEP, Replica
from inferwatch.urls import runbook_url

# The default spec's runbooks: the sidecar's own page, linked for an alert of one instance.
SIDECAR = "http://%s/"


@dataclass(frozen=True)
class Scenario:
    """What a few replicas serve and what the cause alerts make of it.

    ``file`` is the promtool test file under alerts/tests/ it is written to and ``place`` its
    position there (a number no other scenario of that file has).
    """

    name: str
    replicas: tuple[Replica, ...]
    _: KW_ONLY
    file: str
    place: int
    fires: dict[str, list[dict]]  # alert name -> expected alerts (labels + annotations)
    silent: tuple[str, ...] = ()  # alerts that must not fire (near misses, cross-checks)
    eval_time: str = EVAL
    # Recorded series and their values at ``eval_time``: (expression, labels, value).
    records: tuple[tuple[str, str, float], ...] = ()


def _expected(alertname: str, labels: dict, description: str, summary: str) -> dict:
    instance = labels.get("instance")
    url = runbook_url("", alertname, SIDECAR % instance if instance else None)
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": summary,
            "description": description,
            **({"runbook_url": url} if url else {}),
        },
    }


def instance_alert(
    alertname: str,
    instance: str,
    severity: str,
    phase: str,
    layer: str,
    description: str,
    summary: str,
    **extra: str,
) -> dict:
    """An alert of one instance; ``no_model=""`` for one without backend and model labels,
    ``extra`` the alert's other labels."""
    labels = {
        "severity": severity,
        "phase": phase,
        "layer": layer,
        "instance": instance,
        "job": "inferwatch",
    }
    if "no_model" not in extra:
        labels |= {"backend": "vllm", "model": SERVED_MODEL}
    extra.pop("no_model", None)
    labels |= extra
    return _expected(alertname, labels, description, summary)


def gpu_alert(
    alertname: str,
    instance: str,
    severity: str,
    phase: str,
    layer: str,
    description: str,
    summary: str,
    **extra: str,
) -> dict:
    """An alert of GPU 0 of one instance: its GPU's labels, no backend or model."""
    return instance_alert(
        alertname, instance, severity, phase, layer, description, summary,
        no_model="", **gpu_labels(instance, 0), **extra,
    )  # fmt: skip


def bottleneck(phase: str, layer: str, instance: str, description: str, **extra: str) -> dict:
    """``Inference<Phase>Bottleneck`` on one instance (info: the shipped rules' latency
    thresholds are uncalibrated)."""
    name = phase.capitalize()
    return instance_alert(
        f"Inference{name}Bottleneck",
        instance,
        "info",
        phase,
        layer,
        description,
        f"{name} is the bottleneck on {instance} ({SERVED_MODEL})",
        **extra,
    )


def model_alert(
    alertname: str,
    severity: str,
    phase: str,
    layer: str,
    description: str,
    summary: str,
    backend: str = "vllm",
) -> dict:
    """An alert of the fleet rules: labelled by model, not by instance."""
    labels = {"severity": severity, "phase": phase, "layer": layer}
    return _expected(
        alertname, labels | {"backend": backend, "model": SERVED_MODEL}, description, summary
    )


def promtool_group(s: Scenario) -> dict:
    """The scenario as one promtool test: its series, each expectation, nothing else firing."""
    series = [item for r in s.replicas for item in input_series(r)]
    checks = [
        {"eval_time": s.eval_time, "alertname": name, "exp_alerts": alerts}
        for name, alerts in s.fires.items()
    ]
    checks += [{"eval_time": s.eval_time, "alertname": name} for name in s.silent]
    firing = sorted(s.fires)
    return {
        "name": s.name,
        "interval": f"{STEP}s",
        "input_series": series,
        "alert_rule_test": checks,
        "promql_expr_test": [
            {
                # Nothing but the expected cause alerts fires (pending ones are not counted;
                # the SLO alerts these errors and latencies burn are judged in slos-*.yaml).
                "expr": 'count by (alertname) (ALERTS{alertstate="firing",layer!="slo"})',
                "eval_time": s.eval_time,
                "exp_samples": [
                    {"labels": f'{{alertname="{a}"}}', "value": len(s.fires[a])} for a in firing
                ],
            },
            *(
                {
                    "expr": expr,
                    "eval_time": s.eval_time,
                    "exp_samples": [{"labels": labels, "value": value}],
                }
                for expr, labels, value in s.records
            ),
        ],
    }
