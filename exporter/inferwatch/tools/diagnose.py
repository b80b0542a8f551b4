"""``inferwatch diagnose``: walks the method over live data with the rules' own spec.

Phase first (is TTFT or per-token latency the one that is high?), then layer (which alert
conditions hold: scheduling, compute, memory, system...), then the evidence (each condition's
measured value against its threshold), ranked by severity, with the runbook to open. A
finding that Alertmanager would inhibit (the example config's inhibitions: a stall explains
the queueing it causes, a dead backend its pod's latency) is ranked after the finding that
explains it and says so.

With ``--prometheus``, an SLO whose burn-rate alert fires (``InferenceSLOFastBurn``,
``InferenceSLOSlowBurn``) comes first: per model, the burning objectives (what users feel:
the burn rate over each burn condition's long window, the error budget left), then the
findings of that model under them, most likely first (why). Findings of other models
follow as without SLOs.

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

    SLO burning: backend=vllm model=llama-3-8b namespace=prod
    CRITICAL InferenceSLOFastBurn  ttft (time to first token)
             burn rate 15x over 1h, 6x over 6h, 2x over 1d, 0.8x over 3d; error budget remaining 72 %
             runbook: alerts/runbooks/InferenceSLOFastBurn.md
      causes, most likely first:
      WARNING  InferencePrefillBottleneck  prefill / compute  backend=vllm model=llama-3-8b ...
               ...

    phase: prefill  (TTFT p95 4.88 s > 2 s; ITL p95 48.8 ms <= 100 ms)
    layer: compute

    WARNING  InferencePrefillBottleneck  prefill / compute  instance=10.0.0.1:10177 model=llama-3-8b
             TTFT p95 4.88 s > 2 s; queue share of TTFT 2.86 % < 20 %; ITL p95 48.8 ms <= 100 ms;
             finished requests/s 2 > 0.05
             runbook: alerts/runbooks/InferencePrefillBottleneck.md

Exit code: 0 nothing holds, 1 only info findings, 3 warning, 4 critical (2 is bad input,
5 the source cannot be read); a burning SLO counts with its alert's severity.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from inferwatch.collect.textparse import read_page
from inferwatch.collect.upstream import Upstream, UpstreamError
from inferwatch.method import slo
from inferwatch.method.alerts import ALERTS, Alert, Cond
from inferwatch.method.findings import (
    SEVERITY_ORDER,
    Burn,
    Finding,
    Report,
    exporter_report,
    fmt,
    phase_of,
)
from inferwatch.method.rules import placeholders
from inferwatch.method.signals import (
    SIGNALS,
)
from inferwatch.method.spec import Spec
from inferwatch.urls import redact_url

EXIT_UNREADABLE = 5
RUNBOOKS = "alerts/runbooks/"
# The burn-rate alerts (slo.UNMEASURED says nothing burns) and the long windows of their
# conditions, in slo.BURNS order: 1h, 6h (the page), 1d, 3d (the ticket).
BURN_ALERTS = (slo.FAST, slo.SLOW)
BURN_WINDOWS = tuple(dict.fromkeys(b.long for b in slo.BURNS))


class SourceError(Exception):
    """The source cannot be read or does not hold inferwatch data; str() is one line."""


# --- formatting ----------------------------------------------------------------------------


def _evidence_text(alert: Alert, cond: Cond, value: float | None, spec: Spec) -> str:
    signal = SIGNALS[cond.signal]
    keyword = "unless " if cond in alert.unless else ("or " if cond in alert.any_of[1:] else "")
    bound = fmt(cond.bound(spec), signal.unit)
    return f"{keyword}{signal.label} {fmt(value, signal.unit)} {cond.op} {bound}"


def phase_verdict(report: Report) -> str:
    """Prefill or decode: which of TTFT and per-token latency is above its threshold."""
    phase, detail = phase_of(
        report.phase_signals.get("ttft_p95"), report.phase_signals.get("itl_p95"), report.spec
    )
    return f"phase: {phase}  ({detail})"


def _where(labels: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _finding_lines(finding: Finding, spec: Spec) -> list[str]:
    alert = finding.alert
    lines = [
        f"{finding.severity.upper():8} {alert.name}  {alert.phase} / {alert.layer}  "
        f"{_where(finding.labels)}".rstrip()
    ]
    evidence = "; ".join(_evidence_text(alert, c, v, spec) for c, v in finding.evidence)
    lines.append(f"         {evidence}")
    if finding.firing and not finding.holds:
        lines.append("         firing in Prometheus; its condition no longer holds now")
    if finding.explained_by:
        lines.append(f"         explained by {finding.explained_by} (inhibited in Alertmanager)")
    lines.append(f"         runbook: {RUNBOOKS}{alert.name}.md")
    return lines


def _burn_lines(burn: Burn) -> list[str]:
    kind = slo.KINDS.get(burn.kind)
    rates = ", ".join(f"{fmt(v, 'factor')} over {w}" for w, v in burn.burn_rates.items())
    return [
        f"{burn.severity.upper():8} {', '.join(burn.alerts)}  {burn.kind}"
        + (f" ({kind.title})" if kind else ""),
        f"         burn rate {rates or 'n/a'}; error budget remaining "
        + fmt(burn.budget_remaining, "ratio"),
        f"         runbook: {RUNBOOKS}{burn.alerts[0]}.md",
    ]


def render(report: Report) -> str:
    lines = [f"inferwatch diagnose: {report.source} (window {report.window})", ""]
    # What users feel first, then why: each model's burning objectives, its findings under them.
    for labels, burns, causes in report.burning():
        lines.append(f"SLO burning: {_where(labels)}")
        for burn in burns:
            lines += _burn_lines(burn)
        if causes:
            lines.append("  causes, most likely first:")
            for finding in causes:
                lines += ["  " + line for line in _finding_lines(finding, report.spec)]
        else:
            lines.append(
                "  causes: no alert condition of the heuristics spec holds for this model "
                "(see the triage dashboard)"
            )
        lines.append("")
    lines.append(phase_verdict(report))
    layers = []
    for finding in report.findings:
        if finding.explained_by is None and finding.alert.layer not in layers:
            layers.append(finding.alert.layer)
    lines.append("layer: " + (", ".join(layers) if layers else "no alert condition holds"))
    others = report.others()
    if others or not report.burns:
        lines.append("")
    for finding in others:
        lines += _finding_lines(finding, report.spec)
    if not report.findings and not report.burns:
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
_ALERT_LABELS = ("alertname", "alertstate", "severity", "phase", "layer", "slo")


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
            upstream,
            f'count({{__name__="instance:inferwatch_requests_finished:{spec.rate_name}"}})',
        )
        if not rules:
            up = await _query(upstream, "count(inferwatch_backend_up)")
            raise SourceError(
                f"{redact_url(url)} has no inferwatch recording rules "
                f"(instance:inferwatch_requests_finished:{spec.rate_name}): load "
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
            found = Finding(alert, labels, holds=holds, severity=spec.severity(alert))
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
        burns = await _burns(upstream, spec)
    finally:
        await upstream.close()
    return Report(redact_url(url), spec.timing.window, spec, phase, findings, burns)


async def _burns(upstream: Upstream, spec: Spec) -> list[Burn]:
    """The objectives whose burn-rate alerts fire, with their burn rates and budget left."""
    burning = f'ALERTS{{alertstate="firing", alertname=~"{"|".join(BURN_ALERTS)}"}}'
    burns: dict[tuple, Burn] = {}
    for labels, _ in await _query(upstream, burning):
        own = {k: v for k, v in _own(labels).items() if k not in _ALERT_LABELS}
        kind = labels.get("slo", "")
        severity = labels.get("severity", "warning")
        severity = severity if severity in SEVERITY_ORDER else "warning"
        burn = burns.setdefault((kind, tuple(sorted(own.items()))), Burn(kind, own, [], severity))
        burn.alerts.append(labels["alertname"])
        burn.alerts.sort(key=BURN_ALERTS.index)
        burn.severity = min(burn.severity, severity, key=SEVERITY_ORDER.index)
    answers: dict[str, list[tuple[dict[str, str], float]]] = {}

    async def record(kind: str, name: str, labels: Mapping[str, str]) -> float | None:
        """The record's value for the objective's own series; None when it has none."""
        if kind not in slo.KINDS:
            return None
        expr = slo.record(spec.slos.scope, kind, name)
        if expr not in answers:
            answers[expr] = await _query(upstream, expr)
        want = {**labels, "slo": kind}
        values = [v for series, v in answers[expr] if _own(series) == want]
        return values[0] if values and not math.isnan(values[0]) else None

    for burn in burns.values():
        for window in BURN_WINDOWS:
            burn.burn_rates[window] = await record(burn.kind, f"burnrate{window}", burn.labels)
        burn.budget_remaining = await record(burn.kind, "error_budget_remaining", burn.labels)
    return list(burns.values())


# --- from one exporter ---------------------------------------------------------------------


async def from_exporter(
    url: str, spec: Spec, interval: float = 5.0, timeout: float = 10.0
) -> Report:
    upstream = Upstream(url, timeout=timeout, max_bytes=64 * 1024 * 1024)
    try:
        first = read_page(await upstream.get_exposition("/metrics"))
        started = time.monotonic()
        await asyncio.sleep(interval)
        second = read_page(await upstream.get_exposition("/metrics"))
        seconds = time.monotonic() - started
    except (UpstreamError, ValueError) as exc:
        raise SourceError(str(exc)) from None
    finally:
        await upstream.close()
    if "inferwatch_build_info" not in second:
        raise SourceError(
            f"{redact_url(url)} is not an inferwatch exporter (no inferwatch_build_info)"
        )
    return exporter_report(redact_url(url), first, second, seconds, spec)


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON (for scripts). ``slos``: one entry per model with a burning SLO,
    worst first, always present (empty when none burns); its ``causes`` are findings of
    ``findings``, which lists every finding as without SLOs."""
    return {
        "source": report.source,
        "window": report.window,
        "worst": report.worst(),
        "phase_signals": report.phase_signals,
        "slos": [
            {
                "labels": labels,
                "objectives": [
                    {
                        "slo": b.kind,
                        "severity": b.severity,
                        "alerts": list(b.alerts),
                        "burn_rates": {w: _number(v) for w, v in b.burn_rates.items()},
                        "error_budget_remaining": _number(b.budget_remaining),
                        "runbook": f"{RUNBOOKS}{b.alerts[0]}.md",
                    }
                    for b in burns
                ],
                "causes": [{"alert": f.alert.name, "labels": dict(f.labels)} for f in causes],
            }
            for labels, burns, causes in report.burning()
        ],
        "findings": [
            {
                "alert": f.alert.name,
                "severity": f.severity,
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
