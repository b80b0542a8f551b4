"""Files that say one thing: no module of the package over 400 lines, no function over 60.

A module that grows past the bound is doing two things; a function past it hides steps
that want names. Split them rather than raising the bounds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "exporter" / "inferwatch"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_and_its_functions_are_short(module: Path) -> None:
    source = module.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{module.name}: {source.count(chr(10))} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module.name}: {', '.join(long)}"


def test_the_package_is_found() -> None:
    assert len(MODULES) > 50
