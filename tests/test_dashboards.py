"""Dashboard structure: ids, layout, units, descriptions, and no anchor mistakes in queries."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from inferwatch.dashboards import dashboards
from inferwatch.dashboards.grafana import DATASOURCE, SCHEMA_VERSION, dashboard
from inferwatch.dashboards.grafana_panel import runbook_url
from inferwatch.dashboards.queries import (
    GPU_ONLY_PANELS,
    MODEL,
    NODE,
    POOL_PANELS,
    ROUTER_PANELS,
    TARGET,
    PanelSpec,
    Query,
)
from inferwatch.dashboards.triage import triage_panels
from inferwatch.method.recording import recording_rules
from inferwatch.method.runbooks import RUNBOOKS
from inferwatch.method.slo import BURNS
from inferwatch.method.slo import recording_rules as slo_rules
from inferwatch.method.spec import spec_from_config
from inferwatch.metrics import ALL, Kind
from inferwatch.panels import Panel

BOARDS = dashboards(spec_from_config({}))
COMMITTED = Path(__file__).resolve().parents[1] / "dashboards"


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def exprs(board: dict) -> list[str]:
    return [t["expr"] for p in panels(board) for t in p["targets"]]


def contract_names() -> set[str]:
    names = set()
    for spec in ALL.values():
        names.add(spec.name)
        if spec.kind is Kind.HISTOGRAM:
            names |= {f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"}
    return names


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_committed_json_is_the_generated_one(name: str) -> None:
    assert json.loads((COMMITTED / name).read_text()) == BOARDS[name]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_unique_ids_and_no_overlapping_panels(name: str) -> None:
    board = BOARDS[name]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in board["panels"]:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_panel_explains_itself_and_has_a_unit(name: str) -> None:
    for p in panels(BOARDS[name]):
        assert len(p["description"]) > 60, p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["fieldConfig"]["defaults"].get("noValue"), p["title"]
        assert p["targets"], p["title"]
        if p["title"] in GPU_ONLY_PANELS:
            assert p["description"].startswith("GPU-only"), p["title"]


def rule_names(spec) -> set[str]:
    return {r.record for r in recording_rules(spec)} | {
        r.record for r in slo_rules(spec.slos, spec.fleet_labels)
    }


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_metric_is_in_the_contract_or_a_recording_rule(name: str) -> None:
    known = contract_names() | rule_names(spec_from_config({})) | {"ALERTS"}
    for expr in exprs(BOARDS[name]):
        # Name regexes (the SLO panels read every objective at once) must match a rule.
        for regex in re.findall(r'__name__=~"([^"]+)"', expr):
            assert any(re.fullmatch(regex, n) for n in known), f"{regex} in {expr}"
        expr = re.sub(r'__name__=~"[^"]+"', "", expr)
        for metric in re.findall(
            r"\b(?:instance:|model:|role:)?inferwatch_[a-z_]+(?::[a-z0-9_]+)?|\bALERTS\b", expr
        ):
            assert metric in known, f"{metric} in {expr}"


@pytest.mark.parametrize("scope", ["model", "instance"])
def test_slo_panels_read_every_objective_kind(scope: str) -> None:
    """Each SLO query's name regex matches its series for every kind, and nothing else."""
    objectives = {
        "errors": {"target": 0.999},
        "ttft": {"target": 0.99, "seconds": 0.5},
        "itl": {"target": 0.99, "seconds": 0.1},
        "e2e": {"target": 0.99, "seconds": 10.0},
    }
    spec = spec_from_config({"backend": "vllm", "slos": {"scope": scope, "objectives": objectives}})
    records = rule_names(spec)
    slo_records = {n for n in records if "inferwatch_slo_" in n}
    board = dashboards(spec)["inferwatch-triage.json"]
    titles = {Panel.SLO_BUDGET, Panel.SLO_BURN, Panel.SLO_SLI}
    matched = set()
    for p in panels(board):
        if p["title"] not in titles:
            continue
        for t in p["targets"]:
            regexes = re.findall(r'__name__=~"([^"]+)"', t["expr"])
            assert regexes, t["expr"]
            for regex in regexes:
                assert regex.startswith(f"{scope}:"), regex
                hits = {n for n in records if re.fullmatch(regex, n)}
                assert {n.split("_slo_")[1].split(":")[0].split("_")[0] for n in hits} == set(
                    objectives
                ), regex
                matched |= hits
            if scope == "instance":
                assert 'instance=~"$instance"' in t["expr"], t["expr"]
    # Every series but the burn rates and their inputs (the errors objective's finished
    # requests by reason), and the burn rates of every alert's long window.
    longs = tuple(f":burnrate{b.long}" for b in BURNS)
    shown = {n for n in slo_records if "_finished:" not in n}
    assert {n for n in shown if ":burnrate" not in n or n.endswith(longs)} <= matched


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_no_anchor_mistakes(name: str) -> None:
    for expr in exprs(BOARDS[name]):
        # Quantiles from per-le sums of bucket rates (recorded, or rate() over
        # $__rate_interval or the rules' window), or recorded per-instance quantiles.
        window = re.escape(spec_from_config({}).timing.window)
        for arg in re.findall(r"histogram_quantile\([^,]+,(.*)", expr):
            raw = re.search(
                rf"\brate\(inferwatch_[a-z_]+_bucket\{{[^}}]*\}}\[(\$__rate_interval|{window})\]",
                arg,
            )
            le_kept = re.search(r"sum by \(le[,)]", arg)  # "by (le, kind)": one per kind
            assert le_kept and ("_bucket:rate" in arg or raw), expr
        # Lifetime counters only inside rate()/increase().
        for match in re.finditer(r"inferwatch_[a-z_]+_total\b", expr):
            before = expr[: match.start()]
            assert before.endswith(("rate(", "increase(")), expr
        # A rate of _sum is a mean only when divided by the rate of _count.
        if "_sum" in expr:
            assert "_count" in expr, expr


