"""The SLO recording rules: per objective, event rates, burn rates, budget left and target.

A sample, for ``ttft: {target: 0.99, seconds: 0.5}`` judged per model::

    model:inferwatch_slo_ttft_events:rate5m
      sum by (namespace, backend, model) (rate(inferwatch_time_to_first_token_seconds_count[5m]))
    model:inferwatch_slo_ttft:burnrate1h     (up to an hour: the raw series)
      (sum by (...) (rate(..._count[1h])) - sum by (...) (rate(..._bucket{le=~`0\\.5`}[1h])))
      / (sum by (...) (rate(..._count[1h])) > 0) / 0.01
    model:inferwatch_slo_ttft:burnrate1d     (longer: the recorded 5m rates added up)
      sum_over_time(model:inferwatch_slo_ttft_bad_events:rate5m[1d])
      / (sum_over_time(model:inferwatch_slo_ttft_events:rate5m[1d]) > 0) / 0.01
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.method.durations import hours
from inferwatch.method.slo.burns import LONGEST_RAW_WINDOW, WINDOWS
from inferwatch.method.slo.objectives import FINISHED_REQUESTS, KINDS, Objective, SLOs
from inferwatch.method.slo.series import bucket_matcher, model_matcher, record, selector


@dataclass(frozen=True)
class Rule:
    """A recording rule; every one carries its objective's kind as ``slo``."""

    record: str
    expr: str
    slo: str


def recording_rules(slos: SLOs, fleet_labels: tuple[str, ...]) -> list[Rule]:
    """Per objective kind and model group: event rates, burn rates, budget, objective."""
    by = f"by ({', '.join(fleet_labels)})" if slos.scope == "model" else "without (engine)"
    return [
        rule
        for group in slos.groups
        for objective in group.objectives
        for rule in _objective_rules(objective, slos, by, model_matcher(group, slos))
    ]


def _objective_rules(objective: Objective, slos: SLOs, by: str, matcher: str) -> list[Rule]:
    """One objective's rules, over its models' series (``matcher``) summed ``by``: event
    rates over 5m, a burn rate over every window, the budget left and the target."""
    level, kind, budget = slos.scope, objective.kind, f"{objective.budget:g}"
    events = record(level, kind, "rate5m", "events")
    bad_events = record(level, kind, "rate5m", "bad_events")
    own = selector(matcher)
    rules = _finished_rule(objective, level, by, matcher, "5m")
    total, bad = _raw_events(objective, level, by, matcher, "5m")
    rules += [
        Rule(events, total, kind),
        Rule(bad_events, bad, kind),
        Rule(
            record(level, kind, "burnrate5m"),
            f"{bad_events}{own}\n  / ({events}{own} > 0)\n  / {budget}",
            kind,
        ),
    ]
    for window in WINDOWS[1:]:
        if hours(window) <= hours(LONGEST_RAW_WINDOW):
            rules += _finished_rule(objective, level, by, matcher, window)
            total, bad = _raw_events(objective, level, by, matcher, window)
        else:
            bad = f"sum_over_time({bad_events}{own}[{window}])"
            total = f"sum_over_time({events}{own}[{window}])"
        burn_rate = f"{bad}\n  / ({total} > 0)\n  / {budget}"
        rules.append(Rule(record(level, kind, f"burnrate{window}"), burn_rate, kind))
    budget_left = (
        f"1 - sum_over_time({bad_events}{own}[{slos.window}])\n"
        f"  / (sum_over_time({events}{own}[{slos.window}]) > 0)\n  / {budget}"
    )
    target = f"0 * {events}{own} + {objective.target:g}"
    return [
        *rules,
        Rule(record(level, kind, "error_budget_remaining"), budget_left, kind),
        Rule(record(level, kind, "objective"), target, kind),
    ]


def _raw_events(
    objective: Objective, level: str, by: str, matcher: str, window: str
) -> tuple[str, str]:
    """(all events, bad events) per second over a raw ``window``, as PromQL. For ``errors``
    both come from the recording of finished requests by reason over that window
    (:func:`_finished_rule`): the raw series are read once, and a request's reason says if
    it was bad."""
    if objective.kind == "errors":
        finished = record(level, objective.kind, f"rate{window}", "finished")
        total = f"sum without (reason) ({finished}{selector(matcher)})"
        errors = f"sum without (reason) ({finished}{selector(matcher, 'reason=`error`')})"
        # A server that never failed may have no `error` series at all: that is zero errors.
        return total, f"({errors} or 0 * {total})"
    histogram = KINDS[objective.kind].histogram
    good_bucket = selector(matcher, bucket_matcher(objective.seconds))
    total = f"sum {by} (rate({histogram}_count{selector(matcher)}[{window}]))"
    good = f"sum {by} (rate({histogram}_bucket{good_bucket}[{window}]))"
    return total, f"({total} - {good})"


def _finished_rule(
    objective: Objective, level: str, by: str, matcher: str, window: str
) -> list[Rule]:
    """For ``errors``, the finished requests by reason over a raw ``window`` that
    :func:`_raw_events` reads; none for the other kinds."""
    if objective.kind != "errors":
        return []
    by_reason = by.replace(")", ", reason)") if by.startswith("by") else by
    rate = f"rate({FINISHED_REQUESTS}{selector(matcher)}[{window}])"
    name = record(level, objective.kind, f"rate{window}", "finished")
    return [Rule(name, f"sum {by_reason} ({rate})", objective.kind)]
