"""What ``inferwatch diagnose`` prints: a :class:`~inferwatch.method.findings.Report` as
text for on-call (each finding indented under the cause that explains it) or as JSON for
scripts (with the phase verdict the text and ``/verdict.json`` carry)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from inferwatch.method import slo
from inferwatch.method.alerts import Alert, Cond
from inferwatch.method.findings import Burn, Finding, Report, fmt, phase_of
from inferwatch.method.fleet import WORKER_SIGNALS, Fleet, Worker
from inferwatch.method.signals import SIGNALS
from inferwatch.method.spec import Spec
from inferwatch.serve.slow_requests import spans_say

RUNBOOKS = "alerts/runbooks/"


def evidence_text(alert: Alert, cond: Cond, value: float | None, spec: Spec) -> str:
    signal = SIGNALS[cond.measured]
    keyword = "unless " if cond in alert.unless else ("or " if cond in alert.any_of[1:] else "")
    bound = fmt(cond.bound(spec), signal.unit)
    return f"{keyword}{signal.label} {fmt(value, signal.unit)} {cond.op} {bound}"


def _phase(report: Report) -> tuple[str, str]:
    return phase_of(report.phase_signals, report.spec)


def phase_verdict(report: Report) -> str:
    """Prefill or decode: which of TTFT and per-token latency is above its threshold."""
    phase, detail = _phase(report)
    return f"phase: {phase}  ({detail})"


def _where(labels: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def runbook(report: Report, alert: str, labels: Mapping[str, str]) -> str:
    """Where ``alert``'s runbook opens: the team's host (``runbook_url_base``); else the
    page of the sidecar diagnosed, or of the one the finding is about (its ``instance``);
    else the generated file beside the rules."""
    instance = labels.get("instance")
    sidecar = report.sidecar or (f"http://{instance}/" if instance else None)
    return report.spec.runbook_url(alert, sidecar) or f"{RUNBOOKS}{alert}.md"


def _finding_lines(finding: Finding, report: Report, indent: int = 0) -> list[str]:
    """A finding, indented under the cause that explains it."""
    lines = _finding_text(finding, report)
    pad = "  " * (indent + finding.depth)
    return [pad + line for line in lines]


def _finding_text(finding: Finding, report: Report) -> list[str]:
    alert, spec = finding.alert, report.spec
    lines = [
        f"{finding.severity.upper():8} {alert.name}  {alert.phase} / {alert.layer}  "
        f"{_where(finding.labels)}".rstrip()
    ]
    evidence = "; ".join(evidence_text(alert, c, v, spec) for c, v in finding.evidence)
    lines.append(f"         {evidence}")
    said = spans_say(alert, report.slow_requests)
    if said is not None:
        lines.append(f"         {said['text']}")
    if finding.firing and not finding.holds:
        lines.append("         firing in Prometheus; its condition no longer holds now")
    if finding.explained_by:
        inhibited = " (inhibited in Alertmanager)" if finding.inhibited else ""
        lines.append(f"         explained by {finding.explained_by}{inhibited}")
    lines.append(f"         runbook: {runbook(report, alert.name, finding.labels)}")
    return lines


def _burn_lines(burn: Burn, report: Report) -> list[str]:
    kind = slo.KINDS.get(burn.kind)
    rates = ", ".join(f"{fmt(v, 'factor')} over {w}" for w, v in burn.burn_rates.items())
    return [
        f"{burn.severity.upper():8} {', '.join(burn.alerts)}  {burn.kind}"
        + (f" ({kind.title})" if kind else ""),
        f"         burn rate {rates or 'n/a'}; error budget remaining "
        + fmt(burn.budget_remaining, "ratio"),
        f"         runbook: {runbook(report, burn.alerts[0], burn.labels)}",
    ]


def uncalibrated_lines(spec: Spec) -> list[str]:
    """The thresholds still at their defaults, and what that means for the findings."""
    names = spec.uncalibrated()
    if not names:
        return []
    return [
        f"uncalibrated (defaults; the findings on them are info until `inferwatch "
        f"calibrate` measures them): {', '.join(names)}"
    ]


def render(report: Report) -> str:
    lines = [
        f"inferwatch diagnose: {report.source} (window {report.window})",
        f"judged with {report.judged_with}",
        *uncalibrated_lines(report.spec),
        "",
    ]
    # What users feel first, then why: each model's burning objectives, its findings under them.
    for labels, burns, causes in report.burning():
        lines.append(f"SLO burning: {_where(labels)}")
        for burn in burns:
            lines += _burn_lines(burn, report)
        if causes:
            lines.append("  causes, most likely first:")
            for finding in causes:
                lines += _finding_lines(finding, report, indent=1)
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
        lines += _finding_lines(finding, report)
    if not report.findings and not report.burns:
        lines.append("healthy: no alert condition of the heuristics spec holds")
    if report.slow_requests is not None:
        lines += ["", *slow_request_lines(report.slow_requests)]
    if report.fleet:
        lines += ["", *fleet_lines(report.fleet)]
    return "\n".join(lines)


def _seconds(value: object) -> str:
    """A duration another process sent: n/a where it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "n/a"
    return fmt(value, "seconds")


