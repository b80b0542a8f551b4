"""Snippets for the alerts' descriptions: another series' value, read when the alert fires."""

from __future__ import annotations

import re

from inferwatch.method.signals import INSTANCE, ITL, TTFT

PLAIN_NUMBER = 'printf "%%.3g"'  # plain numbers (rates, ratios): 0.1, not humanize's "100m"
GPU = "gpu"  # value_of's level for a GPU's series: the alert's instance, job and gpu

# Quantile matchers of the exporter's window series and of the recording rules.
P95, P99, P50 = '{quantile="0.95"}', '{quantile="0.99"}', '{quantile="0.5"}'

# The per-instance recording rules of the two latency histograms.
INSTANCE_TTFT = f"instance:inferwatch_{TTFT}"
INSTANCE_ITL = f"instance:inferwatch_{ITL}"


def value_of(selector: str, level: str, fmt: str = "humanize", match_model: bool = True) -> str:
    """Annotation snippet: the value of another series for the alert's own labels.

    ``selector`` is a metric name with optional extra matchers (``foo`` or
    ``foo{quantile="0.95"}``), possibly inside functions (``count(last_over_time(foo[6h]))``),
    or an expression over several (:func:`window_mean`): the matchers go on every metric name
    (``level`` GPU: the alert's instance, job and gpu labels).
    ``fmt`` is a template function applied to the value, or ``label "name"`` to print one of
    the series' labels instead. ``match_model=False`` matches on instance and job only
    (series without a model label).
    """
    pipe = fmt if fmt.startswith("label ") else f"value | {fmt}"
    return f"{{{{ with {_query(selector, level, match_model)} }}}}" + (
        f"{{{{ . | first | {pipe} }}}}{{{{ else }}}}n/a{{{{ end }}}}"
    )


def if_present(selector: str, level: str, then: str, otherwise: str) -> str:
    """Annotation snippet: ``then`` where ``selector`` has a series for the alert's labels,
    else ``otherwise`` (where a signal read its fallback: say which was read)."""
    return f"{{{{ if {_query(selector, level)} }}}}{then}{{{{ else }}}}{otherwise}{{{{ end }}}}"


def _query(selector: str, level: str, match_model: bool = True) -> str:
    """The template pipeline that queries ``selector`` for the alert's own labels."""
    part = r"(?:[a-zA-Z0-9_:]|%\(\w+\)s)"  # a name character, or a %(w)s placeholder
    metric = re.compile(rf"{part}*inferwatch_{part}+(\{{[^}}]*\}})?")
    if level == GPU:
        labels = 'instance="%%s",job="%%s",gpu="%%s"'
        args = "$labels.instance $labels.job $labels.gpu"
    elif level == INSTANCE:
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
    return f"printf `{query}` {' '.join([args] * count)} | query"


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


# What a description reads where a signal read its fallback (method/fallbacks.py): the
# canary's TTFT, the server's steps, the token budget in use.
CANARY_TTFT_P95 = (
    "histogram_quantile(0.95, sum by (le) "
    "(rate(inferwatch_canary_time_to_first_token_seconds_bucket[%(window)s])))"
)
STEP_P95 = (
    "histogram_quantile(0.95, sum by (le) "
    '(rate(inferwatch_engine_step_seconds_bucket{kind="decode"}[%(window)s])))'
)


def _step_mean(kind: str) -> str:
    return window_mean(
        f'inferwatch_engine_step_seconds_sum{{kind="{kind}"}}',
        f'inferwatch_engine_step_seconds_count{{kind="{kind}"}}',
    )


PREFILL_STEP_MEAN = _step_mean("prefill")
DECODE_STEP_OVER_FLOOR = f"{_step_mean('decode')} / max(inferwatch_decode_floor_seconds)"
TOKEN_BUDGET_USE = (
    "avg_over_time(inferwatch_batch_reserved_tokens[%(window)s]) / "
    "avg_over_time(inferwatch_batch_token_budget[%(window)s])"
)
