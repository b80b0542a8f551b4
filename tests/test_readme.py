"""The README's metric and alert tables are their definitions, row for row."""

from __future__ import annotations

from pathlib import Path

from inferwatch.method.alerts import ALERTS
from inferwatch.metrics import ALL
from inferwatch.tools.readme import TABLES, alert_table, with_tables

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tables_are_generated() -> None:
    text = README.read_text()
    assert text == with_tables(text), "README tables differ from their definitions: make generate"


def _region(text: str, index: int) -> str:
    (begin, end), _ = TABLES[index]
    return text[text.index(begin) : text.index(end)]


def test_every_contract_family_has_a_row() -> None:
    rows = [line for line in _region(README.read_text(), 0).splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [d.name for d in ALL.values()]


def test_every_cause_alert_has_a_row_saying_when_it_fires() -> None:
    rows = [line for line in _region(README.read_text(), 1).splitlines() if line.startswith("| [")]
    assert [row[3 : row.index("]")] for row in rows] == list(ALERTS)
    gap = next(row for row in alert_table().splitlines() if "[InferenceClientGap]" in row)
    assert "| warning | any / system | pod | client gap (canary TTFT - server TTFT) > 100 ms" in gap
    errors = next(row for row in rows if "[InferenceRequestErrors]" in row)
    assert "warning (critical with `paging: causes`)" in errors
    down = next(row for row in rows if "[InferenceBackendDown]" in row)
    assert (
        "| critical | any / availability | pod | backend up == 0 or exporter up == 0, for 1m |"
        in down
    )
