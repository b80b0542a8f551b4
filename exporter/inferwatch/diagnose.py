"""``inferwatch diagnose``: walks the method over live data with the rules' own spec.

Phase first (is TTFT or per-token latency the one that is high?), then layer (which alert
conditions hold: scheduling, compute, memory, system...), then the evidence (each condition's
measured value against its threshold), ranked by severity, with the runbook to open. A
finding that Alertmanager would inhibit (the example config's inhibitions: a stall explains
the queueing it causes, a dead backend its pod's latency) is ranked after the finding that
explains it and says so.

Two sources:

- ``--prometheus URL``: a Prometheus that scrapes inferwatch and runs its recording rules.
  Each alert's expression from the heuristics spec is evaluated as it stands (an alert whose
  condition holds now is reported even before its ``for`` has elapsed), and every inferwatch
  alert Prometheus holds as firing (its ``ALERTS`` series) is reported too, with the
  evidence at this instant, even when its condition has just stopped holding: on-call never
  reads "nothing holds" next to a page.
- ``--exporter URL``: one inferwatch, scraped twice ``--interval`` seconds apart; every
  signal is computed from the two pages (the window is the interval) and the same
  conditions are checked.

Sample::

    inferwatch diagnose: http://prometheus:9090 (window 5m)

    phase: prefill  (TTFT p95 4.88 s > 2 s; ITL p95 48.8 ms <= 100 ms)
    layer: compute

    WARNING  InferencePrefillBottleneck  prefill / compute  instance=10.0.0.1:9477 model=llama-3-8b
             TTFT p95 4.88 s > 2 s; queue share of TTFT 2.86 % < 20 %; ITL p95 48.8 ms <= 100 ms;
             finished requests/s 2 > 0.05
             runbook: alerts/runbooks/InferencePrefillBottleneck.md

Exit code: 0 nothing holds, 1 only info findings, 3 warning, 4 critical (2 is bad input,
5 the source cannot be read).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from inferwatch.heuristics import (
    ALERTS,
    INHIBITIONS,
    SIGNALS,
    Aggregation,
    Alert,
    Cond,
    Gauge,
    Mean,
    Quantile,
    Rate,
    Ratio,
    Recipe,
    Spec,
    placeholders,
)
from inferwatch.quantile import histogram_quantile
from inferwatch.upstream import Upstream, UpstreamError, redact_url

EXIT = {"none": 0, "info": 1, "warning": 3, "critical": 4}
EXIT_UNREADABLE = 5
SEVERITY_ORDER = ("critical", "warning", "info")
RUNBOOKS = "alerts/runbooks/"


class SourceError(Exception):
    """The source cannot be read or does not hold inferwatch data; str() is one line."""


@dataclass
class Finding:
    """An alert whose condition holds for one label set, with the evidence."""

    alert: Alert
    labels: Mapping[str, str]
    evidence: list[tuple[Cond, float | None]] = field(default_factory=list)
    explained_by: str | None = None  # the finding that inhibits it in Alertmanager
    holds: bool = True  # its condition holds now
    firing: bool = False  # Prometheus holds it as firing (``--prometheus`` only)

    @property
    def rank(self) -> tuple[int, bool, bool, str]:
        """Severity, then causes before what they explain, then a regression against the
        baseline (what got worse) after the causes (why), then the name."""
        return (
            SEVERITY_ORDER.index(self.alert.severity),
            bool(self.explained_by),
            self.alert.layer == "baseline",
            self.alert.name,
        )


@dataclass
class Report:
    source: str
    window: str
    spec: Spec
    phase_signals: dict[str, float | None]
    findings: list[Finding]

    def __post_init__(self) -> None:
        for source, targets, equal in INHIBITIONS:
            for cause in (f for f in self.findings if f.alert.name == source):
                for finding in self.findings:
                    if finding.alert.name in targets and all(
                        finding.labels.get(k) == cause.labels.get(k) for k in equal
                    ):
                        finding.explained_by = source
        self.findings.sort(key=lambda f: f.rank)

    def worst(self) -> str:
        return min(
            (f.alert.severity for f in self.findings), key=SEVERITY_ORDER.index, default="none"
        )

    def exit_code(self) -> int:
        return EXIT[self.worst()]


# --- formatting ----------------------------------------------------------------------------


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


def _evidence_text(alert: Alert, cond: Cond, value: float | None, spec: Spec) -> str:
    signal = SIGNALS[cond.signal]
    keyword = "unless " if cond in alert.unless else ("or " if cond in alert.any_of[1:] else "")
    bound = fmt(cond.bound(spec), signal.unit)
    return f"{keyword}{signal.label} {fmt(value, signal.unit)} {cond.op} {bound}"


def phase_verdict(report: Report) -> str:
    """Prefill or decode: which of TTFT and per-token latency is above its threshold."""
    ttft, itl = report.phase_signals.get("ttft_p95"), report.phase_signals.get("itl_p95")
    ttft_limit, itl_limit = report.spec.t("ttft_p95_seconds"), report.spec.t("itl_p95_seconds")
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
    return f"phase: {phase}  ({detail})"


def render(report: Report) -> str:
    lines = [f"inferwatch diagnose: {report.source} (window {report.window})", ""]
    lines.append(phase_verdict(report))
    layers = []
    for finding in report.findings:
        if finding.explained_by is None and finding.alert.layer not in layers:
            layers.append(finding.alert.layer)
    lines.append("layer: " + (", ".join(layers) if layers else "no alert condition holds"))
    lines.append("")
    for finding in report.findings:
        alert = finding.alert
        where = " ".join(f"{k}={v}" for k, v in sorted(finding.labels.items()))
        lines.append(
            f"{alert.severity.upper():8} {alert.name}  {alert.phase} / {alert.layer}  {where}".rstrip()
        )
        evidence = "; ".join(_evidence_text(alert, c, v, report.spec) for c, v in finding.evidence)
        lines.append(f"         {evidence}")
        if finding.firing and not finding.holds:
            lines.append("         firing in Prometheus; its condition no longer holds now")
        if finding.explained_by:
            lines.append(
                f"         explained by {finding.explained_by} (inhibited in Alertmanager)"
            )
        lines.append(f"         runbook: {RUNBOOKS}{alert.name}.md")
    if not report.findings:
        lines.append("healthy: no alert condition of the heuristics spec holds")
    return "\n".join(lines)


# --- from Prometheus -----------------------------------------------------------------------


async def _query(upstream: Upstream, expr: str) -> list[tuple[dict[str, str], float]]:
    path = "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        doc = json.loads(await upstream.get_body(path))
    except UpstreamError as exc:
        raise SourceError(str(exc)) from None
    except ValueError:
        raise SourceError(f"{redact_url(upstream.base_url)} did not answer with JSON") from None
    if doc.get("status") != "success":
        raise SourceError(f"query failed: {doc.get('error', 'unknown error')}")
    return [(r["metric"], float(r["value"][1])) for r in doc["data"]["result"]]


# Labels Prometheus adds to an alert's ``ALERTS`` series (the rule's own labels included).
_ALERT_LABELS = ("alertname", "alertstate", "severity", "phase", "layer")


def _own(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "__name__"}


def _covers(series: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a signal's series belongs to a finding's label set."""
    keys = ("instance", "job", "backend", "model")
    return all(series[k] == labels[k] for k in keys if k in series and k in labels)


