"""The generated dashboards type-check against Grafana's own schema (@grafana/schema, npm).

Each dashboard is written as ``const dashboard: StrictDashboard = <its JSON>;`` and checked with
``tsc --strict --noEmit`` (tests/grafana-schema/: package.json and its lock; `make check`
installs node_modules). ``StrictDashboard`` (tests/grafana-schema/schema.ts) is @grafana/schema's
Dashboard with each panel kind's own options and field config types and Prometheus targets, so
TypeScript's excess-property check reports an unknown field at any depth. One tsc run checks
every dashboard and, to prove the check bites, copies of them with one unknown field (or one
wrong enum value) injected in each part of the model: each copy must fail on that field.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inferwatch.dashboards import dashboards
from inferwatch.method.spec import spec_from_config

SCHEMA_DIR = Path(__file__).resolve().parent / "grafana-schema"
TSC = SCHEMA_DIR / "node_modules" / ".bin" / "tsc"
BOARDS = dashboards(spec_from_config({}))
ERROR = re.compile(r"^(?P<file>[^(\s]+\.ts)\(\d+,\d+\): error (?P<text>.*)$")


def _only(board: dict[str, Any], panel: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``board`` with just ``panel`` (a small file for tsc)."""
    small = copy.deepcopy({k: v for k, v in board.items() if k != "panels"})
    small["panels"] = [copy.deepcopy(panel)]
    return small


def _inject(
    board: str,
    kind: str,
    reach: Callable[[dict], dict],
    key: str,
    value: Any = 1,
    *,
    wrong_value: bool = False,
) -> Callable[[], tuple[dict, str]]:
    """A mutant: ``board`` with only its first ``kind`` panel that ``reach`` can reach into
    (the dashboard itself for kind ""), and ``reach(root)[key] = value``; returns (dashboard,
    what tsc must name in its error: the unknown key, or the value a known key cannot take)."""

    def make() -> tuple[dict, str]:
        source = BOARDS[board]
        panels = [p for p in source["panels"] if p["type"] == kind] or source["panels"][:1]
        for panel in panels:
            small = _only(source, panel)
            root = small["panels"][0] if kind else small
            try:
                target = reach(root)
            except (KeyError, IndexError):
                continue
            target[key] = value
            return small, (json.dumps(value) if wrong_value else f"'\"{key}\"'")
        raise AssertionError(f"no {kind} panel in {board} to inject {key} into")

    return make


TRIAGE, FLEET = "inferwatch-triage.json", "inferwatch-fleet.json"
MUTANTS: dict[str, Callable[[], tuple[dict, str]]] = {
    "dashboard": _inject(TRIAGE, "", lambda d: d, "bogusDashboard"),
    "timepicker": _inject(TRIAGE, "", lambda d: d["timepicker"], "time_options", ["5m"]),
    "variable": _inject(TRIAGE, "", lambda d: d["templating"]["list"][2], "useTags"),
    "variable-current": _inject(
        TRIAGE, "", lambda d: d["templating"]["list"][2]["current"], "tags"
    ),
    "annotation": _inject(TRIAGE, "", lambda d: d["annotations"]["list"][0], "bogusAnno"),
    "annotation-target": _inject(
        TRIAGE, "", lambda d: d["annotations"]["list"][0]["target"], "bogusAnnoTarget"
    ),
    "dashboard-link": _inject(TRIAGE, "", lambda d: d["links"][0], "bogusLink"),
    "row": _inject(TRIAGE, "row", lambda p: p, "bogusRow"),
    "panel": _inject(TRIAGE, "timeseries", lambda p: p, "editable", True),
    "panel-unknown": _inject(TRIAGE, "timeseries", lambda p: p, "bogusPanel"),
    "panel-link": _inject(TRIAGE, "stat", lambda p: p["links"][0], "bogusPanelLink"),
    "target": _inject(TRIAGE, "timeseries", lambda p: p["targets"][0], "bogusTarget"),
    "field-defaults": _inject(
        TRIAGE, "timeseries", lambda p: p["fieldConfig"]["defaults"], "bogusDefaults"
    ),
    "threshold-step": _inject(
        TRIAGE,
        "timeseries",
        lambda p: p["fieldConfig"]["defaults"]["thresholds"]["steps"][0],
        "bogusStep",
    ),
    "timeseries-custom": _inject(
        TRIAGE, "timeseries", lambda p: p["fieldConfig"]["defaults"]["custom"], "bogusCustom"
    ),
    "timeseries-legend": _inject(
        TRIAGE, "timeseries", lambda p: p["options"]["legend"], "bogusLegend"
    ),
    "override": _inject(
        FLEET, "table", lambda p: p["fieldConfig"]["overrides"][0]["matcher"], "bogusMatcher"
    ),
    "stat-options": _inject(TRIAGE, "stat", lambda p: p["options"], "bogusStat"),
    "stat-enum": _inject(
        TRIAGE, "stat", lambda p: p["options"], "graphMode", "spark", wrong_value=True
    ),
    "table-custom": _inject(
        TRIAGE, "table", lambda p: p["fieldConfig"]["defaults"]["custom"], "bogusCell"
    ),
    "table-options": _inject(TRIAGE, "table", lambda p: p["options"], "bogusTable"),
    "transformation": _inject(FLEET, "table", lambda p: p["transformations"][0], "bogusT"),
    "heatmap-options": _inject(TRIAGE, "heatmap", lambda p: p["options"]["yAxis"], "bogusAxis"),
    "heatmap-enum": _inject(
        TRIAGE, "heatmap", lambda p: p["options"]["color"], "mode", "rainbow", wrong_value=True
    ),
    "data-link": _inject(
        FLEET, "timeseries", lambda p: p["fieldConfig"]["defaults"]["links"][0], "bogusDataLink"
    ),
}


