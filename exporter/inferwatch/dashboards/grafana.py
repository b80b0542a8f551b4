"""grafanalib glue: turns rows of ``PanelSpec`` into a Grafana dashboard's JSON model.

Panel placement on the 24-column grid, the panel kinds (stat, table, time series), the
data source, backend/model/instance variables and the firing-alert annotations that every
generated dashboard shares.
"""

from __future__ import annotations

import json
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from inferwatch.dashboards.queries import PanelSpec, Row

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _variables() -> g.Templating:
    def query(name: str, label: str, q: str) -> g.Template:
        return g.Template(
            name=name,
            label=label,
            query={"query": q, "refId": name},
            dataSource=DATASOURCE,
            includeAll=True,
            multi=True,
            allValue=".*",
            default="$__all",
            refresh=2,  # on time-range change: new replicas appear
        )

    return g.Templating(
        list=[
            g.Template(
                name="datasource",
                label="Data source",
                query="prometheus",
                type="datasource",
                default="Prometheus",
            ),
            query("backend", "Backend", "label_values(inferwatch_backend_info, backend)"),
            query(
                "model",
                "Model",
                'label_values(inferwatch_backend_info{backend=~"$backend"}, model)',
            ),
            query(
                "instance",
                "Instance",
                'label_values(inferwatch_backend_up{backend=~"$backend"}, instance)',
            ),
        ]
    )


def _annotations() -> g.Annotations:
    """Firing alerts drawn on every time series panel."""
    return g.Annotations(
        list=[
            {
                "name": "Firing alerts",
                "datasource": DATASOURCE,
                "enable": True,
                "iconColor": "red",
                "expr": 'ALERTS{alertstate="firing", alertname=~"Inference.*", model=~"$model|"}',
                "titleFormat": "{{alertname}}",
                "textFormat": "{{instance}} {{model}} ({{severity}})",
                "tagKeys": "severity,phase,layer",
                "useValueForTime": False,
                "step": "60s",
            }
        ]
    )


def _panel(spec: PanelSpec, pid: int, pos: dict) -> g.Panel:
    targets = [
        g.Target(
            expr=q.expr,
            legendFormat=q.legend,
            refId=chr(ord("A") + i),
            instant=q.instant or q.table,
            format="table" if q.table else "time_series",
            datasource=DATASOURCE,
        )
        for i, q in enumerate(spec.queries)
    ]
    steps = [{"color": color, "value": value} for value, color in spec.thresholds] or [
        {"color": "green", "value": None}
    ]
    common = {
        "title": spec.title,
        "description": spec.description,
        "dataSource": DATASOURCE,
        "targets": targets,
        "id": pid,
        "gridPos": g.GridPos(**pos),
        "thresholds": steps,
    }
    no_value = {"fieldConfig": {"defaults": {"noValue": spec.no_value}}}
    if spec.kind == "stat":
        return g.Stat(
            **common,
            format=spec.unit,
            noValue=spec.no_value,
            reduceCalc="lastNotNull",
            graphMode="area",
        )
    if spec.kind == "table":
        merge = {"transformations": [{"id": "merge", "options": {}}]}
        return g.Table(**common, unit=spec.unit, extraJson={**no_value, **merge})
    return g.TimeSeries(
        **common,
        unit=spec.unit,
        extraJson=no_value,
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "max"],
        thresholdsStyleMode="dashed" if spec.thresholds else "off",
        stacking={"mode": "normal", "group": "A"} if spec.stacked else {},
        fillOpacity=20 if spec.stacked else 0,
        tooltipMode="multi",
    )


def _layout(rows: list[Row]) -> list[g.Panel]:
    """Left-to-right, top-to-bottom placement on Grafana's 24-column grid."""
    out: list[g.Panel] = []
    pid, y = 1, 0
    for title, panels in rows:
        if title is not None:
            out.append(g.RowPanel(title=title, id=pid, gridPos=g.GridPos(h=1, w=24, x=0, y=y)))
            pid, y = pid + 1, y + 1
        x, row_height = 0, 0
        for spec in panels:
            if x + spec.width > 24:
                x, y = 0, y + row_height
                row_height = 0
            out.append(_panel(spec, pid, {"h": spec.height, "w": spec.width, "x": x, "y": y}))
            pid, x, row_height = pid + 1, x + spec.width, max(row_height, spec.height)
        y += row_height
    return out


def dashboard(uid: str, title: str, description: str, rows: list[Row]) -> dict[str, Any]:
    board = g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["inferwatch", "llm-inference"],
        panels=_layout(rows),
        templating=_variables(),
        annotations=_annotations(),
        timezone="browser",
        refresh="30s",
        time=g.Time("now-1h", "now"),
        graphTooltip=1,  # shared crosshair
        schemaVersion=39,
    )
    # A dict through grafanalib's own encoder, so the JSON is what Grafana imports.
    return json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