async def from_prometheus(url: str, spec: Spec, timeout: float = 10.0) -> Report:
    upstream = Upstream(url, timeout=timeout, max_bytes=64 * 1024 * 1024)
    values = placeholders(spec)
    try:
        rules = await _query(
            upstream, f'count({{__name__="instance:inferwatch_requests_finished:{spec.w}"}})'
        )
        if not rules:
            up = await _query(upstream, "count(inferwatch_backend_up)")
            raise SourceError(
                f"{redact_url(url)} has no inferwatch recording rules "
                f"(instance:inferwatch_requests_finished:{spec.w}): load "
                "alerts/inferwatch-rules.yaml there"
                + ("" if up else ", and scrape inferwatch")
                + ", or use --exporter"
            )
        signal_values: dict[str, list[tuple[dict[str, str], float]]] = {}

        async def signal(name: str) -> list[tuple[dict[str, str], float]]:
            if name not in signal_values:
                signal_values[name] = await _query(upstream, SIGNALS[name].promql % values)
            return signal_values[name]

        async def finding(alert: Alert, labels: Mapping[str, str], holds: bool) -> Finding:
            found = Finding(alert, labels, holds=holds)
            for cond in alert.conditions():
                matches = [v for series, v in await signal(cond.signal) if _covers(series, labels)]
                found.evidence.append((cond, matches[0] if matches else None))
            return found

        findings = []
        for alert in ALERTS.values():
            for labels, _ in await _query(upstream, alert.promql(values)):
                findings.append(await finding(alert, _own(labels), holds=True))
        names = "|".join(ALERTS)
        firing = f'ALERTS{{alertstate="firing", alertname=~"{names}"}}'
        for labels, _ in await _query(upstream, firing):
            alert = ALERTS[labels["alertname"]]
            own = {k: v for k, v in _own(labels).items() if k not in _ALERT_LABELS}
            same = [f for f in findings if f.alert is alert and _covers(f.labels, own)]
            for found in same:
                found.firing = True
            if not same:
                late = await finding(alert, own, holds=False)
                late.firing = True
                findings.append(late)
        phase = {}
        for name in ("ttft_p95", "itl_p95"):
            known = [v for _, v in await signal(name) if not math.isnan(v)]
            phase[name] = max(known) if known else None
    finally:
        await upstream.close()
    return Report(redact_url(url), spec.timing.window, spec, phase, findings)


