"""Shared test helpers: the captures in tests/fixtures and an oracle built on
prometheus_client's full text parser (an independent reading of the same page)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from demo.stack import VllmServer

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def oracle_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample on the page by its name on the wire, as prometheus_client reads it."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    # prometheus_client rejects the "-nan(ind)" MSVC prints for 0/0 (llama.cpp on Windows).
    text = text.replace(" -nan(ind)\n", " NaN\n")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            # The parser appends _total to counters that lack it (TGI, Triton); undo that.
            if name.endswith("_total") and not _on_page(text, name):
                name = name.removesuffix("_total")
            out.setdefault(name, []).append((dict(sample.labels), sample.value))
    return out


def _on_page(text: str, name: str) -> bool:
    return text.startswith(name) or f"\n{name}{{" in text or f"\n{name} " in text


def page_value(page: str, metric: str, **labels: str) -> float:
    """The value of the one sample ``metric`` whose labels include ``labels``."""
    matches = [
        value
        for sample_labels, value in oracle_samples(page).get(metric, [])
        if all(sample_labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, f"{metric}{labels}: {len(matches)} samples"
    return matches[0]


def same_number(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One real vLLM (CPU) for the session, started on first use (~1-2 min on 2 cores).

    Tests that stop it leave it stopped; the next user's ``ensure_running()`` restarts it.
    """
    server = VllmServer(tmp_path_factory.mktemp("vllm"))
    yield server
    server.stop()
