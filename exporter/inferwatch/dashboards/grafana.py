"""grafanalib glue: turns rows of ``PanelSpec`` into a Grafana dashboard's JSON model.

What every generated dashboard shares: panel placement on the 24-column grid, the variables
(``variables.py``), the firing-alert annotations and the links between the dashboards. Each
panel (its kind, runbook links, drill-down) is built in ``grafana_panel.py``; the JSON leaves
as Grafana 12/13 itself saves it (schemaVersion ``SCHEMA_VERSION``, ``grafana_cleanup.py``).
"""

from __future__ import annotations

import json
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Annotations, Dashboard, GridPos, Panel, RowPanel, Time

from inferwatch.dashboards.grafana_cleanup import as_grafana_saves
from inferwatch.dashboards.grafana_panel import grafana_panel
from inferwatch.dashboards.queries import FIRING_ALERTS, Row
from inferwatch.dashboards.variables import DATASOURCE, variables

# What Grafana 12.x/13.x writes (@grafana/schema 13's defaultDashboard.schemaVersion).
SCHEMA_VERSION = 42
# Every generated dashboard carries it; the dashboard links list the others by it.
TAG = "inferwatch"


def _annotations() -> Annotations:
    """Firing alerts drawn on every time series panel, in the Prometheus data source's current
    form: the query in ``target``; title, text and tags formats are read from the annotation."""
    return Annotations(
        list=[
            {
                "name": "Firing alerts",
                "datasource": DATASOURCE,
                "enable": True,
                "iconColor": "red",
                "target": {
                    "refId": "Anno",
                    "expr": FIRING_ALERTS,
                    "interval": "60s",
                },
                "titleFormat": "{{alertname}}",
                "textFormat": "{{instance}} {{model}} ({{severity}})",
                "tagKeys": "severity,phase,layer",
            }
        ]
    )


def _dashboard_links() -> list[dict[str, Any]]:
    """The other inferwatch dashboards (triage <-> fleet), keeping time range and variables."""
    return [
        {
            "title": "inferwatch",
            "type": "dashboards",
            "tags": [TAG],
            "asDropdown": False,
            "icon": "external link",
            "includeVars": True,
            "keepTime": True,
            "targetBlank": False,
            "tooltip": "",
        }
    ]


def _layout(rows: list[Row], runbook_url_base: str) -> list[Panel]:
    """Left-to-right, top-to-bottom placement on Grafana's 24-column grid."""
    out: list[Panel] = []
    panel_id, y = 1, 0
    for title, panels in rows:
        if title is not None:
            out.append(RowPanel(title=title, id=panel_id, gridPos=GridPos(h=1, w=24, x=0, y=y)))
            panel_id, y = panel_id + 1, y + 1
        x, row_height = 0, 0
        for spec in panels:
            if x + spec.width > 24:
                x, y = 0, y + row_height
                row_height = 0
            position = {"h": spec.height, "w": spec.width, "x": x, "y": y}
            out.append(grafana_panel(spec, panel_id, position, runbook_url_base))
            panel_id, x = panel_id + 1, x + spec.width
            row_height = max(row_height, spec.height)
        y += row_height
    return out


def dashboard(
    uid: str, title: str, description: str, rows: list[Row], runbook_url_base: str
) -> dict[str, Any]:
    """The dashboard's JSON model: ``rows`` laid out, the shared variables, annotations and
    links; panels a runbook cites link to it (``runbook_url_base`` + alert + ``.md``)."""
    board = Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=[TAG, "llm-inference"],
        panels=_layout(rows, runbook_url_base),
        templating=variables(),
        annotations=_annotations(),
        links=_dashboard_links(),
        timezone="browser",
        refresh="30s",
        time=Time("now-1h", "now"),
        graphTooltip=1,  # shared crosshair
        schemaVersion=SCHEMA_VERSION,
    )
    # A dict through grafanalib's own encoder, then without what Grafana no longer reads.
    return as_grafana_saves(json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder)))