# --- from one exporter ---------------------------------------------------------------------


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_page(text: str) -> Samples:
    out: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    except ValueError as exc:
        raise SourceError(f"not Prometheus text: {exc}") from None
    return out


def _matches(labels: Mapping[str, str], where: Mapping[str, str]) -> bool:
    return all(re.fullmatch(pattern, labels.get(k, "")) for k, pattern in where.items())


def _combine(values: list[float], how: Aggregation) -> float:
    """The series of one exporter (its engines, its GPUs) as one value."""
    if how == "sum":
        return math.fsum(values)
    if how == "mean":
        return math.fsum(values) / len(values)
    return max(values)


@dataclass
class Window:
    """Two scrapes of one exporter ``seconds`` apart; computes signal recipes over them."""

    before: Samples
    after: Samples
    seconds: float

    def value(self, recipe: Recipe | None) -> float | None:
        if recipe is None:
            return None
        if isinstance(recipe, Ratio):
            top, bottom = self.value(recipe.numerator), self.value(recipe.denominator)
            if top is None or not bottom:
                return None
            return top / bottom
        if isinstance(recipe, Rate):
            return self._rate(recipe)
        if isinstance(recipe, Gauge):
            return self._gauge(recipe)
        if isinstance(recipe, Mean):
            total = self._delta(f"inferwatch_{recipe.histogram}_sum")
            count = self._delta(f"inferwatch_{recipe.histogram}_count")
            return None if total is None or not count else total / count
        if isinstance(recipe, Quantile):
            return self._quantile(recipe)
        raise TypeError(recipe)

    def _series(self, samples: Samples, name: str, where: Mapping[str, str]) -> dict[tuple, float]:
        return {
            tuple(sorted(labels.items())): value
            for labels, value in samples.get(name, [])
            if _matches(labels, where)
        }

    def _increases(self, name: str, where: Mapping[str, str]) -> dict[tuple, float]:
        """Each series' increase over the window; a reset counts from zero."""
        before = self._series(self.before, name, where)
        return {
            key: value - before[key] if value >= before.get(key, math.inf) else value
            for key, value in self._series(self.after, name, where).items()
        }

    def _delta(self, name: str, where: Mapping[str, str] | None = None) -> float | None:
        """The increase of a counter, summed over its series."""
        increases = self._increases(name, where or {})
        return math.fsum(increases.values()) if increases else None

    def _rate(self, rate: Rate) -> float | None:
        increases = self._increases(rate.counter, rate.where)
        if not increases:
            return None
        return _combine(list(increases.values()), rate.how) / self.seconds

    def _gauge(self, gauge: Gauge) -> float | None:
        after = self._series(self.after, gauge.metric, gauge.where)
        if gauge.averaged:
            # avg_over_time: each series' mean over the scrapes of the window that hold it.
            before = self._series(self.before, gauge.metric, gauge.where)
            values = []
            for key in before.keys() | after.keys():
                samples = [page[key] for page in (before, after) if key in page]
                values.append(math.fsum(samples) / len(samples))
        else:
            values = list(after.values())
        return _combine(values, gauge.how) if values else None

    def _quantile(self, recipe: Quantile) -> float | None:
        """Over the increase of every series' buckets, merged by bound (all engines)."""
        increases = self._increases(f"inferwatch_{recipe.histogram}_bucket", {})
        if not increases:
            return None
        buckets: dict[str, float] = {}
        for key, increase in increases.items():
            le = dict(key)["le"]
            buckets[le] = buckets.get(le, 0.0) + increase
        result = histogram_quantile(recipe.q, buckets.items())
        return None if math.isnan(result) else result


