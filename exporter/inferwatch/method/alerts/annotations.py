"""Snippets for the alerts' descriptions: another series' value, read when the alert fires."""

from __future__ import annotations

import re

from inferwatch.method.signals import INSTANCE, ITL, TTFT

PLAIN_NUMBER = 'printf "%%.3g"'  # plain numbers (rates, ratios): 0.1, not humanize's "100m"

# Quantile matchers of the exporter's window series and of the recording rules.
P95, P99, P50 = '{quantile="0.95"}', '{quantile="0.99"}', '{quantile="0.5"}'

# The per-instance recording rules of the two latency histograms.
INSTANCE_TTFT = f"instance:inferwatch_{TTFT}"
INSTANCE_ITL = f"instance:inferwatch_{ITL}"


def value_of(selector: str, level: str, fmt: str = "humanize", match_model: bool = True) -> str:
    """Annotation snippet: the value of another series for the alert's own labels.

    ``selector`` is a metric name with optional extra matchers (``foo`` or
    ``foo{quantile="0.95"}``), possibly inside functions (``count(last_over_time(foo[6h]))``),
    or an expression over several (:func:`window_mean`): the matchers go on every metric name.
    ``fmt`` is a template function applied to the value, or ``label "name"`` to print one of
    the series' labels instead. ``match_model=False`` matches on instance and job only
    (series without a model label).
    """
    pipe = fmt if fmt.startswith("label ") else f"value | {fmt}"
    part = r"(?:[a-zA-Z0-9_:]|%\(\w+\)s)"  # a name character, or a %(w)s placeholder
    metric = re.compile(rf"{part}*inferwatch_{part}+(\{{[^}}]*\}})?")
    if level == INSTANCE:
        labels = 'instance="%%s",job="%%s"' + (',model="%%s"' if match_model else "")
        args = "$labels.instance $labels.job" + (" $labels.model" if match_model else "")
    else:
        labels = 'namespace="%%s",backend="%%s",model="%%s"'
        args = "$labels.namespace $labels.backend $labels.model"

    def with_labels(match: re.Match) -> str:
        name, extra = match.group(0).partition("{")[::2]
        return f"{name}{{{labels}{',' + extra.rstrip('}') if extra else ''}}}"

    query, count = metric.subn(with_labels, selector)
    assert count, selector
    return (
        f"{{{{ with printf `{query}` {' '.join([args] * count)} | query }}}}"
        f"{{{{ . | first | {pipe} }}}}{{{{ else }}}}n/a{{{{ end }}}}"
    )


def window_mean(numerator: str, denominator: str = "") -> str:
    """A description's mean over the rate window, read when the alert is active: a
    histogram's (its rate of sum over rate of count), or one counter's rate over another's."""
    num, den = (
        (numerator, denominator) if denominator else (f"{numerator}_sum", f"{numerator}_count")
    )
    return f"sum(rate({num}[%(window)s])) / sum(rate({den}[%(window)s]))"


def canary_probes(result: str) -> str:
    """The canary's probes with this result over the window, for an annotation."""
    return f'sum(increase(inferwatch_canary_probes_total{{result="{result}"}}[%(window)s]))'
