"""One ``PanelSpec`` as a grafanalib panel: targets, thresholds, overrides and links.

The panel kinds (stat, table, time series, heatmap), a query's own unit, an ALERTS table's
columns and runbook links, the panel links to the runbooks that cite it, and the data link
from a series to another dashboard for its instance.
"""

from __future__ import annotations

import re
from typing import Any

import attr
from grafanalib.core import GridPos, Panel, Stat, Table, Target, TimeSeries

from inferwatch.dashboards.queries import PanelSpec, Query
from inferwatch.dashboards.variables import ADHOC, DATASOURCE, QUERY_VARIABLES
from inferwatch.method.runbooks import RUNBOOKS
from inferwatch.metrics import ALL
from inferwatch.urls import runbook_url as spec_runbook_url

# The columns of an ALERTS table, first in this order; Time, Value and __name__ dropped.
ALERT_COLUMNS = ["alertname", "severity", "phase", "layer", "instance", "pod"]
ALERT_HIDDEN = ["Time", "Value", "__name__", "alertstate"]


@attr.s
class _Heatmap(Panel):
    """A heatmap panel (Grafana 9+): grafanalib's ``Heatmap`` is the legacy one; the options
    come in ``extraJson``."""

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json({"type": "heatmap"})


# A raw bucket series of a histogram whose buckets carry exemplars (the trace ids of the
# server's requests, docs/exporter.md); not a recorded series named after one.
_EXEMPLAR_BUCKETS = re.compile(
    r"(?<![\w:])((?:{})_bucket)\b(?!:)".format(
        "|".join(spec.name for spec in ALL.values() if spec.exemplar)
    )
)


@attr.s
class _Target(Target):
    """A Prometheus query that also asks for the exemplars of the series it reads."""

    exemplar: bool = attr.ib(default=False)

    def to_json_data(self) -> dict[str, Any]:
        return {**super().to_json_data(), "exemplar": self.exemplar}


# The sidecar of the instance the dashboard shows: where its runbooks are served.
SHOWN_SIDECAR = "http://${instance}/"


def runbook_url(base: str, alert: str) -> str:
    """The runbook URL of ``alert``: the team's host, or the shown instance's sidecar."""
    return spec_runbook_url(base, alert, SHOWN_SIDECAR) or ""


def runbook_alerts() -> dict[str, list[str]]:
    """Panel title -> the alerts whose runbook cites the panel to confirm them (rules order)."""
    cited: dict[str, list[str]] = {}
    for alert, book in RUNBOOKS.items():
        for panel, _ in book.confirm:
            names = cited.setdefault(panel.value, [])
            if alert not in names:
                names.append(alert)
    return cited


def _runbook_links(spec: PanelSpec, runbook_url_base: str) -> list[dict[str, Any]]:
    """Panel links "Runbook: <Alert>" for every alert whose runbook cites this panel."""
    return [
        {
            "title": f"Runbook: {alert}",
            "type": "link",
            "url": runbook_url(runbook_url_base, alert),
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


def _target(spec: PanelSpec, query: Query, ref: str, exemplar: bool = False) -> Target:
    """One Prometheus query: instant for tables, buckets by ``le`` for a heatmap's query
    without a legend (one row per series with one); with ``exemplar``, also the exemplars
    of the series it reads."""
    instant = query.instant or query.table
    if spec.kind == "heatmap" and not query.legend:
        fmt, legend = "heatmap", "{{le}}"
    else:
        fmt, legend = ("table" if query.table else "time_series"), query.legend
    return _Target(
        expr=query.expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format=fmt,
        datasource=DATASOURCE,
        exemplar=exemplar,
    )


def _exemplar_queries(spec: PanelSpec) -> set[int]:
    """The queries of a time series or heatmap panel that ask for exemplars: the first one
    over each histogram whose buckets carry them (the p50, p95 and p99 of one histogram
    would show the same requests three times)."""
    if spec.kind not in ("timeseries", "heatmap"):
        return set()
    first: dict[str, int] = {}
    for i, query in enumerate(spec.queries):
        if query.instant or query.table:
            continue
        for name in _EXEMPLAR_BUCKETS.findall(query.expr):
            first.setdefault(name, i)
    return set(first.values())


def _overrides(spec: PanelSpec, runbook_url_base: str) -> list[dict[str, Any]]:
    """Field overrides: a query's own unit on its series (its column, in a table) and the
    runbook link on an ALERTS table's alert-name column."""
    out: list[dict[str, Any]] = []
    for i, query in enumerate(spec.queries):
        if query.unit is None or spec.kind == "heatmap":
            continue
        ref = _ref_id(i)
        if spec.kind == "table":  # merged into one frame: the column is its header
            matcher = {"id": "byName", "options": _column(spec, i)}
        else:
            matcher = {"id": "byFrameRefID", "options": ref}
        out.append({"matcher": matcher, "properties": [{"id": "unit", "value": query.unit}]})
    if spec.runbook_column:
        link = {
            "title": "Runbook: ${__value.raw}",
            "url": runbook_url(runbook_url_base, "${__value.raw}"),
            "targetBlank": True,
        }
        out.append(
            {
                "matcher": {"id": "byName", "options": spec.runbook_column},
                "properties": [{"id": "links", "value": [link]}],
            }
        )
    return out


def _ref_id(index: int) -> str:
    """The query's refId: A, B, C... in the panel's order."""
    return chr(ord("A") + index)


def _column(spec: PanelSpec, index: int) -> str:
    """A table's column of the query at ``index``: Grafana names it "Value" (one query) or
    "Value #<refId>" (several, merged); those are renamed to the query's legend."""
    query = spec.queries[index]
    if len(spec.queries) == 1:
        return "Value"
    return query.legend or f"Value #{_ref_id(index)}"


def _transformations(spec: PanelSpec) -> list[dict[str, Any]]:
    """Tables: several queries merged into one table, each value column headed by its
    query's legend, without Time; an ALERTS table keeps its label columns, alert name
    first, without Time, Value and __name__; a table sorted by a label, that label as a
    number."""
    out: list[dict[str, Any]] = []
    if len(spec.queries) > 1:
        headers = {f"Value #{_ref_id(i)}": _column(spec, i) for i in range(len(spec.queries))}
        out.append({"id": "merge", "options": {}})
        out.append(
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "indexByName": {},
                    "renameByName": headers,
                },
            }
        )
    if spec.sort_by:
        number = {"targetField": spec.sort_by, "destinationType": "number"}
        out.append({"id": "convertFieldType", "options": {"conversions": [number], "fields": {}}})
        sort = {"field": spec.sort_by, "desc": False}
        out.append({"id": "sortBy", "options": {"fields": {}, "sort": [sort]}})
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


