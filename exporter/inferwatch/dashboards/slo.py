"""The "Service level objectives" row of the triage dashboard: error budget, burn rates, SLI.

The panels read every objective the config's ``slos:`` section defines, through a name
regex over the SLO recording rules, so they need no change when objectives are added.
"""

from __future__ import annotations

from inferwatch.dashboards.queries import MODEL, NO_SLO, TARGET, PanelSpec, Query
from inferwatch.method.slo import BURNS, WINDOWS, record
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel


def _slo_series(spec: Spec, operation: str, events: str = "") -> str:
    """Every objective's record ``operation`` (of ``events``, see :func:`record`) at once:
    ``{__name__=~"model:inferwatch_slo_[a-z0-9]+:objective", ...}``.

    A name regex, so that the panels show whichever objectives the config has.
    """
    level = spec.slos.scope
    selector = MODEL if level == "model" else TARGET
    return f'{{__name__=~"{record(level, "[a-z0-9]+", operation, events)}", {selector}}}'


def slo_panels(spec: Spec) -> list[PanelSpec]:
    """Error budget, burn rates and SLI of every objective (``slos:`` in the config)."""
    slos = spec.slos
    who = "{{model}}" if slos.scope == "model" else "{{model}} {{instance}}"
    kinds = ", ".join(dict.fromkeys(o.kind for g in slos.groups for o in g.objectives))
    # The burn-rate alerts' long windows (each with its threshold) and the shortest one.
    windows = [WINDOWS[0], *dict.fromkeys(b.long for b in BURNS)]
    factors = sorted({(float(b.threshold(slos.window)), b.severity) for b in BURNS})
    said = ", ".join(f"{b.factor(slos.window):.3g}x over {b.long}" for b in BURNS)
    per = "model" if slos.scope == "model" else "instance"
    return [
        PanelSpec(
            Panel.SLO_BUDGET,
            f"Share of each objective's {slos.window} error budget still left, per objective "
            f"({kinds or 'none configured'}) and {per}. 100 %: no bad events yet; 0 %: the "
            "budget is spent; below 0 the objective is missed.",
            [Query(_slo_series(spec, "error_budget_remaining"), f"{{{{slo}}}} {who}")],
            unit="percentunit",
            kind="stat",
            width=6,
            no_value=NO_SLO,
            thresholds=[(None, "red"), (0, "yellow"), (0.25, "green")],
        ),
        PanelSpec(
            Panel.SLO_BURN,
            "How fast each objective spends its budget: bad-event share over the window "
            "divided by the budget (1x spends it exactly over "
            f"{slos.window}). The dashed lines are the burn-rate alerts' thresholds ({said}); "
            "an alert also needs its short window (a twelfth of the long one) above the line.",
            [
                Query(_slo_series(spec, f"burnrate{window}"), f"{{{{slo}}}} {window} {who}")
                for window in windows
            ],
            width=10,
            no_value=NO_SLO,
            thresholds=[(None, "green")]
            + [(f, "red" if sev == "critical" else "orange") for f, sev in factors],
        ),
        PanelSpec(
            Panel.SLO_SLI,
            "The SLI: share of good events over the last 5 minutes (requests or tokens within "
            "the latency bound, requests finished without a server error), next to the "
            "objective's target. Below the target line, the budget burns.",
            [
                Query(
                    f"1 - {_slo_series(spec, 'rate5m', 'bad_events')}\n"
                    f"  / ({_slo_series(spec, 'rate5m', 'events')} > 0)",
                    f"{{{{slo}}}} SLI {who}",
                ),
                Query(_slo_series(spec, "objective"), f"{{{{slo}}}} objective {who}"),
            ],
            unit="percentunit",
            width=8,
            no_value=NO_SLO,
        ),
    ]
