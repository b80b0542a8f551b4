"""The alerts' runbooks: one Markdown template per alert, beside the layers.

``inferwatch/method/alerts/runbooks/<Alert>.md`` is what the method says of the alert, in
five sections: what it means, the triage dashboard's panels that confirm it, its likely
causes, what to change, when to escalate. ``inferwatch generate`` writes it into
``alerts/runbooks/<Alert>.md`` between the alert's labels and its rule (expression,
thresholds), with the capture evidence where the alert has some. The confirm section's items
name dashboard panels (``- **<panel title>**: what it shows.``); the dashboards link each
cited panel back to the runbook.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from inferwatch.method.alerts import ALERTS
from inferwatch.method.slo import ALERT_NAMES as SLO_ALERTS
from inferwatch.panels import Panel

SECTIONS = (
    "## What it means",
    "## Confirm on the dashboard",
    "## Likely causes, most likely first",
    "## What to change",
    "## When to escalate",
)
_CONFIRM = re.compile(r"- \*\*(?P<panel>[^*]+)\*\*: (?P<what>.+)\.")


@dataclass(frozen=True)
class Runbook:
    """An alert's runbook template and the panels it cites to confirm the alert."""

    name: str
    text: str  # Markdown, from "## What it means" to the escalation's paragraph
    confirm: tuple[tuple[Panel, str], ...]


def templates() -> list[str]:
    """The names of the alerts that have a runbook template."""
    folder = resources.files("inferwatch.method.alerts") / "runbooks"
    return sorted(p.name.removesuffix(".md") for p in folder.iterdir() if p.name.endswith(".md"))


def load_runbook(name: str) -> Runbook:
    """The runbook template of alert ``name``, its sections and cited panels checked."""
    where = f"inferwatch/method/alerts/runbooks/{name}.md"
    path = resources.files("inferwatch.method.alerts") / "runbooks" / f"{name}.md"
    if not path.is_file():
        raise LookupError(f"{name} has no runbook: write {where}")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    headings = tuple(line for line in lines if line.startswith("#"))
    if headings != SECTIONS or not text.startswith(SECTIONS[0]) or not text.endswith("\n"):
        raise ValueError(f"{where}: its sections are {headings}, expected {SECTIONS}")
    section = lines[lines.index(SECTIONS[1]) : lines.index(SECTIONS[2])]
    confirm = []
    for line in section:
        if line.startswith("- "):
            item = _CONFIRM.fullmatch(line)
            if item is None:
                raise ValueError(f"{where}: {line!r} is not '- **<panel>**: <what it shows>.'")
            try:
                confirm.append((Panel(item["panel"]), item["what"]))
            except ValueError:
                raise ValueError(f"{where}: no dashboard has a panel {item['panel']!r}") from None
    return Runbook(name, text, tuple(confirm))


# Every alert's runbook, cause and SLO alerts alike (the rules' pages, the dashboards' links).
RUNBOOKS = {name: load_runbook(name) for name in (*ALERTS, *SLO_ALERTS)}