def test_variables_and_alert_annotations() -> None:
    for board in BOARDS.values():
        variables = [(v["name"], v["type"]) for v in board["templating"]["list"]]
        assert variables == [
            ("datasource", "datasource"),
            ("cluster", "query"),
            ("namespace", "query"),
            ("backend", "query"),
            ("model", "query"),
            ("instance", "query"),
            ("filters", "adhoc"),
        ]
        for v in board["templating"]["list"]:
            if v["type"] == "query":
                assert v["multi"] and v["includeAll"] and v["allValue"] == ".*", v["name"]
                assert v["current"]["value"] == "$__all", v["name"]
            if v["type"] != "datasource":
                assert v["datasource"] == DATASOURCE, v["name"]
        (annotation,) = board["annotations"]["list"]
        assert annotation["target"]["expr"].startswith('ALERTS{alertstate="firing"')
        assert "expr" not in annotation and "step" not in annotation


def test_selectors_follow_namespace_and_cluster() -> None:
    for selector in (TARGET, MODEL, NODE):
        assert 'namespace=~"$namespace"' in selector and 'cluster=~"$cluster"' in selector
    for board in BOARDS.values():
        for expr in exprs(board):
            if 'instance=~"$instance"' in expr or 'model=~"$model"' in expr:
                assert 'namespace=~"$namespace", cluster=~"$cluster"' in expr, expr


LEGACY = {
    "dashboard": {"rows", "style", "hideControls", "sharedCrosshair", "gnetId", "__inputs"},
    "variable": {"tags", "useTags", "tagsQuery", "tagValuesQuery", "auto", "auto_min"},
    "panel": {"editable", "error", "span", "height", "minSpan", "columns", "fontSize", "styles"},
    "target": {"step", "metric", "target", "query", "intervalFactor"},
    "annotation": {"expr", "step", "useValueForTime"},
}


