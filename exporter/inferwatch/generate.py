"""``inferwatch generate``: writes rules, runbooks, Alertmanager example and dashboards.

Layout written (relative to ``--out``)::

    alerts/inferwatch-rules.yaml        recording + alerting rules
    alerts/alertmanager.example.yml     routing by severity, inhibitions, webhook receivers
    alerts/runbooks/<Alert>.md          one runbook per alert
    dashboards/inferwatch-*.json        Grafana dashboards (triage, fleet)

Output is deterministic, so CI can regenerate and diff it against the committed files.
"""

from __future__ import annotations

import json
from pathlib import Path

from inferwatch.dashboards import dashboards
from inferwatch.heuristics import ALERTS, Spec
from inferwatch.rules import (
    GENERATED,
    alertmanager_document,
    dump_yaml,
    rules_document,
    runbook_markdown,
)


def artifacts(spec: Spec) -> dict[str, str]:
    """Relative path -> content of every generated file."""
    files = {
        "alerts/inferwatch-rules.yaml": GENERATED + dump_yaml(rules_document(spec)),
        "alerts/alertmanager.example.yml": GENERATED + dump_yaml(alertmanager_document()),
    }
    for alert in ALERTS.values():
        files[f"alerts/runbooks/{alert.name}.md"] = runbook_markdown(spec, alert)
    for name, board in dashboards(spec).items():
        files[f"dashboards/{name}"] = json.dumps(board, indent=2, sort_keys=True) + "\n"
    return files


def write(out: Path, spec: Spec) -> list[Path]:
    written = []
    for relative, content in artifacts(spec).items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written
