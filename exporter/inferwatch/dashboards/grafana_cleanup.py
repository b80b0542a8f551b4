"""grafanalib's dashboard JSON as Grafana 12/13 itself saves it: no nulls, no legacy fields.

grafanalib still writes fields Grafana dropped long ago (and nulls for everything unset);
:func:`as_grafana_saves` removes them. tests/test_dashboard_schema.py type-checks the result
against @grafana/schema.
"""

from __future__ import annotations

from typing import Any

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


def as_grafana_saves(board: dict[str, Any]) -> dict[str, Any]:
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
