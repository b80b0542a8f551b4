"""Service level objectives: what users feel, as error budgets and multi-window burn-rate alerts.

An objective says which share of events must be good over a compliance window: "99 % of
requests get their first token within 0.5 s over 28 days". Its SLI comes from the server's
own series: good events are a histogram's bucket at the objective's bound (``le``), all
events its count; for ``errors``, finished requests less those that ended in a server error
(an abort is the client's choice and counts as neither good nor bad). The config section
(parsed strictly)::

    slos:
      window: 28d              # compliance window
      scope: model             # judge a model across its replicas; `instance`: each pod
      objectives:              # every model...
        errors: {target: 0.999}
        ttft: {target: 0.99, seconds: 0.5}
      models:                  # ...unless it has its own
        llama-3-70b:
          ttft: {target: 0.99, seconds: 2.5}

The generated recording rules (``model:`` or ``instance:`` level, by objective kind)::

    model:inferwatch_slo_ttft_events:rate5m        all events per second
    model:inferwatch_slo_ttft_bad_events:rate5m    events that missed the objective
    model:inferwatch_slo_errors_finished:rate1h    errors only: finished requests per second
                                                   by reason (5m, 30m and 1h)
    model:inferwatch_slo_ttft:burnrate1h           bad share over 1h / (1 - target)
    model:inferwatch_slo_ttft:error_budget_remaining   over the compliance window
    model:inferwatch_slo_ttft:objective            the target, on the model's labels

Alerts (:data:`BURNS` says when): ``InferenceSLOFastBurn`` pages, ``InferenceSLOSlowBurn``
files a ticket, ``InferenceSLOUnmeasured`` says an objective's bound is not a bucket of the
server's histogram. Their descriptions list the cause alerts of the same model: the method's
alerts explain the page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferwatch.settings import ConfigError, check_keys

_WINDOW = re.compile(r"^(\d+)(m|h|d)$")
_UNIT_HOURS = {"m": 1 / 60, "h": 1.0, "d": 24.0}


def hours(window: str) -> float:
    value, unit = _WINDOW.match(window).groups()
    return int(value) * _UNIT_HOURS[unit]


@dataclass(frozen=True)
class Kind:
    """What an objective of this kind measures, from which inferwatch series."""

    name: str
    title: str
    events: str  # what one event is
    histogram: str | None  # the latency histogram; None: finished requests by reason


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("ttft", "time to first token", "requests", "inferwatch_time_to_first_token_seconds"),
        Kind(
            "itl", "inter-token latency", "output tokens", "inferwatch_inter_token_latency_seconds"
        ),
        Kind("e2e", "end-to-end latency", "requests", "inferwatch_request_duration_seconds"),
        Kind("errors", "server errors", "finished requests", None),
    )
}

# Bucket bounds of the servers' histograms as they ship (real captures in tests/fixtures),
# per backend, one tuple per known layout: a latency bound must be one of them, else the SLI
# has no bucket to count good events in. Servers let users change buckets: for those the
# generated InferenceSLOUnmeasured alert says so at run time.
_VLLM_TTFT = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0),
    *(7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
_VLLM_ITL = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5),
    *(10.0, 20.0, 40.0, 80.0),
)
_VLLM_E2E = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
_SGLANG_2026 = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0)
BUCKET_BOUNDS: dict[str, dict[str, tuple[tuple[float, ...], ...]]] = {
    "vllm": {"ttft": (_VLLM_TTFT,), "itl": (_VLLM_ITL,), "e2e": (_VLLM_E2E,)},
    "sglang": {
        "ttft": (
            (*_VLLM_TTFT[:16], 15.0, 20.0, 25.0, 30.0),  # 0.3 docs
            (*_SGLANG_2026, 100.0, 200.0, 400.0),  # 2026
        ),
        "itl": (
            (
                *(0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2),
                *(0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
            ),
        ),
        "e2e": (
            _VLLM_E2E[:15],  # 0.3 docs
            (5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 200.0, 250.0, 300.0),  # 0.4.4
            (*_SGLANG_2026, 100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0),  # 2026
        ),
    },
}


@dataclass(frozen=True)
class Objective:
    kind: str
    target: float  # share of good events, e.g. 0.99
    seconds: float | None = None  # the latency bound; None for errors

    @property
    def budget(self) -> float:
        return 1 - self.target

    def text(self) -> str:
        """``99 % of requests get their first token within 0.5 s``."""
        kind = KINDS[self.kind]
        pct = f"{self.target * 100:g} %"
        if self.kind == "errors":
            return f"{pct} of {kind.events} end without a server error"
        return f"{pct} of {kind.events} within {self.seconds:g} s ({kind.title})"


@dataclass(frozen=True)
class ModelObjectives:
    """The objectives of some models; ``models`` empty: every model not named elsewhere."""

    models: tuple[str, ...]
    objectives: tuple[Objective, ...]


@dataclass(frozen=True)
class Burn:
    """One multi-window burn-rate condition: ``share`` of the budget gone within ``long``.

    It holds when the bad-event rate over ``long`` and over ``short`` (a twelfth of it: the
    alert resets soon after the burn stops) both exceed ``factor`` times the budget rate.
    """

    severity: str
    long: str
    short: str
    share: float  # of the whole window's budget

    def factor(self, window: str) -> float:
        return self.share * hours(window) / hours(self.long)


# The SRE workbook's table (for 30 days: 14.4x, 6x, 3x, 1x), kept as shares of the budget so
# that it means the same over any compliance window: page when 2 % of the budget goes in an
# hour or 5 % in six; file a ticket when 10 % goes in a day or in three.
BURNS = (
    Burn("critical", "1h", "5m", 0.02),
    Burn("critical", "6h", "30m", 0.05),
    Burn("warning", "1d", "2h", 0.10),
    Burn("warning", "3d", "6h", 0.10),
)
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# Burn-rate windows up to an hour (the fast burn's) are rates of the raw series; longer ones
# add up the recorded 5m rates. Raw, a day of every replica's samples is most of what the
# rules cost at fleet size (bench/fleet.py); added up, the newest minutes weigh 1/5 (a 5m
# rate's ramp), which would page on an outage ~2 min late but is nothing to a 2h+ window.
RAW_HOURS = 1.0
FAST, SLOW, UNMEASURED = "InferenceSLOFastBurn", "InferenceSLOSlowBurn", "InferenceSLOUnmeasured"
ALERT_NAMES = (FAST, SLOW, UNMEASURED)
SCOPES = ("model", "instance")


@dataclass(frozen=True)
class SLOs:
    window: str = "28d"
    scope: str = "model"
    groups: tuple[ModelObjectives, ...] = (ModelObjectives((), (Objective("errors", 0.999),)),)


def _objective(kind: str, value: Any, where: str, backend: str) -> Objective:
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown objective {kind!r} (known: {', '.join(KINDS)})")
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}.{kind}: expected a mapping with target (and seconds)")
    latency = KINDS[kind].histogram is not None
    check_keys(value, ("target", "seconds") if latency else ("target",), f"{where}.{kind}")
    target = value.get("target")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise ConfigError(f"{where}.{kind}.target: {target!r} is not a share between 0 and 1")
    seconds = value.get("seconds")
    if latency:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ConfigError(f"{where}.{kind}.seconds: {seconds!r} is not a positive number")
        _check_bound(kind, float(seconds), backend, f"{where}.{kind}.seconds")
    return Objective(kind, float(target), None if seconds is None else float(seconds))


def _check_bound(kind: str, seconds: float, backend: str, where: str) -> None:
    """``seconds`` must be a bucket bound of every known layout of the backend(s) served."""
    backends = [backend] if backend in BUCKET_BOUNDS else list(BUCKET_BOUNDS)
    if backend not in BUCKET_BOUNDS and backend != "auto":
        return  # no known layout (TGI, Triton, llama.cpp): InferenceSLOUnmeasured watches it
    missing = {
        name: layouts
        for name in backends
        for layouts in [BUCKET_BOUNDS[name].get(kind, ())]
        if any(seconds not in layout for layout in layouts)
    }
    if missing:
        listed = "; ".join(
            f"{name}: " + " | ".join(" ".join(f"{b:g}" for b in layout) for layout in layouts)
            for name, layouts in missing.items()
        )
        hint = "" if backend != "auto" else " (set `backend:` to check one server's)"
        raise ConfigError(
            f"{where}: {seconds:g} is not a bucket bound of the server's {KINDS[kind].title} "
            f"histogram{hint}; bounds {listed}"
        )


def slos_from_config(section: Any, backend: str = "auto") -> SLOs:
    """The ``slos:`` section; ``backend`` (the config's) says whose bucket bounds to check."""
    if section is None:
        return SLOs()
    if not isinstance(section, Mapping):
        raise ConfigError("slos: expected a mapping")
    check_keys(section, ("window", "scope", "objectives", "models"), "slos")
    window = str(section.get("window", SLOs.window))
    if not _WINDOW.match(window) or hours(window) < hours("3d"):
        raise ConfigError(f"slos.window: {window!r} is not a duration like 28d of 3d or more")
    scope = section.get("scope", SLOs.scope)
    if scope not in SCOPES:
        raise ConfigError(f"slos.scope: {scope!r} is not one of {', '.join(SCOPES)}")
    groups = []
    # Without `objectives:` every model keeps the default ones; `objectives: {}` has none.
    default = section.get("objectives", {"errors": {"target": 0.999}})
    models = section.get("models") or {}
    if not isinstance(models, Mapping):
        raise ConfigError("slos.models: expected a mapping of model names to objectives")
    sections = [((), "slos.objectives", default)]
    sections += [((str(m),), f"slos.models.{m}", v) for m, v in models.items()]
    for chosen, where, value in sections:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of objectives")
        objectives = tuple(_objective(k, v, where, backend) for k, v in value.items())
        factor = max(b.factor(window) for b in BURNS)
        for o in objectives:
            if factor * o.budget > 1:
                raise ConfigError(
                    f"{where}.{o.kind}.target: {o.target:g} leaves a budget the fastest burn "
                    f"({factor:.3g}x over {BURNS[0].long}) cannot reach; use at least "
                    f"{1 - 1 / factor:.4g}"
                )
        if objectives:
            groups.append(ModelObjectives(chosen, objectives))
    return SLOs(window=window, scope=scope, groups=tuple(groups))


# ---------------------------------------------------------------------------------------
# Rules


def _le(seconds: float) -> str:
    """A matcher for the bucket at ``seconds`` however the bound is written (0.5, 1 or 1.0)."""
    forms = {f"{seconds:g}", repr(seconds)}
    forms = {f for f in forms if "e" not in f}
    return "le=~`" + "|".join(sorted(re.escape(f) for f in forms)) + "`"


def _model_matcher(group: ModelObjectives, slos: SLOs) -> str:
    """``model="a"`` for a model's own objectives; the default group leaves the others out."""
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


def _selector(*matchers: str) -> str:
    inner = ",".join(m for m in matchers if m)
    return f"{{{inner}}}" if inner else ""


def _events(o: Objective, by: str, sel: str, window: str, finished: str) -> tuple[str, str]:
    """(all events, bad events) per second over a raw ``window``, as PromQL. For ``errors``
    both come from ``finished``, the recording of finished requests by reason over that
    window: the raw series are read once, and a request's reason says if it was bad."""
    if o.kind == "errors":
        total = f"sum without (reason) ({finished}{_selector(sel)})"
        errors = f"sum without (reason) ({finished}{_selector(sel, 'reason=`error`')})"
        # A server that never failed may have no `error` series at all: that is zero errors.
        return total, f"({errors} or 0 * {total})"
    hist = KINDS[o.kind].histogram
    total = f"sum {by} (rate({hist}_count{_selector(sel)}[{window}]))"
    good = f"sum {by} (rate({hist}_bucket{_selector(sel, _le(o.seconds))}[{window}]))"
    return total, f"({total} - {good})"


def _finished(o: Objective, by: str, sel: str, window: str, name: str) -> list[Rule]:
    """For ``errors``, the rule :func:`_events` reads over a raw window; none for others."""
    if o.kind != "errors":
        return []
    by_reason = by.replace(")", ", reason)") if by.startswith("by") else by
    expr = f"sum {by_reason} (rate(inferwatch_requests_finished_total{_selector(sel)}[{window}]))"
    return [Rule(name, expr, o.kind)]


def record(scope: str, kind: str, operation: str, events: str = "") -> str:
    """A recording rule's name: ``model:inferwatch_slo_ttft:burnrate1h``; with ``events``
    (``events``, ``bad_events``, ``finished``) an event rate's:
    ``model:inferwatch_slo_ttft_events:rate5m``."""
    return f"{scope}:inferwatch_slo_{kind}{'_' + events if events else ''}:{operation}"


@dataclass(frozen=True)
class Rule:
    """A recording rule; every one carries its objective's kind as ``slo``."""

    record: str
    expr: str
    slo: str


def recording_rules(slos: SLOs, fleet_labels: tuple[str, ...]) -> list[Rule]:
    """Per objective kind and model group: event rates, burn rates, budget, objective."""
    level = slos.scope
    by = f"by ({', '.join(fleet_labels)})" if level == "model" else "without (engine)"
    out = []
    for group in slos.groups:
        sel = _model_matcher(group, slos)
        for o in group.objectives:
            events = record(level, o.kind, "rate5m", "events")
            bad_events = record(level, o.kind, "rate5m", "bad_events")
            finished = record(level, o.kind, "rate5m", "finished")
            out += _finished(o, by, sel, "5m", finished)
            total, bad = _events(o, by, sel, "5m", finished)
            out.append(Rule(events, total, o.kind))
            out.append(Rule(bad_events, bad, o.kind))
            only = _selector(sel)
            out.append(
                Rule(
                    record(level, o.kind, "burnrate5m"),
                    f"{bad_events}{only}\n  / ({events}{only} > 0)\n  / {o.budget:g}",
                    o.kind,
                )
            )
            for window in WINDOWS[1:]:
                if hours(window) <= RAW_HOURS:
                    finished = record(level, o.kind, f"rate{window}", "finished")
                    out += _finished(o, by, sel, window, finished)
                    total, bad = _events(o, by, sel, window, finished)
                else:
                    bad = f"sum_over_time({bad_events}{only}[{window}])"
                    total = f"sum_over_time({events}{only}[{window}])"
                out.append(
                    Rule(
                        record(level, o.kind, f"burnrate{window}"),
                        f"{bad}\n  / ({total} > 0)\n  / {o.budget:g}",
                        o.kind,
                    )
                )
            w = slos.window
            out.append(
                Rule(
                    record(level, o.kind, "error_budget_remaining"),
                    f"1 - sum_over_time({bad_events}{only}[{w}])\n"
                    f"  / (sum_over_time({events}{only}[{w}]) > 0)\n  / {o.budget:g}",
                    o.kind,
                )
            )
            out.append(
                Rule(
                    record(level, o.kind, "objective"),
                    f"0 * {events}{only} + {o.target:g}",
                    o.kind,
                )
            )
    return out


def _same_series(scope: str) -> tuple[str, str]:
    """(matchers, printf arguments) selecting the alert's own model (and pod) in a query."""
    if scope == "instance":
        return 'model="%s",namespace="%s",instance="%s"', (
            "$labels.model $labels.namespace $labels.instance"
        )
    return 'model="%s",namespace="%s"', "$labels.model $labels.namespace"


def _causes(scope: str) -> str:
    """Go template: the cause alerts of the alert's model (any state), or a word that none."""
    match, args = _same_series(scope)
    query = f'ALERTS{{{match},slo=""}}'
    return (
        f"{{{{ with printf `{query}` {args} | query }}}}"
        "{{ range $i, $a := . }}{{ if $i }}, {{ end }}"
        "{{ $a.Labels.alertname }} ({{ $a.Labels.alertstate }}){{ end }}"
        "{{ else }}none yet: the cause alerts need their `for` to pass, see the triage "
        "dashboard{{ end }}"
    )


def alert_rules(slos: SLOs, runbook_url_base: str, paging: str = "slo") -> list[dict[str, Any]]:
    """The burn-rate alerts and the unmeasured-objective alert, one rule per objective."""
    level = slos.scope
    where = "{{ $labels.model }}" + (" on {{ $labels.instance }}" if level == "instance" else "")
    page = "critical" if paging == "slo" else "warning"
    rules = []
    # BURNS' severity names the tier (page or ticket); the page's label follows ``paging``.
    for alert, tier, severity in ((FAST, "critical", page), (SLOW, "warning", "warning")):
        burns = [b for b in BURNS if b.severity == tier]
        for group in slos.groups:
            sel = _selector(_model_matcher(group, slos))
            for o in group.objectives:
                parts = []
                for b in burns:
                    f = f"{b.factor(slos.window):.4g}"
                    long, short = (record(level, o.kind, f"burnrate{w}") for w in (b.long, b.short))
                    parts.append(f"(\n  {long}{sel} > {f}\n  and {short}{sel} > {f}\n)")
                said = " or ".join(
                    f"{b.factor(slos.window):.3g}x over {b.long} and {b.short}" for b in burns
                )
                rules.append(
                    {
                        "alert": alert,
                        "expr": "\nor\n".join(parts),
                        "labels": {"severity": severity, "slo": o.kind, "layer": "slo"},
                        "annotations": {
                            "summary": f"{where}: the {KINDS[o.kind].title} objective burns "
                            f"its error budget{' fast' if alert == FAST else ''}",
                            "description": f"Objective: {o.text()} over {slos.window}. The "
                            'budget burns at {{ $value | printf "%.3g" }}x the sustainable rate '
                            f"(threshold {said}); "
                            + _value(
                                record(level, o.kind, "error_budget_remaining"),
                                level,
                                "humanizePercentage",
                            )
                            + f" of the {slos.window} budget is left. Cause alerts of this "
                            "model: " + _causes(level) + ".",
                            "runbook_url": runbook_url_base + alert + ".md",
                        },
                    }
                )
    for group in slos.groups:
        sel = _model_matcher(group, slos)
        for o in group.objectives:
            if o.kind == "errors":
                continue
            hist = KINDS[o.kind].histogram
            events = record(level, o.kind, "rate5m", "events")
            rules.append(
                {
                    "alert": UNMEASURED,
                    "expr": f"{events}{_selector(sel)} > 0\n"
                    f"unless {record(level, o.kind, 'burnrate5m')}{_selector(sel)}",
                    "for": "10m",
                    "labels": {"severity": "warning", "slo": o.kind, "layer": "slo"},
                    "annotations": {
                        "summary": f"{where}: the {KINDS[o.kind].title} objective cannot be "
                        "measured",
                        "description": f"Objective: {o.text()}. {KINDS[o.kind].events.capitalize()}"
                        f" arrive but {hist} has no bucket at {o.seconds:g} s; the server's "
                        "bounds are "
                        + _bounds(hist)
                        + ". Set the objective's seconds to one of them (or give the server "
                        "that bucket) and regenerate the rules.",
                        "runbook_url": runbook_url_base + UNMEASURED + ".md",
                    },
                }
            )
    return rules


def _value(name: str, level: str, fmt: str) -> str:
    """Go template: the value of record ``name`` for the alert's own model (and pod)."""
    match, args = _same_series(level)
    return (
        f"{{{{ with printf `{name}{{{match}}}` {args} | query }}}}"
        f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}n/a{{{{ end }}}}"
    )


def _bounds(hist: str) -> str:
    query = f'count by (le) ({hist}_bucket{{model="%s",le!="+Inf"}})'
    return (
        f'{{{{ range printf `{query}` $labels.model | query | sortByLabel "le" }}}}'
        "{{ .Labels.le }} {{ end }}"
    )
