"""What an alert is: :class:`Cond` itions over signals, the text, the evidence, the scenarios.

An :class:`Alert` is built from conditions over :data:`~inferwatch.method.signals.SIGNALS`;
its PromQL, its local evaluation and its runbook page all come from this one entry. The layers
beside this one (``compute.py``, ``scheduling/``...) hold the alerts; each alert's runbook is
the Markdown template ``runbooks/<name>.md`` next to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inferwatch.method.recipes import ShareAbove
from inferwatch.method.signals import SIGNALS, expression
from inferwatch.method.thresholds import THRESHOLDS

if TYPE_CHECKING:
    from inferwatch.method.scenario import Scenario


class Thresholds(Protocol):
    """What a condition is judged with (a :class:`~inferwatch.method.spec.Spec`)."""

    def threshold(self, name: str) -> float: ...


# What users see, not why: the client's view (the canary's alerts) and the regression against
# the baseline. Every cause of slow or failed requests explains them (``Alert.explains``).
USERS_SEE = ("InferenceCanaryFailing", "InferenceClientGap", "InferenceLatencyRegression")

# An engine step as it appears in a vLLM capture's trace, for the alerts' ``evidence``: one
# ``execute_context_<P>(<p>)_generation_<D>(<d>)`` span per step (P requests prefilling p
# tokens, D requests decoding d tokens).
STEP_SPAN = "`execute_context_<P>(<p tokens>)_generation_<D>(<d tokens>)`"


# The units of the signals that measure how slow something is.
LATENCY_UNITS = ("seconds", "factor")
# Where a request spends its time, by its own span, as a sentence says it: the places an
# alert's ``first_token_waits_in`` and ``slow_tokens_spent_in`` name.
PLACES = {"queue": "in the queue", "prefill": "in prefill", "decode": "in decode"}
# What the slowest requests of each list did there.
FIRST_TOKENS = "first tokens waited longest"
PER_TOKEN = "per output token spent most of their time"


@dataclass(frozen=True)
class Cond:
    """``signal op threshold``; the threshold is a name in THRESHOLDS or a number.

    Compared, the signal reads its fallback where its own series are absent
    (:func:`~inferwatch.method.signals.expression`); in a finding's evidence, ``read`` names
    the signal that gave the value (the condition's own where empty).
    """

    signal: str
    op: str
    threshold: str | float
    read: str = field(default="", compare=False)

    @property
    def measured(self) -> str:
        """The signal whose value the evidence shows."""
        return self.read or self.signal

    def promql(self, values: Mapping[str, str]) -> str:
        signal = expression(self.signal, values)
        bound = (
            values[f"t.{self.threshold}"]
            if isinstance(self.threshold, str)
            else f"{self.threshold:g}"
        )
        # Comparisons bind tighter than and/or/unless, looser than arithmetic.
        return f"{signal} {self.op} {bound}"

    def bound(self, spec: Thresholds) -> float:
        """The number the signal is compared with under ``spec``."""
        if isinstance(self.threshold, str):
            return spec.threshold(self.threshold)
        return float(self.threshold)

    def holds(self, value: float, spec: Thresholds) -> bool:
        bound = self.bound(spec)
        return {
            ">": value > bound,
            ">=": value >= bound,
            "<": value < bound,
            "<=": value <= bound,
            "==": value == bound,
        }[self.op]


def _join(first: str, other: str) -> str:
    """The matching clause between two signals' series."""
    return "" if first == other else " on (instance, job)"


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alert of the contract: when it fires, what it says, where it points.

    It fires when every condition of ``when`` holds and none of ``unless`` does, or, with
    ``any_of``, when any of those holds. The value of the first condition's signal is the
    alert's ``$value``. Annotation templates hold ``%(name)s`` placeholders filled from the
    spec: ``%(t.ttft_p95_seconds)s`` (a threshold), ``%(pct.kv_usage_high)s`` (one as a
    percentage), ``%(w)s`` (``rate5m``), ``%(window)s`` (``5m``), ``%(for)s``; Go-template
    ``{{ }}`` is written as it is.

    ``order`` is the alert's place in the rules file (and so in docs/alerts.md's table and the
    dashboards' runbook links): a number no other alert has. ``scenarios`` are its promtool
    tests (:class:`~inferwatch.method.scenario.Scenario`): where it fires, its near misses,
    and the cross-checks its ``unless`` conditions exist for.
    """

    name: str
    order: int
    severity: str
    level: str  # INSTANCE (a local cause) or MODEL (across replicas)
    phase: str  # prefill, decode, any
    layer: (
        str  # availability, scheduling, compute, memory, communication, system, hardware, baseline
    )
    for_default: str
    summary: str
    description: str
    when: tuple[Cond, ...] = ()
    any_of: tuple[Cond, ...] = ()
    unless: tuple[Cond, ...] = ()
    # The alerts this cause explains when both hold for the same instance (or model): the
    # method's causal graph. ``diagnose`` and the verdict page list them under it, and the
    # generated Alertmanager config inhibits them while it fires where its severity is at
    # least theirs (a ticket never silences a page).
    explains: tuple[str, ...] = ()
    # A cause that slows the server by making it wait (the signal named: a share of its
    # time spent waiting) stretches what it explains by 1 / (1 - share) at most: it explains
    # a latency finding only up to that factor past the finding's threshold, and never
    # inhibits one (Alertmanager cannot weigh the two).
    stretch: str = ""
    # Says what users see, not why: the client's view (the canary's alerts), which the
    # server-side causes found with it explain; ranked after the causes when none holds.
    symptom: bool = False
    # Where this cause says a slow first token waited, "queue" or "prefill": the server's own
    # request spans (the verdict's slowest requests, ``serve --otlp-traces on``) confirm or
    # contradict it.
    first_token_waits_in: str = ""
    # Where this cause says the requests slowest per output token spent most of their time,
    # "queue", "prefill" or "decode": their spans confirm or contradict it the same way.
    slow_tokens_spent_in: str = ""
    # A critical alert about requests the server never counts (a dead server, a path to it
    # that fails): no SLI sees them, so it pages even where the SLOs do the paging.
    outside_the_slis: bool = False
    # What a capture (``serve --capture-dir``) shows of this cause, for its runbook page.
    evidence: str = ""
    # Markdown its runbook page prints after the template (a table from the definitions).
    reference: tuple[str, ...] = ()
    scenarios: tuple[Scenario, ...] = field(default=(), compare=False, repr=False)

    def conditions(self) -> tuple[Cond, ...]:
        return self.when + self.any_of + self.unless

    def thresholds(self, firing_only: bool = False) -> list[str]:
        """Names of the thresholds the alert compares with or its signals count against
        (a tail's bucket bound), in THRESHOLDS order; with ``firing_only``, those of the
        conditions that make it fire (not its ``unless``)."""
        conditions = self.when + self.any_of if firing_only else self.conditions()
        used = {c.threshold for c in conditions if isinstance(c.threshold, str)}
        for cond in conditions:
            recipe = SIGNALS[cond.signal].local
            if isinstance(recipe, ShareAbove):
                used.add(recipe.bound)
        return [name for name in THRESHOLDS if name in used]

    def slows(self) -> bool:
        """Whether it fires on a latency (a duration, or a factor over the baseline's)."""
        return any(SIGNALS[c.signal].unit in LATENCY_UNITS for c in self.when + self.any_of)

    def promql(self, values: Mapping[str, str]) -> str:
        """The alert expression, built from its conditions."""
        if self.any_of:
            first = SIGNALS[self.any_of[0].signal].level
            parts = [f"({self.any_of[0].promql(values)})"]
            for cond in self.any_of[1:]:
                join = _join(first, SIGNALS[cond.signal].level)
                parts.append(f"or{join} ({cond.promql(values)})")
            return "\n".join(parts)
        first = SIGNALS[self.when[0].signal].level
        parts = [self.when[0].promql(values)]
        for keyword, conds in (("and", self.when[1:]), ("unless", self.unless)):
            for cond in conds:
                join = _join(first, SIGNALS[cond.signal].level)
                parts.append(f"{keyword}{join} {cond.promql(values)}")
        return "\n".join(parts)