def nulls(value: object, path: str = "") -> list[str]:
    """Paths of null fields, but a threshold step's base ``value: null``."""
    if isinstance(value, dict):
        base = "color" in value
        return [
            n
            for k, v in value.items()
            if not (base and k == "value")
            for n in ([f"{path}.{k}"] if v is None else nulls(v, f"{path}.{k}"))
        ]
    if isinstance(value, list):
        return [n for i, v in enumerate(value) for n in nulls(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_no_nulls_and_no_legacy_fields(name: str) -> None:
    board = BOARDS[name]
    assert nulls(board) == []
    assert board["schemaVersion"] == SCHEMA_VERSION
    assert not LEGACY["dashboard"] & set(board)
    assert "time_options" not in board["timepicker"]
    for v in board["templating"]["list"]:
        assert not LEGACY["variable"] & set(v) and "tags" not in v.get("current", {}), v["name"]
    for a in board["annotations"]["list"]:
        assert not LEGACY["annotation"] & set(a), a["name"]
    for p in board["panels"]:
        assert not LEGACY["panel"] & set(p), p["title"]
        for t in p.get("targets", []):
            assert not LEGACY["target"] & set(t), p["title"]
            assert t["range"] is not t["instant"], p["title"]


def test_dashboards_link_to_each_other_keeping_time_and_variables() -> None:
    for board in BOARDS.values():
        (link,) = board["links"]
        assert link["type"] == "dashboards" and link["keepTime"] and link["includeVars"]
        assert set(link["tags"]) <= set.intersection(*(set(b["tags"]) for b in BOARDS.values()))


def test_panels_a_runbook_cites_link_to_it() -> None:
    base = spec_from_config({}).runbook_url_base
    cited: dict[str, set[str]] = {}
    for alert, book in RUNBOOKS.items():
        for panel, _ in book.confirm:
            cited.setdefault(panel.value, set()).add(alert)
    seen = set()
    for board in BOARDS.values():
        for p in panels(board):
            links = {link["title"]: link["url"] for link in p["links"]}
            want = {f"Runbook: {a}": runbook_url(base, a) for a in cited.get(p["title"], ())}
            assert links == want
            seen |= {p["title"]} & set(cited)
    assert seen == set(cited)
    # The spec's base, not a constant.
    spec = spec_from_config({"alerting": {"runbook_url_base": "https://runbooks.example/"}})
    board = dashboards(spec)["inferwatch-triage.json"]
    urls = [link["url"] for p in panels(board) for link in p["links"]]
    assert urls and all(u.startswith("https://runbooks.example/Inference") for u in urls)


def test_drilldown_links_open_the_instance_with_time_and_variables() -> None:
    drills = [p for b in BOARDS.values() for p in panels(b) if p["fieldConfig"]["defaults"].get("links")]  # fmt: skip
    assert drills
    for p in drills:
        (link,) = p["fieldConfig"]["defaults"]["links"]
        path, query = link["url"].split("?")
        assert path == "/d/inferwatch-triage", p["title"]
        params = query.split("&")
        assert params[:2] == ["var-instance=${__field.labels.instance}", "${__url_time_range}"]
        names = [v["name"] for v in BOARDS["inferwatch-triage.json"]["templating"]["list"]]
        assert params[2:] == [f"${{{n}:queryparam}}" for n in names if n != "instance"]


def test_a_query_unit_overrides_its_series() -> None:
    spec = PanelSpec(
        "Two units",
        "A panel whose second query has its own unit.",
        [Query("a"), Query("b", unit="percentunit")],
        unit="s",
    )
    board = dashboard("t", "T", "", [(None, [spec])], "https://r/")
    (p,) = board["panels"]
    assert p["fieldConfig"]["defaults"]["unit"] == "s"
    assert p["fieldConfig"]["overrides"] == [
        {
            "matcher": {"id": "byFrameRefID", "options": "B"},
            "properties": [{"id": "unit", "value": "percentunit"}],
        }
    ]


@pytest.mark.parametrize("title", [Panel.LOAD_CURVE, "Models"])
def test_a_tables_columns_are_headed_by_their_legends_with_their_units(title: str) -> None:
    (p,) = [p for b in BOARDS.values() for p in panels(b) if p["title"] == title]
    legends = [t["legendFormat"] for t in p["targets"]]
    assert all(legends) and all(t["format"] == "table" and t["instant"] for t in p["targets"])
    ids = [t["id"] for t in p["transformations"]]
    assert ids[:2] == ["merge", "organize"]
    organize = p["transformations"][1]["options"]
    assert organize["excludeByName"] == {"Time": True}
    refs = [t["refId"] for t in p["targets"]]
    assert organize["renameByName"] == {
        f"Value #{r}": n for r, n in zip(refs, legends, strict=True)
    }
    # Grafana matches an override by the name a column has after the transformations.
    headed = {o["matcher"]["options"] for o in p["fieldConfig"]["overrides"]}
    assert headed == set(legends)


def test_the_load_curve_is_one_row_per_rate_in_the_order_of_the_rates() -> None:
    (p,) = [p for b in BOARDS.values() for p in panels(b) if p["title"] == Panel.LOAD_CURVE]
    for t in p["targets"]:
        assert t["expr"].startswith("avg by (model, prompt_tokens, output_tokens, rate) ("), t
    convert, sort = p["transformations"][2:]
    assert convert["options"]["conversions"] == [
        {"targetField": "rate", "destinationType": "number"}
    ]
    assert sort["id"] == "sortBy" and sort["options"]["sort"] == [{"field": "rate", "desc": False}]
    assert [t["expr"].count('latency="') for t in p["targets"]] == [0, 0, 1, 1, 1]


def test_heatmaps_read_prometheus_buckets_or_a_row_per_replica() -> None:
    heatmaps = [p for b in BOARDS.values() for p in panels(b) if p["type"] == "heatmap"]
    by_replica = [p for p in heatmaps if "by instance" in p["title"]]
    assert by_replica and len(by_replica) < len(heatmaps)
    for p in heatmaps:
        assert p["options"]["calculate"] is False, p["title"]
        if p in by_replica:  # a row per replica, zero included; the cells are its load
            assert "unit" not in p["options"]["yAxis"] and "filterValues" not in p["options"]
            for t in p["targets"]:  # a disaggregated deployment's rows next to their role's
                rows = ("{{instance}}", "{{role}} {{instance}}")
                assert t["format"] == "time_series" and t["legendFormat"] in rows
                assert t["expr"].startswith(("sum by (instance) (", "sum by (role, instance) (")), (
                    p["title"]
                )
            continue
        assert p["options"]["yAxis"]["unit"] not in (None, "short"), p["title"]
        for t in p["targets"]:
            assert t["format"] == "heatmap" and t["legendFormat"] == "{{le}}", p["title"]
            assert "sum by (le)" in t["expr"] and "$__rate_interval" in t["expr"], p["title"]


def alerts_table(board: dict) -> dict:
    return next(p for p in panels(board) if p["title"] == Panel.FIRING_ALERTS)


def check_alerts_table(p: dict, base: str) -> None:
    assert p["type"] == "table"
    (target,) = p["targets"]
    assert target["format"] == "table" and target["instant"]
    assert target["expr"].startswith("ALERTS{")
    (organize,) = [t for t in p["transformations"] if t["id"] == "organize"]
    order = sorted(organize["options"]["indexByName"], key=organize["options"]["indexByName"].get)
    assert order == ["alertname", "severity", "phase", "layer", "instance", "pod"]
    hidden = {k for k, v in organize["options"]["excludeByName"].items() if v}
    assert {"Time", "Value", "__name__"} <= hidden
    (override,) = [
        o for o in p["fieldConfig"]["overrides"] if o["matcher"]["options"] == "alertname"
    ]
    assert override["matcher"]["id"] == "byName"
    (prop,) = override["properties"]
    assert prop["id"] == "links"
    assert prop["value"][0]["url"] == runbook_url(base, "${__value.raw}")


def test_an_alerts_table_links_each_alert_to_its_runbook() -> None:
    spec = spec_from_config({})
    firing = next(s for s in triage_panels(spec)[0][1] if s.title == Panel.FIRING_ALERTS)
    assert firing.runbook_column == "alertname"
    board = dashboard("t", "T", "", [(None, [firing])], "https://r/")
    check_alerts_table(alerts_table(board), "https://r/")
    # Without a runbook column the table has no link override at all.
    bare = dashboard("t", "T", "", [(None, [replace(firing, runbook_column=None)])], "https://r/")
    assert alerts_table(bare)["fieldConfig"].get("overrides", []) == []


def test_firing_alerts_link_each_alert_to_its_runbook() -> None:
    base = spec_from_config({}).runbook_url_base
    check_alerts_table(alerts_table(BOARDS["inferwatch-triage.json"]), base)


def test_triage_top_row_answers_phase_and_layer() -> None:
    board = BOARDS["inferwatch-triage.json"]
    first_row = next(i for i, p in enumerate(board["panels"]) if p["type"] == "row")
    top = [p["title"] for p in board["panels"][:first_row]]
    assert top == [
        Panel.TTFT_VS_THRESHOLD,
        Panel.ITL_VS_FLOOR,
        Panel.QUEUE_DEPTH,
        Panel.QUEUED_WHILE_IDLE,
        Panel.GPU_BUSY,
        Panel.KV_CACHE,
        Panel.FIRING_ALERTS,
    ]
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert [r.split(":")[0] for r in rows] == [
        "Service level objectives",
        "Latency by phase",
        "Scheduler",
        "GPU",
        "Communication",
        "System",
        "Baseline",
        "Capacity",
    ]


def test_every_panel_a_runbook_names_is_on_a_dashboard() -> None:
    titles = {p["title"] for p in panels(BOARDS["inferwatch-triage.json"])}
    assert {p.value for p in Panel} - titles == {p.value for p in ROUTER_PANELS | POOL_PANELS}
    titles |= {p["title"] for p in panels(BOARDS["inferwatch-fleet.json"])}
    assert {p.value for p in Panel} <= titles
    for name, book in RUNBOOKS.items():
        for panel, _ in book.confirm:
            assert panel.value in titles, f"{name} cites {panel.value}"


def test_latency_panels_ask_once_for_the_exemplars_of_each_histogram() -> None:
    # A time series or heatmap over the raw buckets of a histogram whose buckets carry trace
    # ids asks for them on its first query over it (not on p50, p95 and p99 alike); a stat, a
    # table or a recorded series never does.
    carrying = [spec.name for spec in ALL.values() if spec.exemplar]
    assert len(carrying) == 6
    asked: dict[str, list[str]] = {}
    for board in BOARDS.values():
        for panel in panels(board):
            targets = panel.get("targets", [])
            for target in targets:
                raw = re.findall(r"(?<![\w:])(inferwatch_\w+)_bucket\b(?!:)", target["expr"])
                read = [name for name in raw if name in carrying]
                if target["exemplar"]:
                    assert panel["type"] in ("timeseries", "heatmap") and read, panel["title"]
                    asked.setdefault(panel["title"], []).extend(read)
                elif panel["type"] in ("timeseries", "heatmap") and read:
                    earlier = targets[: targets.index(target)]
                    assert any(
                        t["exemplar"]
                        and set(read) <= set(re.findall(r"(inferwatch_\w+)_bucket", t["expr"]))
                        for t in earlier
                    ), panel["title"]
    assert all(len(names) == len(set(names)) for names in asked.values()), asked
    assert {"Time to first token", "TTFT distribution", "End-to-end latency"} <= set(asked)
