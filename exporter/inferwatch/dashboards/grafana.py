"""grafanalib glue: turns rows of ``PanelSpec`` into a Grafana dashboard's JSON model.

Panel placement on the 24-column grid, the panel kinds (stat, table, time series, heatmap),
the data source, the variables (cluster, namespace, backend, model, instance, ad-hoc filters),
the firing-alert annotations, the links between the dashboards, to the runbooks and from a
series to the triage dashboard of its instance: what every generated dashboard shares.

grafanalib still writes fields Grafana dropped long ago (and nulls for everything unset);
``_clean`` removes them, so the JSON is what Grafana 12/13 itself saves (schemaVersion
``SCHEMA_VERSION``). tests/test_dashboard_schema.py type-checks it against @grafana/schema.
"""

from __future__ import annotations

import json
from typing import Any

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from inferwatch.dashboards.queries import PanelSpec, Query, Row
from inferwatch.method.rules import RUNBOOKS

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# What Grafana 12.x/13.x writes (@grafana/schema 13's defaultDashboard.schemaVersion).
SCHEMA_VERSION = 42
# Every generated dashboard carries it; the dashboard links list the others by it.
TAG = "inferwatch"
# The query variables, in their order on the dashboard: (name, label, query).
QUERY_VARIABLES = [
    ("cluster", "Cluster", "label_values(inferwatch_backend_up, cluster)"),
    (
        "namespace",
        "Namespace",
        'label_values(inferwatch_backend_up{cluster=~"$cluster"}, namespace)',
    ),
    (
        "backend",
        "Backend",
        'label_values(inferwatch_backend_info{namespace=~"$namespace", cluster=~"$cluster"}, '
        "backend)",
    ),
    (
        "model",
        "Model",
        'label_values(inferwatch_backend_info{backend=~"$backend", namespace=~"$namespace", '
        'cluster=~"$cluster"}, model)',
    ),
    (
        "instance",
        "Instance",
        'label_values(inferwatch_backend_up{backend=~"$backend", namespace=~"$namespace", '
        'cluster=~"$cluster"}, instance)',
    ),
]
ADHOC = "filters"
# The columns of an ALERTS table, first in this order; Time, Value and __name__ dropped.
ALERT_COLUMNS = ["alertname", "severity", "phase", "layer", "instance", "pod"]
ALERT_HIDDEN = ["Time", "Value", "__name__", "alertstate"]

# Fields grafanalib writes that Grafana no longer knows (or that @grafana/schema lacks).
_LEGACY_DASHBOARD = {"__inputs", "hideControls", "rows", "sharedCrosshair", "style", "gnetId"}
_LEGACY_VARIABLE = {
    "auto",
    "auto_count",
    "auto_min",
    "tags",
    "tagsQuery",
    "tagValuesQuery",
    "useTags",
}
# The old table panel's color, columns, fontSize, mappings and styles, at panel level.
_LEGACY_PANEL = {"editable", "error", "height", "span", "minSpan", "columns", "fontSize", "color"}
_LEGACY_PANEL |= {"mappings", "styles"}
_LEGACY_TARGET = {"metric", "query", "step", "target", "intervalFactor"}
_ROW_FIELDS = {"collapsed", "datasource", "gridPos", "id", "panels", "repeat", "title", "type"}


@attr.s
class _Heatmap(g.Panel):
    """A heatmap panel (Grafana 9+): grafanalib's ``Heatmap`` is the legacy one; the options
    come in ``extraJson``."""

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json({"type": "heatmap"})


def runbook_url(base: str, alert: str) -> str:
    """The runbook URL of ``alert``, as the alert rules' ``runbook_url`` annotation has it."""
    return f"{base}{alert}.md"


def runbook_alerts() -> dict[str, list[str]]:
    """Panel title -> the alerts whose runbook cites the panel to confirm them (rules order)."""
    cited: dict[str, list[str]] = {}
    for alert, book in RUNBOOKS.items():
        for panel, _ in book.confirm:
            names = cited.setdefault(panel.value, [])
            if alert not in names:
                names.append(alert)
    return cited


def _variables() -> g.Templating:
    """Data source, then cluster, namespace, backend, model, instance (multi-select, All by
    default, All = ``.*`` so series without the label match), then ad-hoc filters."""

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
            *(query(*v) for v in QUERY_VARIABLES),
            {"name": ADHOC, "label": "Filters", "type": "adhoc", "datasource": DATASOURCE},
        ]
    )


