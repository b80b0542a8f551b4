"""A registered backend has what only a person can give it, and nothing else is listed by hand.

``BACKENDS`` is the one list of servers: every other test asks it. What cannot be derived
from it (a server's real captures, the test asserting their values) is checked here against
it, so that a backend added
without one fails here, by name.
"""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

from inferwatch.collect.backends import BACKENDS, module_name, servers

from conftest import FIXTURES, captures_of

REPO = Path(__file__).resolve().parents[1]
CONTRACT = "Each server's backend module knows only the mapping engine"


def independent_modules() -> list[str]:
    """The modules of the lint-imports contract that keeps the servers' modules apart."""
    text = (REPO / "pyproject.toml").read_text()
    block = text[text.index(f'name = "{CONTRACT}"') :].split("[[", 1)[0]
    return re.findall(r'"(inferwatch\.[\w.*]+)"', block)


def test_lint_imports_keeps_every_server_module_apart_from_the_others() -> None:
    assert independent_modules() == ["inferwatch.collect.backends.servers.*"]
    found = {m.name for m in pkgutil.iter_modules(servers.__path__)}
    assert found == {module_name(name) for name in BACKENDS}  # a module is named after its backend


@pytest.mark.parametrize("name", BACKENDS)
def test_every_registered_backend_has_its_own_test(name: str) -> None:
    assert (REPO / "tests" / f"test_backend_{module_name(name)}.py").is_file(), name


@pytest.mark.parametrize("name", BACKENDS)
def test_every_registered_backend_has_real_captures_with_their_source(name: str) -> None:
    captures = [FIXTURES / c for c in captures_of(name)]
    assert captures, f"tests/fixtures/ holds no {name}-*.prom capture"
    for capture in captures:
        assert capture.read_text().startswith("# source: "), capture.name
