"""Keeps the README's metric and alert tables equal to their definitions.

``make generate`` runs ``python -m inferwatch.tools.readme README.md``; each table sits
between two HTML comments and is rewritten: the metric table from the contract
(:func:`inferwatch.metrics.markdown_table`), the cause alerts from the alert table with the
default thresholds (:func:`alert_table`). tests/test_readme.py fails while the committed
README says otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from inferwatch.method.alerts import ALERTS, OUTSIDE_THE_SLIS, Cond
from inferwatch.method.findings import fmt
from inferwatch.method.signals import MODEL, SIGNALS
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.metrics import markdown_table


def _region(name: str, source: str) -> tuple[str, str]:
    return (
        f"<!-- {name} table: generated from exporter/inferwatch/{source} by make generate -->\n",
        f"<!-- end of {name} table -->\n",
    )


def _condition(cond: Cond, spec: Spec) -> str:
    signal = SIGNALS[cond.signal]
    return f"{signal.label} {cond.op} {fmt(cond.bound(spec), signal.unit)}"


def alert_table(spec: Spec | None = None) -> str:
    """One row per cause alert: severity, phase / layer, scope and when it fires."""
    spec = spec_from_config({}) if spec is None else spec
    rows = [
        "| alert | severity | phase / layer | scope | fires when (defaults) |",
        "|---|---|---|---|---|",
    ]
    for alert in ALERTS.values():
        severity = spec.severity(alert)
        if alert.severity == "critical" and alert.name not in OUTSIDE_THE_SLIS:
            severity += " (critical with `paging: causes`)"
        when = ", ".join(_condition(c, spec) for c in alert.when)
        when += " or ".join(_condition(c, spec) for c in alert.any_of)
        if alert.unless:
            when += ", unless " + " or ".join(_condition(c, spec) for c in alert.unless)
        rows.append(
            f"| [{alert.name}](alerts/runbooks/{alert.name}.md) | {severity} | {alert.phase} / "
            f"{alert.layer} | {'model' if alert.level == MODEL else 'pod'} | {when}, for "
            f"{spec.timing.for_alert(alert)} |"
        )
    return "\n".join(rows) + "\n"


TABLES: tuple[tuple[tuple[str, str], Callable[[], str]], ...] = (
    (_region("metric", "metrics.py"), markdown_table),
    (_region("alert", "method/alerts.py"), alert_table),
)


def with_tables(text: str) -> str:
    """The README text with each table region rewritten from its definition."""
    for (begin, end), table in TABLES:
        start, stop = text.index(begin) + len(begin), text.index(end)
        text = text[:start] + table() + text[stop:]
    return text


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    path.write_text(with_tables(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
