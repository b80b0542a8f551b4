"""Keeps the README's metric table equal to the contract (``metrics.py``).

``make generate`` runs ``python -m inferwatch.tools.readme README.md``; the table sits
between two HTML comments and is rewritten from :func:`inferwatch.metrics.markdown_table`.
tests/test_readme.py fails while the committed README says otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

from inferwatch.metrics import markdown_table

BEGIN = "<!-- metric table: generated from exporter/inferwatch/metrics.py by make generate -->\n"
END = "<!-- end of metric table -->\n"


def with_table(text: str) -> str:
    """The README text with its metric table region rewritten from the contract."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + markdown_table() + text[end:]


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    path.write_text(with_table(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
