"""Findings: the alerts whose conditions hold, ranked as on-call should read them.

The report model of ``inferwatch diagnose`` and the verdict page: a :class:`Finding` per alert
that holds, a :class:`Burn` per burning objective, and a :class:`Report` ordered by the
method's causal graph (:data:`~inferwatch.method.alerts.RELATIONS`, :func:`accounts_for`:
an explained finding goes right under its cause), then by severity and :func:`strength`.
Also the phase verdict and how a signal's value is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferwatch.method import slo
from inferwatch.method.alerts import RELATIONS, Alert, Cond
from inferwatch.method.alerts.alert import LATENCY_UNITS
from inferwatch.method.local import Samples, Window, holding, scoped, signal_readings
from inferwatch.method.signals import SIGNALS
from inferwatch.method.spec import SEVERITY_ORDER, Spec

if TYPE_CHECKING:
    from inferwatch.method.fleet import Fleet

EXIT = {"none": 0, "info": 1, "warning": 3, "critical": 4}


@dataclass
class Finding:
    """An alert whose condition holds for one label set, with the evidence."""

    alert: Alert
    labels: Mapping[str, str]
    evidence: list[tuple[Cond, float | None]] = field(default_factory=list)
    explained_by: str | None = None  # the finding it is listed under (its nearest cause)
    inhibited: bool = False  # and Alertmanager inhibits it while that one fires
    depth: int = 0  # how many causes above it
    holds: bool = True  # its condition holds now
    firing: bool = False  # Prometheus holds it as firing (``--prometheus`` only)
    severity: str = ""  # as the rules label it (Spec.severity); the alert's own when empty

    def __post_init__(self) -> None:
        self.severity = self.severity or self.alert.severity


@dataclass
class Burn:
    """An objective whose burn-rate alert(s) Prometheus holds as firing, for one model."""

    kind: str  # ttft, itl, e2e, errors (slo.KINDS)
    labels: Mapping[str, str]  # the model's (scope instance: the instance's), without slo
    alerts: list[str]  # firing, in BURN_ALERTS order
    severity: str
    burn_rates: dict[str, float | None] = field(default_factory=dict)  # by BURN_WINDOWS
    budget_remaining: float | None = None  # share of the compliance window's budget left

    @property
    def rank(self) -> tuple[int, int]:
        kinds = list(slo.KINDS)
        return (
            SEVERITY_ORDER.index(self.severity),
            kinds.index(self.kind) if self.kind in kinds else len(kinds),
        )


def _belongs(finding: Finding, labels: Mapping[str, str]) -> bool:
    """Whether a finding is about the model (or instance) of a burning objective: the same
    model, and the same value for every label both carry (the SLO alerts' own match)."""
    model = labels.get("model")
    return (
        model is not None
        and finding.labels.get("model") == model
        and all(finding.labels[k] == v for k, v in labels.items() if k in finding.labels)
    )


@dataclass
class Report:
    source: str
    window: str
    spec: Spec
    phase_signals: dict[str, float | None]
    findings: list[Finding]
    burns: list[Burn] = field(default_factory=list)
    judged_with: str = "the built-in defaults"  # which spec: a config file, the exporter's
    sidecar: str | None = None  # the exporter diagnosed (``scheme://host:port/``), if one
    fleet: Fleet | None = None  # which replica, which worker (``--prometheus`` only)
    # The sidecar's slowest requests of the window, from the server's spans (its
    # ``/verdict.json``'s ``slow_requests``; ``--exporter`` only, where it receives them).
    slow_requests: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.findings = ordered(self.findings, self.spec)
        self.burns.sort(key=lambda b: b.rank)

    def burning(self) -> list[tuple[dict[str, str], list[Burn], list[Finding]]]:
        """Per model with a burning SLO, worst first: its labels, its burning objectives and
        the findings about it (ranked)."""
        models: dict[tuple, list[Burn]] = {}
        for burn in self.burns:  # ranked: a model's first burn is its worst
            models.setdefault(tuple(sorted(burn.labels.items())), []).append(burn)
        return [
            (dict(key), burns, [f for f in self.findings if _belongs(f, dict(key))])
            for key, burns in models.items()
        ]

    def others(self) -> list[Finding]:
        """The findings about no model with a burning SLO."""
        return [f for f in self.findings if not any(_belongs(f, b.labels) for b in self.burns)]

    def worst(self) -> str:
        severities = [f.severity for f in self.findings] + [b.severity for b in self.burns]
        return min(severities, key=SEVERITY_ORDER.index, default="none")

    def exit_code(self) -> int:
        return EXIT[self.worst()]


def strength(finding: Finding, spec: Spec) -> float:
    """How far past its threshold a finding's evidence is, as a ratio (1: just at it): the
    weakest of the conditions that must all hold, the strongest of ``any_of``'s. A condition
    against zero (more than none) is a gate, not a margin."""
    ratios = []
    for cond, value in finding.evidence:
        if cond in finding.alert.unless or value is None or not math.isfinite(value):
            continue
        bound = cond.bound(spec)
        if bound > 0 and value > 0:
            ratio = value / bound if cond.op in (">", ">=") else bound / value
            if ratio >= 1:
                ratios.append(ratio)
    if not ratios:
        return 1.0
    return max(ratios) if finding.alert.any_of else min(ratios)


def excess(finding: Finding, spec: Spec) -> float | None:
    """How far past its threshold a finding's latency is, as a ratio: the largest of its
    firing conditions over a duration or a factor (None: it fires on no latency)."""
    ratios = [
        value / cond.bound(spec)
        for cond, value in finding.evidence
        if cond not in finding.alert.unless
        and SIGNALS[cond.measured].unit in LATENCY_UNITS
        and value is not None
        and math.isfinite(value)
        and cond.bound(spec) > 0
    ]
    return max(ratios, default=None)


def accounts_for(cause: Finding, effect: Finding, spec: Spec) -> bool:
    """Whether the cause's evidence can explain the effect it is related to: a cause judged
    on a default threshold explains no cause judged on calibrated ones, and a cause that
    slows the server by a share of waiting (``Alert.stretch``) explains a latency no further
    past its threshold than ``1 / (1 - share)``."""
    if (
        spec.uncalibrated(cause.alert)
        and not spec.uncalibrated(effect.alert)
        and not effect.alert.symptom
    ):
        return False
    if not cause.alert.stretch:
        return True
    share = next((v for c, v in cause.evidence if c.signal == cause.alert.stretch), None)
    past = excess(effect, spec)
    if share is None or past is None:
        return True
    return share >= 1 or past <= 1 / (1 - share)


def rank(finding: Finding, spec: Spec) -> tuple[bool, bool, int, float]:
    """Among findings no relation orders: what users see (a symptom alert) after the
    causes, then what Prometheus fires before what only holds at this instant (pending for
    its alert's ``for``: one missed poll holds InferenceBackendDown's for a second), then
    severity, then the stronger evidence first; never the name."""
    return (
        finding.alert.symptom,
        not finding.firing,
        SEVERITY_ORDER.index(finding.severity),
        -strength(finding, spec),
    )


def ordered(findings: list[Finding], spec: Spec) -> list[Finding]:
    """Each finding under the nearest cause that explains it (the deepest one: a stall the
    CPU explains is nearer to the queueing than the CPU is), causes in :func:`rank` order,
    each followed by what it explains."""
    causes: dict[int, list[Finding]] = {id(f): [] for f in findings}
    for source, targets, equal in RELATIONS:
        for cause in (f for f in findings if f.alert.name == source):
            for finding in findings:
                if (
                    finding is not cause
                    and finding.alert.name in targets
                    and all(finding.labels.get(k) == cause.labels.get(k) for k in equal)
                    and accounts_for(cause, finding, spec)
                ):
                    causes[id(finding)].append(cause)
    depth: dict[int, int] = {}

    def depth_of(finding: Finding) -> int:
        if id(finding) not in depth:
            depth[id(finding)] = 1 + max((depth_of(c) for c in causes[id(finding)]), default=-1)
        return depth[id(finding)]

    children: dict[int, list[Finding]] = {id(f): [] for f in findings}
    roots = []
    for finding in findings:
        finding.depth = depth_of(finding)
        if not causes[id(finding)]:
            finding.explained_by, finding.inhibited = None, False
            roots.append(finding)
            continue
        parent = min(causes[id(finding)], key=lambda c: (-depth_of(c), rank(c, spec)))
        finding.explained_by = parent.alert.name
        finding.inhibited = spec.inhibits(parent.alert, finding.alert)
        children[id(parent)].append(finding)
    out: list[Finding] = []

    def visit(finding: Finding) -> None:
        out.append(finding)
        for child in sorted(children[id(finding)], key=lambda f: rank(f, spec)):
            visit(child)

    for root in sorted(roots, key=lambda f: rank(f, spec)):
        visit(root)
    return out


def fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if unit == "seconds":
        return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if unit == "ratio":
        return f"{value * 100:.3g} %"
    if unit == "factor":
        return f"{value:.3g}x"
    return f"{value:.3g}"


# The signals the phase is judged on, TTFT's then per-token latency's: where a server
# measures neither (TGI), their fallbacks (the canary's TTFT, the decode step latency).
PHASE_SIGNALS = ("ttft_p95", "itl_p95")


def phase_of(signals: Mapping[str, float | None], spec: Spec) -> tuple[str, str]:
    """Prefill or decode: which of TTFT and per-token latency is above its threshold, and
    the comparison that says so. ``signals`` holds the two phase signals' readings by the
    signal read, TTFT's first (:data:`PHASE_SIGNALS`), each named as what it is (none: no
    data)."""
    ttft_limit, itl_limit = spec.threshold("ttft_p95_seconds"), spec.threshold("itl_p95_seconds")
    readings = list(signals.items()) or [(name, None) for name in PHASE_SIGNALS]
    (ttft_name, ttft), (itl_name, itl) = readings
    high_ttft = ttft is not None and ttft > ttft_limit
    high_itl = itl is not None and itl > itl_limit
    phase = {
        (True, False): "prefill",
        (False, True): "decode",
        (True, True): "prefill and decode",
        (False, False): "neither (latency within thresholds)",
    }[(high_ttft, high_itl)]
    detail = (
        f"{SIGNALS[ttft_name].label} {fmt(ttft, 'seconds')} {'>' if high_ttft else '<='} "
        f"{fmt(ttft_limit, 'seconds')}; {SIGNALS[itl_name].label} {fmt(itl, 'seconds')} "
        f"{'>' if high_itl else '<='} {fmt(itl_limit, 'seconds')}"
    )
    return phase, detail


def evaluate(window: Window, spec: Spec, labels: Mapping[str, str]) -> list[Finding]:
    """The alerts whose conditions hold over the window: one exporter's (``labels``), and
    those judged per label value (a router's worker, its label added)."""
    return [
        Finding(alert, labels, evidence, severity=spec.severity(alert))
        for alert, evidence in holding(signal_readings(window), spec)
    ] + [
        Finding(alert, {**labels, **value}, evidence, severity=spec.severity(alert))
        for value, alert, evidence in scoped(window, spec)
    ]


def exporter_labels(page: Samples) -> dict[str, str]:
    """The backend and model an inferwatch page names (``inferwatch_backend_info``)."""
    info = [labels for labels, _ in page.get("inferwatch_backend_info", [])]
    return {k: info[0][k] for k in ("backend", "model") if info and k in info[0]}


def exporter_report(
    source: str,
    before: Samples,
    after: Samples,
    seconds: float,
    spec: Spec,
    judged_with: str = "the exporter's own spec",
) -> Report:
    """The report over two pages of one exporter ``seconds`` apart: ``diagnose --exporter``
    and the exporter's own verdict page."""
    window = Window(before, after, seconds, spec)
    phase = dict(window.reading(name) for name in PHASE_SIGNALS)
    findings = evaluate(window, spec, exporter_labels(after))
    return Report(source, f"{seconds:.1f}s", spec, phase, findings, judged_with=judged_with)