def _series_rows(spec: PanelSpec) -> bool:
    """Whether a heatmap's rows are its queries' series (they have a legend), not buckets."""
    return any(query.legend for query in spec.queries)


def _heatmap_options(spec: PanelSpec) -> dict[str, Any]:
    """Prometheus buckets as they come (``calculate: false``), one row per ``le``; or one row
    per series (a replica), the cells in ``spec.unit``."""
    rows = _series_rows(spec)
    options = {
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
        "tooltip": {"mode": "single", "yHistogram": not rows, "showColorScale": rows},
        "yAxis": {"axisPlacement": "left", "reverse": False, "unit": spec.unit},
    }
    if rows:  # the y axis names the series; an idle replica's zero is a cell, not a gap
        del options["filterValues"], options["yAxis"]["unit"]
    return options


def grafana_panel(
    spec: PanelSpec, panel_id: int, position: dict[str, int], runbook_url_base: str
) -> Panel:
    """One panel of ``spec.kind`` with its targets, thresholds, links and overrides, at
    ``position`` (h, w, x, y) on the grid; runbook links start with ``runbook_url_base``."""
    exemplars = _exemplar_queries(spec)
    targets = [_target(spec, q, _ref_id(i), i in exemplars) for i, q in enumerate(spec.queries)]
    steps = [{"color": color, "value": value} for value, color in spec.thresholds] or [
        {"color": "green", "value": None}
    ]
    common = {
        "title": spec.title,
        "description": spec.description,
        "dataSource": DATASOURCE,
        "targets": targets,
        "id": panel_id,
        "gridPos": GridPos(**position),
        "thresholds": steps,
        "links": _runbook_links(spec, runbook_url_base),
    }
    defaults: dict[str, Any] = {"noValue": spec.no_value}
    if spec.drilldown:
        defaults["links"] = [_drilldown_link(spec, spec.drilldown)]
    field_config = {
        "fieldConfig": {"defaults": defaults, "overrides": _overrides(spec, runbook_url_base)}
    }
    if spec.kind == "stat":
        return Stat(
            **common,
            format=spec.unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            extraJson=field_config,
        )
    if spec.kind == "table":
        table = {"transformations": _transformations(spec)}
        return Table(**common, unit=spec.unit, extraJson={**field_config, **table})
    if spec.kind == "heatmap":
        defaults.update(
            # Observations per bucket and interval (the y axis has spec.unit), or a row's value.
            unit=spec.unit if _series_rows(spec) else "short",
            custom={
                "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                "scaleDistribution": {"type": "linear"},
            },
        )
        return _Heatmap(**common, extraJson={**field_config, "options": _heatmap_options(spec)})
    return TimeSeries(
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
