"""The SLO alert rules: fast and slow burn of each objective's budget, and an unmeasurable bound.

A sample, the fast burn of ``ttft`` judged per model over 28 days::

    alert: InferenceSLOFastBurn
    expr: (model:inferwatch_slo_ttft:burnrate1h > 13.44
           and model:inferwatch_slo_ttft:burnrate5m > 13.44)
          or (model:inferwatch_slo_ttft:burnrate6h > 5.6
           and model:inferwatch_slo_ttft:burnrate30m > 5.6)
    labels: {severity: critical, slo: ttft, layer: slo}

The descriptions query Prometheus when the alert fires: the budget left, the cause alerts of
the same model (the method's alerts explain the page), the server's bucket bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferwatch.method.slo.burns import BURNS, Burn
from inferwatch.method.slo.objectives import KINDS, Objective, SLOs
from inferwatch.method.slo.series import model_matcher, record, selector

FAST, SLOW, UNMEASURED = "InferenceSLOFastBurn", "InferenceSLOSlowBurn", "InferenceSLOUnmeasured"
ALERT_NAMES = (FAST, SLOW, UNMEASURED)


def alert_rules(
    slos: SLOs, runbook: Callable[[str], dict[str, str]], paging: str = "slo"
) -> list[dict[str, Any]]:
    """The burn-rate alerts and the unmeasured-objective alert, one rule per objective."""
    page = "critical" if paging == "slo" else "warning"
    # BURNS' severity names the tier (page or ticket); the page's label follows ``paging``.
    rules = [
        _burn_alert(
            alert,
            severity,
            [burn for burn in BURNS if burn.severity == tier],
            objective,
            selector(model_matcher(group, slos)),
            slos,
            runbook,
        )
        for alert, tier, severity in ((FAST, "critical", page), (SLOW, "warning", "warning"))
        for group in slos.groups
        for objective in group.objectives
    ]
    rules += [
        _unmeasured_alert(objective, selector(model_matcher(group, slos)), slos, runbook)
        for group in slos.groups
        for objective in group.objectives
        if objective.kind != "errors"
    ]
    return rules


def _burn_alert(
    alert: str,
    severity: str,
    burns: list[Burn],
    objective: Objective,
    own: str,
    slos: SLOs,
    runbook: Callable[[str], dict[str, str]],
) -> dict[str, Any]:
    """``alert`` (fast or slow burn) of one objective: any of ``burns`` holds for its models
    (selector ``own``)."""
    level, kind, window = slos.scope, objective.kind, slos.window
    conditions = []
    for burn in burns:
        threshold = burn.threshold(window)
        long, short = (record(level, kind, f"burnrate{w}") for w in (burn.long, burn.short))
        conditions.append(f"(\n  {long}{own} > {threshold}\n  and {short}{own} > {threshold}\n)")
    said = " or ".join(f"{b.factor(window):.3g}x over {b.long} and {b.short}" for b in burns)
    budget_left = _recorded_value(
        record(level, kind, "error_budget_remaining"), level, "humanizePercentage"
    )
    return {
        "alert": alert,
        "expr": "\nor\n".join(conditions),
        "labels": {"severity": severity, "slo": kind, "layer": "slo"},
        "annotations": {
            "summary": f"{_where(level)}: the {KINDS[kind].title} objective burns its error "
            f"budget{' fast' if alert == FAST else ''}",
            "description": f"Objective: {objective.text()} over {window}. The budget burns at "
            '{{ $value | printf "%.3g" }}x the sustainable rate '
            f"(threshold {said}); {budget_left} of the {window} budget is left. Cause alerts "
            f"of this model: {_cause_alerts(level)}.",
            **runbook(alert),
        },
    }


def _unmeasured_alert(
    objective: Objective, own: str, slos: SLOs, runbook: Callable[[str], dict[str, str]]
) -> dict[str, Any]:
    """Events arrive for a latency objective's models (selector ``own``) but its bound is not
    a bucket of the server's histogram, so no burn rate is recorded."""
    level, kind = slos.scope, KINDS[objective.kind]
    events = record(level, kind.name, "rate5m", "events")
    return {
        "alert": UNMEASURED,
        "expr": f"{events}{own} > 0\nunless {record(level, kind.name, 'burnrate5m')}{own}",
        "for": "10m",
        "labels": {"severity": "warning", "slo": kind.name, "layer": "slo"},
        "annotations": {
            "summary": f"{_where(level)}: the {kind.title} objective cannot be measured",
            "description": f"Objective: {objective.text()}. {kind.events.capitalize()} arrive "
            f"but {kind.histogram} has no bucket at {objective.seconds:g} s; the server's bounds "
            f"are {_server_bounds(kind.histogram)}. Set the objective's seconds to one of them "
            "(or give the server that bucket) and regenerate the rules.",
            **runbook(UNMEASURED),
        },
    }


def _where(scope: str) -> str:
    """Go template: the alert's model (and pod), for its summary."""
    return "{{ $labels.model }}" + (" on {{ $labels.instance }}" if scope == "instance" else "")


def _own_series(scope: str) -> tuple[str, str]:
    """(matchers, printf arguments) selecting the alert's own model (and pod) in a query."""
    if scope == "instance":
        return 'model="%s",namespace="%s",instance="%s"', (
            "$labels.model $labels.namespace $labels.instance"
        )
    return 'model="%s",namespace="%s"', "$labels.model $labels.namespace"


def _cause_alerts(scope: str) -> str:
    """Go template: the cause alerts of the alert's model (any state), or a word that none."""
    match, args = _own_series(scope)
    query = f'ALERTS{{{match},slo=""}}'
    return (
        f"{{{{ with printf `{query}` {args} | query }}}}"
        "{{ range $i, $a := . }}{{ if $i }}, {{ end }}"
        "{{ $a.Labels.alertname }} ({{ $a.Labels.alertstate }}){{ end }}"
        "{{ else }}none yet: the cause alerts need their `for` to pass, see the triage "
        "dashboard{{ end }}"
    )


def _recorded_value(name: str, scope: str, fmt: str) -> str:
    """Go template: the value of record ``name`` for the alert's own model (and pod)."""
    match, args = _own_series(scope)
    return (
        f"{{{{ with printf `{name}{{{match}}}` {args} | query }}}}"
        f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}n/a{{{{ end }}}}"
    )


def _server_bounds(histogram: str) -> str:
    """Go template: the bucket bounds the alert's model's server has for ``histogram``."""
    query = f'count by (le) ({histogram}_bucket{{model="%s",le!="+Inf"}})'
    return (
        f'{{{{ range printf `{query}` $labels.model | query | sortByLabel "le" }}}}'
        "{{ .Labels.le }} {{ end }}"
    )
