"""The README's metric table is the contract in ``metrics.py``, row for row."""

from __future__ import annotations

from pathlib import Path

from inferwatch.metrics import ALL
from inferwatch.tools.readme import BEGIN, END, with_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_metric_table_is_the_contract() -> None:
    text = README.read_text()
    assert text == with_table(text), "README metric table differs from metrics.py: make generate"


def test_every_contract_family_has_a_row() -> None:
    text = README.read_text()
    table = text[text.index(BEGIN) : text.index(END)]
    rows = [line for line in table.splitlines() if line.startswith("| `inferwatch_")]
    assert [row.split("`")[1] for row in rows] == [d.name for d in ALL.values()]
