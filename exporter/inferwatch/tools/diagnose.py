"""``inferwatch diagnose``: walks the method over live data with the rules' own spec.

Phase, then layer, then each condition's value against its threshold, in the method's causal
order, with the runbook to open; a finding another one explains is listed under it.
``--prometheus URL`` evaluates every alert's expression now, adds the alerts Prometheus holds
firing, puts a burning SLO first with its model's findings under it, and ends with the fleet
(which replica of each model holds the load, which worker a router fails, and the causes
found about each: :mod:`inferwatch.method.fleet`); ``--exporter URL``
computes the signals from two pages ``--interval`` seconds apart, judged with the exporter's
``/spec.json``. Text and JSON: :mod:`inferwatch.tools.report`. Sample::

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
from dataclasses import replace
from typing import Any

from inferwatch.collect.textparse import read_page
from inferwatch.collect.upstream import Upstream, UpstreamError
from inferwatch.method import slo
from inferwatch.method.alerts import ALERTS, Alert
from inferwatch.method.findings import (
    PHASE_SIGNALS,
    SEVERITY_ORDER,
    Burn,
    Finding,
    Report,
    exporter_report,
)
from inferwatch.method.fleet import REPLICA_SIGNALS, WORKER_SIGNALS, fleet_of
from inferwatch.method.rules import placeholders
from inferwatch.method.signals import (
    SIGNALS,
)
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.serve.slow_requests import KINDS
from inferwatch.settings import ConfigError
from inferwatch.tools.credentials import Credentials
from inferwatch.urls import redact_url

EXIT_UNREADABLE = 5
# The burn-rate alerts (slo.UNMEASURED says nothing burns) and the long windows of their
# conditions, in slo.BURNS order: 1h, 6h (the page), 1d, 3d (the ticket).
BURN_ALERTS = (slo.FAST, slo.SLOW)
BURN_WINDOWS = tuple(dict.fromkeys(b.long for b in slo.BURNS))


class SourceError(Exception):
    """The source cannot be read or does not hold inferwatch data; str() is one line."""


def _upstream(url: str, timeout: float, credentials: Credentials | None) -> Upstream:
    """Reads of the source, with its basic auth and the CA to verify it with."""
    access = credentials or Credentials()
    return Upstream(
        url,
        timeout=timeout,
        max_bytes=64 * 1024 * 1024,
        headers=access.headers,
        ssl_context=access.ssl,
    )


# --- from Prometheus -----------------------------------------------------------------------


async def _query(upstream: Upstream, expr: str) -> list[tuple[dict[str, str], float]]:
    path = "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        doc = json.loads(await upstream.get_body(path))
    except UpstreamError as exc:
        hint = " (give --user and --password-file)" if exc.status == 401 else ""
        raise SourceError(f"{exc}{hint}") from None
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
    # A router's signals have one series per worker, a disaggregated model's one per pool.
    keys = ("instance", "job", "backend", "model", "worker", "role")
    return all(series[k] == labels[k] for k in keys if k in series and k in labels)


class _Signals:
    """The signals' PromQL forms queried once each, read per finding's label set."""

    def __init__(self, upstream: Upstream, spec: Spec) -> None:
        self.upstream, self.values = upstream, placeholders(spec)
        self.series: dict[str, list[tuple[dict[str, str], float]]] = {}

    async def of(self, name: str) -> list[tuple[dict[str, str], float]]:
        if name not in self.series:
            self.series[name] = await _query(self.upstream, SIGNALS[name].promql % self.values)
        return self.series[name]

    async def reading(self, name: str, labels: Mapping[str, str]) -> tuple[str, float | None]:
        """The signal read for a label set and its value: its fallback's where the signal
        has no series for it and the fallback has (the alert expression's ``or``)."""
        matches = [v for series, v in await self.of(name) if _covers(series, labels)]
        fallback = SIGNALS[name].fallback
        if not matches and fallback is not None:
            read = await self.reading(fallback, labels)
            if read[1] is not None:  # else neither has a series: the signal's own name
                return read
        return name, (matches[0] if matches else None)

    async def phase(self) -> dict[str, float | None]:
        """The phase signals, the worst instance's; a fallback's where it has series and the
        signal none."""
        phase: dict[str, float | None] = {}
        for first in PHASE_SIGNALS:
            name: str | None = first
            while name is not None and not await self.of(name):
                name = SIGNALS[name].fallback
            name = name or first
            known = [v for _, v in await self.of(name) if not math.isnan(v)]
            phase[name] = max(known) if known else None
        return phase


async def from_prometheus(
    url: str,
    spec: Spec,
    timeout: float = 10.0,
    judged_with: str = "the built-in defaults",
    credentials: Credentials | None = None,
) -> Report:
    """The spec's alerts evaluated by the Prometheus at ``url`` (``credentials``: its web
    config's basic auth, a CA for its TLS)."""
    upstream = _upstream(url, timeout, credentials)
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
        signals = _Signals(upstream, spec)

        async def finding(alert: Alert, labels: Mapping[str, str], holds: bool) -> Finding:
            found = Finding(alert, labels, holds=holds, severity=spec.severity(alert))
            for cond in alert.conditions():
                read, value = await signals.reading(cond.signal, labels)
                found.evidence.append((replace(cond, read=read), value))
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
        phase = await signals.phase()
        burns = await _burns(upstream, spec)
        readings = {name: await signals.of(name) for name in (*REPLICA_SIGNALS, *WORKER_SIGNALS)}
    finally:
        await upstream.close()
    report = Report(redact_url(url), spec.timing.window, spec, phase, findings, burns, judged_with)
    report.fleet = fleet_of(readings, report.findings, spec.fleet_labels)
    return report


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
    url: str,
    given: tuple[Spec, str] | None = None,
    interval: float = 5.0,
    timeout: float = 10.0,
    credentials: Credentials | None = None,
) -> Report:
    """Two scrapes of the exporter ``interval`` apart, judged with the spec it serves
    (``/spec.json``, the one its verdict page judges with) unless ``given`` (a spec and where
    it came from, for the report)."""
    upstream = _upstream(url, timeout, credentials)
    try:
        spec, judged_with = given or await _served_spec(upstream)
        first = read_page(await upstream.get_exposition("/metrics"))
        started = time.monotonic()
        await asyncio.sleep(interval)
        second = read_page(await upstream.get_exposition("/metrics"))
        seconds = time.monotonic() - started
        slow = await _slow_requests(upstream)
    except (UpstreamError, ValueError) as exc:
        raise SourceError(str(exc)) from None
    finally:
        await upstream.close()
    if "inferwatch_build_info" not in second:
        raise SourceError(
            f"{redact_url(url)} is not an inferwatch exporter (no inferwatch_build_info)"
        )
    report = exporter_report(redact_url(url), first, second, seconds, spec, judged_with)
    report.sidecar = redact_url(upstream.origin()) + "/"
    report.slow_requests = slow
    return report