def slow_request_lines(slow: Mapping[str, Any]) -> list[str]:
    """The window's slowest requests (``/verdict.json``'s ``slow_requests``): where they spent
    their time, then each, by TTFT and by time per output token."""
    lines = [
        f"slowest requests of the last {_seconds(slow.get('window_seconds'))}, from the "
        f"server's spans ({slow.get('received', 0)} received):",
        *(f"  {line}" for line in slow.get("summary", [])),
    ]
    for kind, title in (("ttft", "by TTFT"), ("per_token", "by time per output token")):
        for r in slow[kind]:
            split = ", ".join(
                f"{part} {_seconds(r.get(f'{part}_seconds'))}"
                for part in ("queue", "prefill", "decode")
            )
            lines.append(
                f"  {title}: {r.get('request_id', 'n/a')} (trace {r.get('trace_id', 'n/a')})  "
                f"TTFT {_seconds(r.get('ttft_seconds'))}, per token "
                f"{_seconds(r.get('per_token_seconds'))}; {split}; "
                f"{r.get('prompt_tokens', 'n/a')} prompt, {r.get('output_tokens', 'n/a')} output "
                "tokens"
            )
    if not slow["ttft"] and not slow["per_token"]:
        lines.append("  no request spans in the window")
    return lines


_CIRCUIT = {0: "circuit closed", 1: "circuit open", 2: "circuit half-open"}


def _causes(alerts: tuple[Alert, ...]) -> str:
    return ", ".join(f"{a.name} ({a.layer})" for a in alerts)


def _worker_text(worker: Worker) -> str:
    rate, failed, healthy, circuit = (worker.readings[n] for n in WORKER_SIGNALS)
    parts = [f"{fmt(rate, 'count')} requests/s", f"{fmt(failed, 'ratio')} failed"]
    if healthy is not None:
        parts.append("health check passes" if healthy >= 1 else "health check fails it")
    if circuit is not None:
        parts.append(_CIRCUIT.get(int(circuit), f"circuit state {circuit:g}"))
    return ", ".join(parts)


def fleet_lines(fleet: Fleet) -> list[str]:
    """Which replica of each model holds the load and which worker a router fails, each with
    the causes found about it (:mod:`inferwatch.method.fleet`)."""
    lines = []
    for model in fleet.models:
        total = sum(r.in_flight for r in model.replicas)
        head = f"fleet: {_where(model.labels)}  {len(model.replicas)} replicas, "
        lines.append(f"{head}{fmt(total, 'count')} in flight  {_causes(model.causes)}".rstrip())
        for r in model.replicas:
            share = "" if r.share is None else f" ({fmt(r.share, 'ratio')})"
            waiting = "" if r.waiting is None else f", {fmt(r.waiting, 'count')} waiting"
            where = _where({k: v for k, v in r.labels.items() if k not in model.labels})
            text = f"  {where}  {fmt(r.in_flight, 'count')} in flight{share}{waiting}"
            lines.append(f"{text}  {_causes(r.causes)}".rstrip())
    for router in fleet.routers:
        head = f"router: {_where(router.labels)}  {len(router.workers)} workers"
        lines.append(f"{head}  {_causes(router.causes)}".rstrip())
        for w in router.workers:
            lines.append(f"  {w.worker}  {_worker_text(w)}  {_causes(w.causes)}".rstrip())
    return lines


def _fleet_json(fleet: Fleet) -> dict[str, Any]:
    return {
        "models": [
            {
                "labels": model.labels,
                "causes": [a.name for a in model.causes],
                "replicas": [
                    {
                        "labels": r.labels,
                        "in_flight": _number(r.in_flight),
                        "share": _number(r.share),
                        "waiting": _number(r.waiting),
                        "causes": [a.name for a in r.causes],
                    }
                    for r in model.replicas
                ],
            }
            for model in fleet.models
        ],
        "routers": [
            {
                "labels": router.labels,
                "causes": [a.name for a in router.causes],
                "workers": [
                    {
                        "worker": w.worker,
                        **{name: _number(v) for name, v in w.readings.items()},
                        "causes": [a.name for a in w.causes],
                    }
                    for w in router.workers
                ],
            }
            for router in fleet.routers
        ],
    }


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON (for scripts). ``slos``: one entry per model with a burning SLO,
    worst first, always present (empty when none burns); its ``causes`` are findings of
    ``findings``, which lists every finding as without SLOs."""
    return {
        "source": report.source,
        "window": report.window,
        "judged_with": report.judged_with,
        "uncalibrated": report.spec.uncalibrated(),
        "worst": report.worst(),
        "phase": dict(zip(("phase", "detail"), _phase(report), strict=True)),
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
                        "runbook": runbook(report, b.alerts[0], b.labels),
                    }
                    for b in burns
                ],
                "causes": [{"alert": f.alert.name, "labels": dict(f.labels)} for f in causes],
            }
            for labels, burns, causes in report.burning()
        ],
        "fleet": _fleet_json(report.fleet) if report.fleet is not None else None,
        "findings": [
            {
                "alert": f.alert.name,
                "severity": f.severity,
                "phase": f.alert.phase,
                "layer": f.alert.layer,
                "labels": dict(f.labels),
                "evidence": {c.signal: v for c, v in f.evidence},
                "runbook": runbook(report, f.alert.name, f.labels),
                "explained_by": f.explained_by,
                "inhibited": f.inhibited,
                "depth": f.depth,
                "holds": f.holds,
                "firing": f.firing,
                "requests": spans_say(f.alert, report.slow_requests),
            }
            for f in report.findings
        ],
        "slow_requests": report.slow_requests,
    }
