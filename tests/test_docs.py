"""The docs cannot go stale: generated regions are their definitions, links and paths hold,
every module is on the development map, and the README fits on a screen."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from demo.scenarios import SCENARIOS
from inferwatch.collect.backends import BACKENDS, module_name
from inferwatch.method.alerts import ALERTS
from inferwatch.metrics import ALL, BACKEND
from inferwatch.serve.options import OPTIONS
from inferwatch.tools.docs import ABSENT, PAGES, alert_table, feed_cell, with_regions
from inferwatch.tools.measured import (
    BENCH,
    CANARY_BENCH,
    E2E_TIMES,
    FLEET_BENCH,
    NOT_MEASURED,
    PERFORMANCE,
    cpu_model,
    figures_region,
    write_figures,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "exporter" / "inferwatch"
README = REPO / "README.md"
DEVELOPMENT = REPO / "docs" / "development.md"
MARKDOWN = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250


def region_rows(page: str, name: str) -> list[str]:
    region = next(r for r in PAGES[page] if r.name == name)
    return [line for line in region.body((REPO / page).read_text()).splitlines() if line]


def cells(row: str) -> list[str]:
    """A table row's cells (a ``\\|`` inside a cell is no column break)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def table(page: str, name: str) -> tuple[list[str], list[dict[str, str]]]:
    """A generated table's column names (backticks dropped) and its rows, each cell under
    its column's name: a test reads a column by what it is, not where it stands."""
    header, _rule, *rows = region_rows(page, name)
    columns = [c.strip("`") for c in cells(header)]
    return columns, [dict(zip(columns, cells(row), strict=True)) for row in rows]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_generated_region_is_what_make_generate_writes(page: str) -> None:
    text = (REPO / page).read_text()
    assert text == with_regions(text, PAGES[page], page), (
        f"{page} differs from its definitions: make generate"
    )