def _annotations() -> g.Annotations:
    """Firing alerts drawn on every time series panel, in the Prometheus data source's current
    form: the query in ``target``; title, text and tags formats are read from the annotation."""
    return g.Annotations(
        list=[
            {
                "name": "Firing alerts",
                "datasource": DATASOURCE,
                "enable": True,
                "iconColor": "red",
                "target": {
                    "refId": "Anno",
                    "expr": 'ALERTS{alertstate="firing", alertname=~"Inference.*", model=~"$model|"}',
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


def _runbook_links(spec: PanelSpec, base: str) -> list[dict[str, Any]]:
    """Panel links "Runbook: <Alert>" for every alert whose runbook cites this panel."""
    return [
        {
            "title": f"Runbook: {alert}",
            "type": "link",
            "url": runbook_url(base, alert),
            "targetBlank": True,
            "asDropdown": False,
            "icon": "doc",
            "includeVars": False,
            "keepTime": False,
            "tags": [],
            "tooltip": f"How to confirm and fix {alert}",
        }
        for alert in runbook_alerts().get(spec.title, [])
    ]


def _drilldown_link(spec: PanelSpec, uid: str) -> dict[str, Any]:
    """A data link from a series (a table row) to dashboard ``uid`` for its instance, with the
    time range and every other variable."""
    instance = "${__data.fields.instance}" if spec.kind == "table" else "${__field.labels.instance}"
    others = ["datasource"] + [name for name, _, _ in QUERY_VARIABLES if name != "instance"]
    params = "&".join(
        [f"var-instance={instance}", "${__url_time_range}"]
        + [f"${{{name}:queryparam}}" for name in [*others, ADHOC]]
    )
    return {"title": f"Open {uid} for {instance}", "url": f"/d/{uid}?{params}"}


def _target(spec: PanelSpec, q: Query, ref: str) -> g.Target:
    """One Prometheus query: instant for tables, buckets by ``le`` for heatmaps."""
    instant = q.instant or q.table
    if spec.kind == "heatmap":
        fmt, legend = "heatmap", "{{le}}"
    else:
        fmt, legend = ("table" if q.table else "time_series"), q.legend
    return g.Target(
        expr=q.expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format=fmt,
        datasource=DATASOURCE,
    )


def _overrides(spec: PanelSpec, base: str) -> list[dict[str, Any]]:
    """Field overrides: a query's own unit on its series (its column, in a table) and the
    runbook link on an ALERTS table's alert-name column."""
    out: list[dict[str, Any]] = []
    for i, q in enumerate(spec.queries):
        if q.unit is None or spec.kind == "heatmap":
            continue
        ref = _ref(i)
        if spec.kind == "table":  # merged into one frame: the column is "Value #<refId>"
            name = f"Value #{ref}" if len(spec.queries) > 1 else "Value"
            matcher = {"id": "byName", "options": name}
        else:
            matcher = {"id": "byFrameRefID", "options": ref}
        out.append({"matcher": matcher, "properties": [{"id": "unit", "value": q.unit}]})
    if spec.runbook_column:
        link = {
            "title": "Runbook: ${__value.raw}",
            "url": runbook_url(base, "${__value.raw}"),
            "targetBlank": True,
        }
        out.append(
            {
                "matcher": {"id": "byName", "options": spec.runbook_column},
                "properties": [{"id": "links", "value": [link]}],
            }
        )
    return out


def _ref(i: int) -> str:
    return chr(ord("A") + i)


def _transformations(spec: PanelSpec) -> list[dict[str, Any]]:
    """Tables: several queries merged into one table; an ALERTS table keeps its label columns,
    alert name first, without Time, Value and __name__."""
    out: list[dict[str, Any]] = []
    if len(spec.queries) > 1:
        out.append({"id": "merge", "options": {}})
    if spec.runbook_column:
        order = [spec.runbook_column] + [c for c in ALERT_COLUMNS if c != spec.runbook_column]
        out.append(
            {
                "id": "organize",
                "options": {
                    "excludeByName": dict.fromkeys(ALERT_HIDDEN, True),
                    "indexByName": {name: i for i, name in enumerate(order)},
                    "renameByName": {},
                },
            }
        )
    return out


def _heatmap_options(spec: PanelSpec) -> dict[str, Any]:
    """Prometheus buckets as they come (``calculate: false``), one row per ``le``."""
    return {
        "calculate": False,
        "cellGap": 1,
        "color": {
            "mode": "scheme",
            "scheme": "Oranges",
            "fill": "dark-orange",
            "scale": "exponential",
            "exponent": 0.5,
            "steps": 64,
            "reverse": False,
        },
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": 1e-9},
        "legend": {"show": True},
        "rowsFrame": {"layout": "auto"},
        "showValue": "never",
        "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
        "yAxis": {"axisPlacement": "left", "reverse": False, "unit": spec.unit},
    }


def _panel(spec: PanelSpec, pid: int, pos: dict, base: str) -> g.Panel:
    """One panel of ``spec.kind`` with its targets, thresholds, links and overrides."""
    targets = [_target(spec, q, _ref(i)) for i, q in enumerate(spec.queries)]
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
        "links": _runbook_links(spec, base),
    }
    defaults: dict[str, Any] = {"noValue": spec.no_value}
    if spec.drilldown:
        defaults["links"] = [_drilldown_link(spec, spec.drilldown)]
    field_config = {"fieldConfig": {"defaults": defaults, "overrides": _overrides(spec, base)}}
    if spec.kind == "stat":
        return g.Stat(
            **common,
            format=spec.unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            extraJson=field_config,
        )
    if spec.kind == "table":
        table = {"transformations": _transformations(spec)}
        return g.Table(**common, unit=spec.unit, extraJson={**field_config, **table})
    if spec.kind == "heatmap":
        defaults.update(
            unit="short",  # observations per bucket and interval; the y axis has spec.unit
            custom={
                "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                "scaleDistribution": {"type": "linear"},
            },
        )
        return _Heatmap(**common, extraJson={**field_config, "options": _heatmap_options(spec)})
    return g.TimeSeries(
        **common,
        unit=spec.unit,
        extraJson={**field_config, "options": {"legend": {"showLegend": True}}},
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "max"],
        thresholdsStyleMode="dashed" if spec.thresholds else "off",
        stacking={"mode": "normal", "group": "A"} if spec.stacked else {},
        fillOpacity=20 if spec.stacked else 0,
        tooltipMode="multi",
    )


def _layout(rows: list[Row], base: str) -> list[g.Panel]:
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
            pos = {"h": spec.height, "w": spec.width, "x": x, "y": y}
            out.append(_panel(spec, pid, pos, base))
            pid, x, row_height = pid + 1, x + spec.width, max(row_height, spec.height)
        y += row_height
    return out


def _drop_nulls(value: Any) -> Any:
    """``value`` without null fields, at any depth; a threshold step's ``value: null`` (the
    base step) stays, as Grafana requires it."""
    if isinstance(value, dict):
        keep_null = "color" in value and "value" in value
        return {
            k: _drop_nulls(v)
            for k, v in value.items()
            if v is not None or (keep_null and k == "value")
        }
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _clean(board: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's dashboard JSON as Grafana 12/13 writes it: no nulls, no legacy fields."""
    board = _drop_nulls(board)
    for key in _LEGACY_DASHBOARD:
        board.pop(key, None)
    board["timepicker"].pop("time_options", None)
    for var in board["templating"]["list"]:
        for key in _LEGACY_VARIABLE:
            var.pop(key, None)
        var.get("current", {}).pop("tags", None)
    panels = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            panels.append({k: v for k, v in panel.items() if k in _ROW_FIELDS})
            continue
        for key in _LEGACY_PANEL:
            panel.pop(key, None)
        custom = panel["fieldConfig"]["defaults"].get("custom", {})
        if panel["type"] == "table" and "displayMode" in custom:  # now cellOptions
            custom["cellOptions"] = {"type": custom.pop("displayMode")}
        if not custom:
            panel["fieldConfig"]["defaults"].pop("custom", None)
        for target in panel["targets"]:
            for key in _LEGACY_TARGET:
                target.pop(key, None)
            target["range"] = not target["instant"]  # what Grafana sets on load otherwise
        panels.append(panel)
    board["panels"] = panels
    return board


def dashboard(
    uid: str, title: str, description: str, rows: list[Row], runbook_url_base: str
) -> dict[str, Any]:
    """The dashboard's JSON model: ``rows`` laid out, the shared variables, annotations and
    links; panels a runbook cites link to it (``runbook_url_base`` + alert + ``.md``)."""
    board = g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=[TAG, "llm-inference"],
        panels=_layout(rows, runbook_url_base),
        templating=_variables(),
        annotations=_annotations(),
        links=_dashboard_links(),
        timezone="browser",
        refresh="30s",
        time=g.Time("now-1h", "now"),
        graphTooltip=1,  # shared crosshair
        schemaVersion=SCHEMA_VERSION,
    )
    # A dict through grafanalib's own encoder, then without what Grafana no longer reads.
    return _clean(json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder)))