def evaluate(window: Window, spec: Spec, labels: Mapping[str, str]) -> list[Finding]:
    """The alerts whose conditions hold over the window (one exporter: one label set)."""
    values = {name: window.value(s.local) for name, s in SIGNALS.items()}
    values["exporter_up"] = 1.0  # it answered both scrapes

    def holds(cond: Cond) -> bool:
        value = values[cond.signal]
        return value is not None and cond.holds(value, spec)

    findings = []
    for alert in ALERTS.values():
        if alert.any_of:
            fires = any(holds(c) for c in alert.any_of)
        else:
            fires = all(holds(c) for c in alert.when) and not any(holds(c) for c in alert.unless)
        if fires:
            findings.append(
                Finding(alert, labels, [(c, values[c.signal]) for c in alert.conditions()])
            )
    return findings


async def from_exporter(
    url: str, spec: Spec, interval: float = 5.0, timeout: float = 10.0
) -> Report:
    upstream = Upstream(url, timeout=timeout, max_bytes=64 * 1024 * 1024)
    try:
        first = parse_page(await upstream.get_exposition("/metrics"))
        started = time.monotonic()
        await asyncio.sleep(interval)
        second = parse_page(await upstream.get_exposition("/metrics"))
        seconds = time.monotonic() - started
    except UpstreamError as exc:
        raise SourceError(str(exc)) from None
    finally:
        await upstream.close()
    if "inferwatch_build_info" not in second:
        raise SourceError(
            f"{redact_url(url)} is not an inferwatch exporter (no inferwatch_build_info)"
        )
    info = [labels for labels, _ in second.get("inferwatch_backend_info", [])]
    labels = {k: info[0][k] for k in ("backend", "model") if info and k in info[0]}
    window = Window(first, second, seconds)
    phase = {name: window.value(SIGNALS[name].local) for name in ("ttft_p95", "itl_p95")}
    return Report(redact_url(url), f"{seconds:.1f}s", spec, phase, evaluate(window, spec, labels))


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON (for scripts)."""
    return {
        "source": report.source,
        "window": report.window,
        "worst": report.worst(),
        "phase_signals": report.phase_signals,
        "findings": [
            {
                "alert": f.alert.name,
                "severity": f.alert.severity,
                "phase": f.alert.phase,
                "layer": f.alert.layer,
                "labels": dict(f.labels),
                "evidence": {c.signal: v for c, v in f.evidence},
                "runbook": f"{RUNBOOKS}{f.alert.name}.md",
                "explained_by": f.explained_by,
                "holds": f.holds,
                "firing": f.firing,
            }
            for f in report.findings
        ],
    }