def test_every_contract_family_has_a_metrics_row() -> None:
    rows = [r for r in region_rows("docs/metrics.md", "metric table") if r.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [d.name for d in ALL.values()]


def test_every_cause_alert_has_a_row_saying_when_it_fires() -> None:
    rows = [r for r in region_rows("docs/alerts.md", "alert table") if r.startswith("| [")]
    assert [row[3 : row.index("]")] for row in rows] == list(ALERTS)
    gap = next(row for row in alert_table().splitlines() if "[InferenceClientGap]" in row)
    assert "| info | any / system | pod | client gap (canary TTFT - server TTFT) > 100 ms" in gap
    errors = next(row for row in rows if "[InferenceRequestErrors]" in row)
    assert "warning (critical with `paging: causes`)" in errors
    down = next(row for row in rows if "[InferenceBackendDown]" in row)
    assert (
        "| critical | any / availability | pod | backend up == 0 or exporter up == 0, for 1m |"
        in down
    )
    assert "(../alerts/runbooks/InferenceBackendDown.md)" in down


def test_every_serve_flag_has_a_row() -> None:
    _, rows = table("docs/exporter.md", "flags table")
    named = [(r["flag"], r["environment variable"], r["config key"]) for r in rows]
    assert named == [(f"`{o.flag}`", f"`{o.env}`", f"`{o.key}`") for o in OPTIONS]


def backend_matrix() -> dict[str, dict[str, str]]:
    """The backend matrix's series rows (not its italic notes): per contract series, its
    cell under each backend's name."""
    _, rows = table("docs/backends.md", "backend matrix")
    return {row["series"].strip("`"): row for row in rows if row["series"].startswith("`")}


def test_every_backend_feed_appears_in_the_matrix() -> None:
    columns, _ = table("docs/backends.md", "backend matrix")
    assert columns == ["series", *BACKENDS]
    matrix = backend_matrix()
    assert list(matrix) == [d.name for d in BACKEND.values()]
    for backend in BACKENDS.values():
        fed = {f.key: f for f in backend.feeds}
        for key, definition in BACKEND.items():
            cell = matrix[definition.name][backend.name]
            if key not in fed:
                assert cell == ABSENT, (backend.name, key)
                continue
            assert cell == feed_cell(fed[key]).replace("|", "\\|"), (backend.name, key)
            assert fed[key].sources[0].name in cell, (backend.name, key)


def test_matrix_cells_say_how_a_series_is_derived() -> None:
    matrix = backend_matrix()
    capacity = matrix["inferwatch_kv_cache_capacity_tokens"]
    assert capacity["vllm"].startswith(
        "derived: `vllm:cache_config_info`'s labels `kv_cache_size_tokens`"
    )
    assert capacity["tgi"] == ABSENT
    assert capacity["triton"].startswith("derived: `nv_trt_llm_kv_cache_block_metrics{")
    ratio = matrix["inferwatch_kv_cache_usage_ratio"]
    assert ratio["vllm"] == "`vllm:kv_cache_usage_perc` (+1 fallback)"
    assert ratio["sglang"] == "`sglang:token_usage`"  # its sglang_ twin is no fallback


def test_the_readme_fits_on_a_screen_and_states_the_two_commands() -> None:
    text = README.read_text()
    assert text.count("\n") <= README_MAX_LINES, "README.md: move reference into docs/"
    assert re.search(r"^make demo\b", text, re.M)
    assert re.search(r"^make test\b", text, re.M)


def _outside_code(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", _outside_code(path.read_text()), re.M)
    return {_slug(h) for h in headings}


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_points_at_an_existing_file(page: Path) -> None:
    broken = []
    for target in LINK.findall(_outside_code(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        anchored = not anchor or resolved.suffix != ".md" or anchor in _anchors(resolved)
        if not resolved.exists() or not anchored:
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


CODE = re.compile(r"`([^`\s]+)`")


def _named_paths(text: str) -> list[str]:
    """Paths in code spans: tokens with a ``/`` naming a file of the repository or, relative to
    exporter/inferwatch/, a module or folder of the package (``.py`` or ``/`` at the end)."""
    named = []
    for token in CODE.findall(_outside_code(text)):
        if "/" not in token or re.search(r"[<>*{}:|]", token) or token.startswith(("/", ".", "-")):
            continue  # a URL path, a placeholder, a pattern, a series, a flag
        if (REPO / token.split("/")[0]).is_dir() or token.endswith((".py", "/")):
            named.append(token)
    return named


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_named_exists(page: Path) -> None:
    missing = [
        p
        for p in _named_paths(page.read_text())
        if not (REPO / p).exists() and not (PACKAGE / p).exists()
    ]
    assert not missing, f"{page.name} names what does not exist: {missing}"


def package_modules() -> list[str]:
    """Every module of the package by its path under exporter/inferwatch/; a package by its
    folder (the package itself: ``exporter/inferwatch/``)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py":
            folder = relative.parent.as_posix()
            names.append("exporter/inferwatch/" if folder == "." else f"{folder}/")
        else:
            names.append(relative.as_posix())
    return names


def test_every_module_of_the_package_is_on_the_development_map() -> None:
    text = DEVELOPMENT.read_text()
    # A server's module is named by the registry: the map names their pattern once.
    servers = {f"collect/backends/servers/{module_name(name)}.py" for name in BACKENDS}
    assert servers <= set(package_modules()) and "`collect/backends/servers/<name>.py`" in text
    # So is an alert of a layer that is a package: `method/alerts/<layer>/<alert>.py`.
    alerts = {m for m in package_modules() if re.fullmatch(r"method/alerts/\w+/\w+\.py", m)}
    assert alerts and "`method/alerts/<layer>/<alert>.py`" in text
    by_pattern = servers | alerts
    missing = [m for m in package_modules() if m not in by_pattern and f"`{m}`" not in text]
    assert not missing, f"docs/development.md does not name: {missing}"
    assert "`collect/window.py`" in text and "`method/alerts/`" in text


def test_the_development_map_points_at_what_generates_the_promtool_tests() -> None:
    text = DEVELOPMENT.read_text()
    assert "`scenarios=`" in text and "never edit them" in text
    assert "`method/alerts/runbooks/<name>.md`" in text


# -- docs/performance.md: written by `make bench` -----------------------------------------

FIGURES = {
    "CPU per poll (fetch + normalize + derive)": "2.140 ms",
    "/metrics latency, 8 scrapers back to back": "p50 1.39 ms | p99 4.10 ms",
}
MACHINE = {"date": "2030-01-02", "cores (nproc)": "2", "CPU": "Example CPU @ 2.0GHz"}


def test_the_bench_region_holds_a_run_or_says_there_is_none() -> None:
    body = BENCH.body((REPO / PERFORMANCE).read_text())
    assert body == NOT_MEASURED or body.startswith("Measured by `make bench`"), body


def test_the_canary_region_holds_its_run_or_says_there_is_none() -> None:
    body = CANARY_BENCH.body((REPO / PERFORMANCE).read_text())
    measured = body.startswith("Measured by `bench/canary.py --write-docs`: ")
    assert measured or body == "Not measured yet: run `bench/canary.py --write-docs`.\n", body
    if measured:
        assert "| CPU with / without the canary |" in body, body


def test_the_fleet_region_holds_its_run_or_says_there_is_none() -> None:
    body = FLEET_BENCH.body((REPO / PERFORMANCE).read_text())
    measured = body.startswith("Measured by `bench/fleet.py --write-docs`: ")
    assert measured or body == "Not measured yet: run `bench/fleet.py --write-docs`.\n", body
    if measured:
        assert re.search(r"\| [\d,]+ replicas \| evaluation [\d.]+ s", body), body


@pytest.mark.parametrize("pinned", [False, True])
def test_the_readme_holds_an_e2e_run_of_each_kind_or_says_there_is_none(pinned: bool) -> None:
    body = E2E_TIMES[pinned].body(README.read_text())
    if body == "Not measured yet: run `make e2e-times`.\n":
        return
    assert body.startswith("Measured by `make e2e-times`: "), body
    cores = re.search(r"cores \(nproc\) (\d+)", body.splitlines()[0])
    assert cores and (cores[1] == "1") == pinned, body
    # A row per scenario, each saying when its alert came.
    for scenario in SCENARIOS:
        assert f"| {scenario.name} | {scenario.expect} " in body, scenario.name


def test_an_e2e_region_is_a_row_per_scenario() -> None:
    times = {"load ramp": "InferenceNearCapacity 34.9 s; never: InferenceQueueingDelay"}
    lines = figures_region(times, MACHINE, E2E_TIMES[True]).splitlines()
    assert lines[0].startswith("Measured by `make e2e-times`: date 2030-01-02, cores (nproc) 2")
    assert lines[2:] == [
        "| scenario | from the fault's onset |",
        "|---|---|",
        "| load ramp | InferenceNearCapacity 34.9 s; never: InferenceQueueingDelay |",
    ]


def test_the_bench_region_is_rendered_from_the_figures() -> None:
    body = figures_region(FIGURES, MACHINE)
    lines = body.splitlines()
    assert lines[0] == (
        "Measured by `make bench` (`bench/exporter.py --write-docs`): date 2030-01-02, "
        "cores (nproc) 2, CPU Example CPU @ 2.0GHz."
    )
    assert "| CPU per poll (fetch + normalize + derive) | 2.140 ms |" in lines
    assert "| /metrics latency, 8 scrapers back to back | p50 1.39 ms \\| p99 4.10 ms |" in lines
    assert body == figures_region(FIGURES, MACHINE)


def test_write_figures_replaces_only_its_region(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    original = (REPO / PERFORMANCE).read_text()
    page.write_text(original)
    write_figures(page, FIGURES, MACHINE)
    written = page.read_text()
    assert BENCH.body(written) == figures_region(FIGURES, MACHINE)
    start, stop = BENCH.span(written)
    ostart, ostop = BENCH.span(original)
    assert written[:start] == original[:ostart] and written[stop:] == original[ostop:]
    write_figures(page, {"one figure": "1 ms"}, MACHINE)  # a second run replaces the first
    assert "2.140 ms" not in page.read_text() and "| one figure | 1 ms |" in page.read_text()


def _bench_exporter():
    spec = importlib.util.spec_from_file_location("bench_exporter", REPO / "bench/exporter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_reports_what_it_prints_and_names_the_machine(capsys) -> None:
    bench = _bench_exporter()
    report = bench.Report()
    report("CPU per poll", "2.000 ms")
    assert capsys.readouterr().out == "CPU per poll: 2.000 ms\n"
    assert report.figures == {"CPU per poll": "2.000 ms"}
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\nmodel name\t: AMD\n"
    assert cpu_model(cpuinfo) == "AMD EPYC 7B13"
    machine = bench.machine(argparse.Namespace(seconds=20.0, vllm=True))
    assert list(machine) == ["date", "cores (nproc)", "CPU", "Python", "options"]
    assert machine["cores (nproc)"].isdigit() and machine["options"] == "--seconds 20 --vllm"
