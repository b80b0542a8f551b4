"""Names and label matchers of the SLO rules' series, shared by the recording and alert rules."""

from __future__ import annotations

import re

from inferwatch.method.slo.objectives import ModelObjectives, SLOs


def record(scope: str, kind: str, operation: str, events: str = "") -> str:
    """A recording rule's name: ``model:inferwatch_slo_ttft:burnrate1h``; with ``events``
    (``events``, ``bad_events``, ``finished``) an event rate's:
    ``model:inferwatch_slo_ttft_events:rate5m``."""
    return f"{scope}:inferwatch_slo_{kind}{'_' + events if events else ''}:{operation}"


def bucket_matcher(seconds: float) -> str:
    """The bucket at ``seconds`` however the bound is written: ``le=~`0.5``` (1 or 1.0 too)."""
    forms = {f"{seconds:g}", repr(seconds)}
    forms = {f for f in forms if "e" not in f}
    return "le=~`" + "|".join(sorted(re.escape(f) for f in forms)) + "`"


def model_matcher(group: ModelObjectives, slos: SLOs) -> str:
    """``model=`a``` for a model's own objectives; the default group leaves the others out."""
    if group.models:
        names = group.models
        op = "=" if len(names) == 1 else "=~"
    else:
        names = tuple(m for g in slos.groups for m in g.models)
        op = "!~"
        if not names:
            return ""
    if op == "=":
        return f"model=`{names[0]}`"
    return f"model{op}`" + "|".join(re.escape(n) for n in names) + "`"


def selector(*matchers: str) -> str:
    """``{a,b}`` of the matchers given (empty ones left out); nothing without any."""
    inner = ",".join(m for m in matchers if m)
    return f"{{{inner}}}" if inner else ""