async def _slow_requests(upstream: Upstream) -> dict[str, Any] | None:
    """The exporter's slowest requests of its window (``/verdict.json``'s ``slow_requests``,
    from the server's spans); None where it receives none, serves no verdict (a release
    before it) or serves one of another shape."""
    try:
        doc = json.loads(await upstream.get_body("/verdict.json"))
    except UpstreamError as exc:
        if exc.status == 404:
            return None
        raise
    except ValueError:
        return None
    slow = doc.get("slow_requests") if isinstance(doc, dict) else None
    if not isinstance(slow, dict):
        return None
    kinds = [slow.get(kind) for kind in KINDS]
    if not all(isinstance(k, list) and all(isinstance(r, dict) for r in k) for k in kinds):
        return None
    return slow


async def _served_spec(upstream: Upstream) -> tuple[Spec, str]:
    """The spec the exporter judges with; the built-in defaults from one that serves none
    (a release before /spec.json)."""
    where = redact_url(upstream.origin() + "/spec.json")
    try:
        doc = json.loads(await upstream.get_body("/spec.json"))
    except UpstreamError as exc:
        if exc.status == 404:
            return spec_from_config({}), f"the built-in defaults ({where}: none served)"
        raise
    except ValueError:
        raise SourceError(f"{where} is not JSON") from None
    try:
        return spec_from_config(doc), f"the exporter's own spec ({where})"
    except (ConfigError, AttributeError, TypeError) as exc:
        raise SourceError(f"{where} is not a spec inferwatch reads: {exc}") from None
