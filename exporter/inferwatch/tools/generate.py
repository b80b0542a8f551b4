"""``inferwatch generate``: writes rules, runbooks, Alertmanager example and dashboards.

Layout written (relative to ``--out``)::

    alerts/inferwatch-rules.yaml        recording + alerting rules
    alerts/alertmanager.example.yml     routing by severity, inhibitions, webhook receivers
    alerts/contract.txt                 the alert contract: every alert's name, one a line
    alerts/runbooks/<Alert>.md          one runbook per alert
    dashboards/inferwatch-*.json        Grafana dashboards (triage, fleet)
    deploy/kubernetes/base/prometheusrule.yaml   the rules as a Prometheus Operator object

Output is deterministic, so CI can regenerate and diff it against the committed files.
"""

from __future__ import annotations

import json
from pathlib import Path

from inferwatch.dashboards import dashboards
from inferwatch.method.alerts import ALERTS
from inferwatch.method.rules import (
    GENERATED,
    alertmanager_document,
    dump_yaml,
    rules_document,
    runbook_markdown,
    slo_runbook_markdown,
)
from inferwatch.method.slo import ALERT_NAMES as SLO_ALERTS
from inferwatch.method.spec import Spec


def artifacts(spec: Spec) -> dict[str, str]:
    """Relative path -> content of every generated file."""
    files = {
        "alerts/inferwatch-rules.yaml": GENERATED + dump_yaml(rules_document(spec)),
        "alerts/alertmanager.example.yml": GENERATED + dump_yaml(alertmanager_document(spec)),
        "alerts/contract.txt": contract(),
    }
    for alert in ALERTS.values():
        files[f"alerts/runbooks/{alert.name}.md"] = runbook_markdown(spec, alert)
    for name in SLO_ALERTS:
        files[f"alerts/runbooks/{name}.md"] = slo_runbook_markdown(spec, name)
    for name, board in dashboards(spec).items():
        files[f"dashboards/{name}"] = json.dumps(board, indent=2, sort_keys=True) + "\n"
    files["deploy/kubernetes/base/prometheusrule.yaml"] = prometheus_rule(spec)
    return files


def contract() -> str:
    """The alert contract: the cause alerts in the rules file's order, then the SLO alerts.

    Committed, so that adding, renaming or removing an alert shows in its diff.
    """
    return GENERATED + "".join(f"{name}\n" for name in (*ALERTS, *SLO_ALERTS))


def prometheus_rule(spec: Spec) -> str:
    """The rules as a Prometheus Operator object, for deploy/kubernetes/base.

    Its ``spec`` is the rules document itself, so it cannot drift from alerts/. Kustomize
    cannot build it from the rules file (a generator makes only ConfigMaps and Secrets), unlike
    the dashboards' ConfigMaps (dashboards/kustomization.yaml).
    """
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "inferwatch", "labels": {"app.kubernetes.io/name": "inferwatch"}},
        "spec": rules_document(spec),
    }
    return GENERATED + dump_yaml(rule)


def write(out: Path, spec: Spec) -> list[Path]:
    written = []
    for relative, content in artifacts(spec).items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written
