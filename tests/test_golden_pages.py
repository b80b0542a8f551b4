"""Whole pages: what inferwatch serves for each real capture, against a committed copy.

The exact-value tests check the mapping series by series; these catch everything else a
change moves on the page (a family renamed, a label reordered, a HELP text, a series that
appears or goes). After an intended change, rewrite the copies with
``pytest tests/test_golden_pages.py --update-golden`` and read the diff before committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.collect.backends import detect
from inferwatch.model import CollectorStatus, Snapshot
from inferwatch.serve.exposition import render

from conftest import FIXTURES

GOLDEN = Path(__file__).parent / "golden"
CAPTURES = sorted(p.name for p in FIXTURES.glob("*.prom"))


def served_page(capture: str) -> str:
    """The text page of one good poll of a server answering ``capture`` (fixed durations,
    no GPU: nothing on it depends on the machine or the time)."""
    text = (FIXTURES / capture).read_text()
    backend = detect(text)
    snap = Snapshot(
        backend_kind=backend.name,
        backend_up=True,
        backend_scrape_seconds=0.003,
        backend=backend.normalize(text, model_hint="served-model"),
        collectors={"backend": CollectorStatus(True, 0.003)},
    )
    return render(snap).decode()


@pytest.mark.parametrize("capture", CAPTURES)
def test_served_page_is_the_committed_one(capture: str, request: pytest.FixtureRequest) -> None:
    page = served_page(capture)
    golden = GOLDEN / capture
    if request.config.getoption("--update-golden"):
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(page)
    assert golden.exists(), f"no {golden}: run pytest {__file__} --update-golden"
    assert page == golden.read_text(), f"{capture}: the served page changed (--update-golden)"


def test_every_golden_page_has_its_capture() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.prom")) == CAPTURES
