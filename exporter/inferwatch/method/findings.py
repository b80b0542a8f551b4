"""Findings: the alerts whose conditions hold, ranked as on-call should read them.

The report model shared by ``inferwatch diagnose`` (over Prometheus or two scrapes of an
exporter) and the exporter's own verdict page: a :class:`Finding` per alert that holds with
its evidence, a :class:`Burn` per burning objective, and a :class:`Report` that applies the
Alertmanager inhibitions (a cause explains what it causes) and ranks by severity. Also the
phase verdict (prefill or decode) and how a signal's value is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from inferwatch.method import slo
from inferwatch.method.alerts import INHIBITIONS, Alert, Cond
from inferwatch.method.local import Samples, Window, holding, signal_values
from inferwatch.method.spec import Spec

EXIT = {"none": 0, "info": 1, "warning": 3, "critical": 4}


SEVERITY_ORDER = ("critical", "warning", "info")


@dataclass
class Finding:
    """An alert whose condition holds for one label set, with the evidence."""

    alert: Alert
    labels: Mapping[str, str]
    evidence: list[tuple[Cond, float | None]] = field(default_factory=list)
    explained_by: str | None = None  # the finding that inhibits it in Alertmanager
    holds: bool = True  # its condition holds now
    firing: bool = False  # Prometheus holds it as firing (``--prometheus`` only)
    severity: str = ""  # as the rules label it (Spec.severity); the alert's own when empty

    def __post_init__(self) -> None:
        self.severity = self.severity or self.alert.severity

    @property
    def rank(self) -> tuple[bool, int, bool, bool, str]:
        """What users see (a symptom alert) after the causes, then severity, then causes
        before what they explain, then a regression against the baseline (what got worse)
        after the causes (why), then the name."""
        return (
            self.alert.symptom,
            SEVERITY_ORDER.index(self.severity),
            bool(self.explained_by),
            self.alert.layer == "baseline",
            self.alert.name,
        )


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

    def __post_init__(self) -> None:
        for source, targets, equal in INHIBITIONS:
            for cause in (f for f in self.findings if f.alert.name == source):
                for finding in self.findings:
                    if finding.alert.name in targets and all(
                        finding.labels.get(k) == cause.labels.get(k) for k in equal
                    ):
                        finding.explained_by = source
        self.findings.sort(key=lambda f: f.rank)
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


def phase_of(ttft: float | None, itl: float | None, spec: Spec) -> tuple[str, str]:
    """Prefill or decode: which of TTFT and per-token latency is above its threshold, and
    the comparison that says so."""
    ttft_limit, itl_limit = spec.threshold("ttft_p95_seconds"), spec.threshold("itl_p95_seconds")
    high_ttft = ttft is not None and ttft > ttft_limit
    high_itl = itl is not None and itl > itl_limit
    phase = {
        (True, False): "prefill",
        (False, True): "decode",
        (True, True): "prefill and decode",
        (False, False): "neither (latency within thresholds)",
    }[(high_ttft, high_itl)]
    detail = (
        f"TTFT p95 {fmt(ttft, 'seconds')} {'>' if high_ttft else '<='} {fmt(ttft_limit, 'seconds')}; "
        f"ITL p95 {fmt(itl, 'seconds')} {'>' if high_itl else '<='} {fmt(itl_limit, 'seconds')}"
    )
    return phase, detail


def evaluate(window: Window, spec: Spec, labels: Mapping[str, str]) -> list[Finding]:
    """The alerts whose conditions hold over the window (one exporter: one label set)."""
    return [
        Finding(alert, labels, evidence, severity=spec.severity(alert))
        for alert, evidence in holding(signal_values(window), spec)
    ]


def exporter_labels(page: Samples) -> dict[str, str]:
    """The backend and model an inferwatch page names (``inferwatch_backend_info``)."""
    info = [labels for labels, _ in page.get("inferwatch_backend_info", [])]
    return {k: info[0][k] for k in ("backend", "model") if info and k in info[0]}


def exporter_report(
    source: str, before: Samples, after: Samples, seconds: float, spec: Spec
) -> Report:
    """The report over two pages of one exporter ``seconds`` apart: ``diagnose --exporter``
    and the exporter's own verdict page."""
    window = Window(before, after, seconds)
    phase = {name: window.signal(name) for name in ("ttft_p95", "itl_p95")}
    findings = evaluate(window, spec, exporter_labels(after))
    return Report(source, f"{seconds:.1f}s", spec, phase, findings)