def _ts(board: dict[str, Any]) -> str:
    return (
        'import type { StrictDashboard } from "../schema";\n\n'
        f"export const dashboard: StrictDashboard = {json.dumps(board, indent=1)};\n"
    )


def _stem(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower())


@pytest.fixture(scope="module")
def tsc() -> Iterator[dict[str, list[str]]]:
    """One ``tsc --strict --noEmit`` over every dashboard and every mutant: file stem -> its
    errors (and "" -> tsc's whole output)."""
    modules = SCHEMA_DIR / "node_modules"
    assert TSC.is_file(), (
        f"{modules} is missing: run `make check` (or `npm ci --prefix {SCHEMA_DIR}`)"
    )
    work = Path(tempfile.mkdtemp(prefix=".check-", dir=SCHEMA_DIR))
    try:
        files = {f"board_{_stem(n)}": _ts(b) for n, b in BOARDS.items()}
        files |= {f"mutant_{_stem(n)}": _ts(make()[0]) for n, make in MUTANTS.items()}
        for stem, text in files.items():
            (work / f"{stem}.ts").write_text(text)
        config = {"extends": "../tsconfig.json", "files": [f"{s}.ts" for s in files]}
        (work / "tsconfig.json").write_text(json.dumps(config))
        proc = subprocess.run(
            [str(TSC), "-p", str(work / "tsconfig.json"), "--strict", "--noEmit"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        out = proc.stdout + proc.stderr
        errors: dict[str, list[str]] = {stem: [] for stem in files}
        errors[""] = [out]
        for line in out.splitlines():
            m = ERROR.match(line)
            if m:
                errors.setdefault(Path(m["file"]).stem, []).append(m["text"])
        unexpected = set(errors) - set(files) - {""}
        assert not unexpected, out  # errors outside the generated files (schema.ts, the lib)
        assert (proc.returncode == 0) == (not any(errors[s] for s in files)), out
        yield errors
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_type_checks_against_grafana_schema(tsc: dict[str, list[str]], name: str) -> None:
    assert tsc[f"board_{_stem(name)}"] == [], "\n".join(tsc[f"board_{_stem(name)}"])


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_an_unknown_field_fails_the_check(tsc: dict[str, list[str]], case: str) -> None:
    _, reported = MUTANTS[case]()
    errors = tsc[f"mutant_{_stem(case)}"]
    assert any(reported in e for e in errors), (reported, errors)


def test_schema_version_is_what_the_schema_package_writes() -> None:
    """Grafana migrates older dashboards on load; ours are already at the current version."""
    esm = SCHEMA_DIR / "node_modules" / "@grafana" / "schema" / "dist" / "esm"
    assert esm.is_dir(), f"run `npm ci --prefix {SCHEMA_DIR}`"
    versions = {
        int(v)
        for f in esm.rglob("types.gen.mjs")
        for v in re.findall(r"schemaVersion: (\d+)", f.read_text())
    }
    assert {b["schemaVersion"] for b in BOARDS.values()} == versions
