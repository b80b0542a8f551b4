"""Dashboard structure: ids, layout, units, descriptions, and no anchor mistakes in queries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from inferwatch.dashboards import dashboards
from inferwatch.dashboards.queries import GPU_ONLY_PANELS
from inferwatch.method.panels import Panel
from inferwatch.method.recording import recording_rules
from inferwatch.method.rules import RUNBOOKS
from inferwatch.method.slo import BURNS
from inferwatch.method.slo import recording_rules as slo_rules
from inferwatch.method.spec import spec_from_config
from inferwatch.metrics import ALL, Kind

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
            r"\b(?:instance:|model:)?inferwatch_[a-z_]+(?::[a-z0-9_]+)?|\bALERTS\b", expr
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
    # Every series but the burn rates, and the burn rates of every alert's long window.
    longs = tuple(f":burnrate{b.long}" for b in BURNS)
    assert {n for n in slo_records if ":burnrate" not in n or n.endswith(longs)} <= matched


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_no_anchor_mistakes(name: str) -> None:
    for expr in exprs(BOARDS[name]):
        # Quantiles from per-le sums of rates (or recorded per-instance quantiles).
        for arg in re.findall(r"histogram_quantile\([^,]+,(.*)", expr):
            assert "sum by (le)" in arg and "_bucket:rate" in arg, expr
        # Lifetime counters only inside rate()/increase().
        for match in re.finditer(r"inferwatch_[a-z_]+_total\b", expr):
            before = expr[: match.start()]
            assert before.endswith(("rate(", "increase(")), expr
        # A rate of _sum is a mean only when divided by the rate of _count.
        if "_sum" in expr:
            assert "_count" in expr, expr


def test_variables_and_alert_annotations() -> None:
    for board in BOARDS.values():
        variables = {v["name"] for v in board["templating"]["list"]}
        assert variables == {"datasource", "backend", "model", "instance"}
        (annotation,) = board["annotations"]["list"]
        assert annotation["expr"].startswith('ALERTS{alertstate="firing"')


def test_triage_top_row_answers_phase_and_layer() -> None:
    board = BOARDS["inferwatch-triage.json"]
    top = [p["title"] for p in board["panels"] if p["gridPos"]["y"] == 0]
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
        "System",
        "Baseline",
    ]


def test_every_panel_a_runbook_names_is_on_the_triage_dashboard() -> None:
    titles = {p["title"] for p in panels(BOARDS["inferwatch-triage.json"])}
    assert {p.value for p in Panel} == titles
    for name, book in RUNBOOKS.items():
        for panel, _ in book.confirm:
            assert panel.value in titles, f"{name} cites {panel.value}"
