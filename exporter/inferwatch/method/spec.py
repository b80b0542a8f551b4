"""The spec: thresholds, timing and labels, from defaults and the config file.

Everything the generated artifacts (rules, runbooks, Alertmanager example, dashboards) and
the local evaluation depend on. The windows and ``for`` durations live in :class:`Timing`;
both they and the thresholds can be overridden in the config file (``thresholds:`` and
``alerting:`` sections, parsed strictly).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferwatch.method.alerts import ALERTS, OUTSIDE_THE_SLIS, Alert
from inferwatch.method.durations import is_duration, seconds
from inferwatch.method.slo import SLOs, slos_document, slos_from_config
from inferwatch.method.thresholds import MACHINE_DEPENDENT, THRESHOLDS
from inferwatch.settings import ConfigError, check_keys, http_url, non_negative_number
from inferwatch.urls import runbook_url

# Most urgent first.
SEVERITY_ORDER = ("critical", "warning", "info")


def duration(text: str) -> str:
    """A Prometheus duration such as ``30s`` or ``5m`` (one unit)."""
    text = str(text).strip()
    if not is_duration(text, ("ms", "s", "m", "h")):
        raise ConfigError(f"{text!r} is not a duration like 30s, 5m or 1h")
    return text


@dataclass(frozen=True)
class Timing:
    """Rate window, evaluation interval and ``for`` durations.

    The rate window must cover at least 4 scrapes (Prometheus 3 reads range selectors as
    left-open intervals; a window of 4x the scrape interval always holds 3+ samples).
    """

    window: str = "5m"
    evaluation_interval: str = "30s"
    gpu_lost_lookback: str = "6h"
    for_: Mapping[str, str] = field(default_factory=dict)

    def for_alert(self, alert: Alert) -> str:
        return self.for_.get(alert.name, alert.for_default)


@dataclass(frozen=True)
class Spec:
    """Thresholds, timing and labels: everything the generated artifacts depend on."""

    thresholds: Mapping[str, float]
    timing: Timing = Timing()
    # Labels that identify a model across replicas (add e.g. "cluster" for multi-cluster;
    # the config's list is added to these).
    fleet_labels: tuple[str, ...] = ("namespace", "backend", "model")
    slos: SLOs = field(default_factory=SLOs)
    # What pages: "slo" (burn-rate alerts page, cause alerts are tickets) or "causes" (the
    # cause alerts' own severities, for users without SLOs).
    paging: str = "slo"
    # Selects the exporter's own scrape job (its `up` series).
    exporter_selector: str = 'job=~".*inferwatch.*"'
    # Where the team hosts the runbooks (``<base><Alert>.md``); empty: the sidecar serves
    # them (``/runbooks/<Alert>``).
    runbook_url_base: str = ""
    # The server the objectives' bucket bounds were checked against (the config's backend).
    backend: str = "auto"
    # The machine-dependent thresholds (THRESHOLDS' ``calibrated_by``) that were set: measured
    # by `inferwatch calibrate`, given by hand or by a baseline file. The others hold their
    # defaults, and the alerts that fire on them stay at info (:meth:`severity`).
    calibrated: frozenset[str] = frozenset()

    @property
    def window_seconds(self) -> float:
        return seconds(self.timing.window)

    @property
    def rate_name(self) -> str:
        """The rate window as it appears in recording-rule names: ``rate5m``."""
        return f"rate{self.timing.window}"

    def threshold(self, name: str) -> float:
        """The value of a threshold of :data:`~inferwatch.method.thresholds.THRESHOLDS`."""
        return self.thresholds[name]

    def uncalibrated(self, alert: Alert | None = None) -> list[str]:
        """The machine-dependent thresholds still at their defaults (of those ``alert``
        fires on, where given), in THRESHOLDS order."""
        names = alert.thresholds(firing_only=True) if alert is not None else MACHINE_DEPENDENT
        return [n for n in names if n in MACHINE_DEPENDENT and n not in self.calibrated]

    def severity(self, alert: Alert) -> str:
        """The alert's severity: info while a threshold it fires on is uncalibrated (a
        default meant for no machine in particular must not page a healthy server); with
        SLOs paging, only the alerts about requests that never reach the server (they are
        in no SLI) page besides them."""
        if self.uncalibrated(alert):
            return "info"
        if self.paging == "slo" and alert.severity == "critical":
            return "critical" if alert.name in OUTSIDE_THE_SLIS else "warning"
        return alert.severity

    def runbook_url(self, alert: str, sidecar: str | None) -> str | None:
        """Where ``alert``'s runbook opens (:func:`inferwatch.urls.runbook_url`)."""
        return runbook_url(self.runbook_url_base, alert, sidecar)

    def inhibits(self, cause: Alert, effect: Alert) -> bool:
        """Whether Alertmanager inhibits ``effect`` while ``cause`` (which explains it)
        fires: only where the cause is at least as severe (a ticket never silences a page),
        and never a latency that a cause explains only up to its stretch (``Alert.stretch``:
        whether it does is weighed on the evidence, by the verdict and diagnose)."""
        if cause.stretch and effect.slows():
            return False
        order = SEVERITY_ORDER.index
        return order(self.severity(cause)) <= order(self.severity(effect))


_ALERTING_KEYS = {
    "rate_window",
    "evaluation_interval",
    "gpu_lost_lookback",
    "for",
    "fleet_labels",
    "paging",
    "exporter_selector",
    "runbook_url_base",
}


# Thresholds of an earlier release, and what judges their condition now.
REPLACED_THRESHOLDS = {
    "itl_tail_ratio": "itl_tail_bound_seconds and itl_tail_share (the share of token gaps "
    "above a bucket bound: a ratio of quantiles hid tails in wide buckets)",
}


# A PromQL label matcher list, as between the braces of ``up{...}``: ``name op string``,
# comma-separated, each string quoted as PromQL quotes (no line break: a selector is one line).
_STRING = r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`\n]*`'
_MATCHER = rf"\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*(?:{_STRING})\s*"
_MATCHERS = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*,?\s*")


def selector(value: object) -> str:
    """``alerting.exporter_selector``: a PromQL label matcher list (it goes into every rule
    and runbook that reads the exporter's ``up``)."""
    if not isinstance(value, str) or not _MATCHERS.fullmatch(value):
        raise ConfigError(
            f"alerting.exporter_selector: {value!r} is not a PromQL label matcher list such as "
            f"{Spec.exporter_selector}"
        )
    return value


def url_base(value: object) -> str:
    """``alerting.runbook_url_base``: '' or an http:// or https:// URL (it becomes every
    rule's ``runbook_url`` and the pages' runbook links)."""
    if value == "":
        return ""
    if not isinstance(value, str):
        raise ConfigError("alerting.runbook_url_base: expected an http:// or https:// URL")
    try:
        return http_url(value)
    except ValueError as exc:
        raise ConfigError(f"alerting.runbook_url_base: {exc}") from None


def spec_from_config(
    config: Mapping[str, Any], baseline_thresholds: Mapping[str, float] | None = None
) -> Spec:
    """The spec with the config file's ``thresholds:`` and ``alerting:`` overrides.

    ``baseline_thresholds`` (from a baseline file) replace the latency defaults; values set
    explicitly in the config file win over both.
    """
    thresholds = {name: t.default for name, t in THRESHOLDS.items()}
    thresholds.update(baseline_thresholds or {})
    calibrated = set(baseline_thresholds or ())
    given = config.get("thresholds") or {}
    if not isinstance(given, Mapping):
        raise ConfigError("thresholds: expected a mapping of threshold names to numbers")
    for name, instead in REPLACED_THRESHOLDS.items():
        if name in given:
            raise ConfigError(
                f"thresholds.{name}: replaced by {instead}; run `inferwatch calibrate` again "
                "or set those"
            )
    check_keys(given, THRESHOLDS, "thresholds")
    for name, value in given.items():
        thresholds[name] = non_negative_number(value, f"thresholds.{name}")
    calibrated.update(given)
    alerting = config.get("alerting") or {}
    if not isinstance(alerting, Mapping):
        raise ConfigError("alerting: expected a mapping")
    check_keys(alerting, _ALERTING_KEYS, "alerting")
    for_ = alerting.get("for") or {}
    if not isinstance(for_, Mapping):
        raise ConfigError("alerting.for: expected a mapping of alert names to durations")
    check_keys(for_, ALERTS, "alerting.for")
    try:
        timing = Timing(
            window=duration(alerting.get("rate_window", Timing.window)),
            evaluation_interval=duration(
                alerting.get("evaluation_interval", Timing.evaluation_interval)
            ),
            gpu_lost_lookback=duration(alerting.get("gpu_lost_lookback", Timing.gpu_lost_lookback)),
            for_={name: duration(value) for name, value in for_.items()},
        )
    except ConfigError as exc:
        raise ConfigError(f"alerting: {exc}") from None
    fleet = alerting.get("fleet_labels", [])
    if not isinstance(fleet, (list, tuple)) or not all(isinstance(x, str) for x in fleet):
        raise ConfigError("alerting.fleet_labels: expected a list of label names")
    paging = alerting.get("paging", Spec.paging)
    if paging not in ("slo", "causes"):
        raise ConfigError(f"alerting.paging: {paging!r} is not one of slo, causes")
    return Spec(
        thresholds=thresholds,
        timing=timing,
        fleet_labels=tuple(dict.fromkeys((*Spec.fleet_labels, *fleet))),
        slos=slos_from_config(config.get("slos"), str(config.get("backend", "auto"))),
        paging=paging,
        exporter_selector=selector(alerting.get("exporter_selector", Spec.exporter_selector)),
        runbook_url_base=url_base(alerting.get("runbook_url_base", Spec.runbook_url_base)),
        backend=str(config.get("backend", Spec.backend)),
        calibrated=frozenset(calibrated) & frozenset(MACHINE_DEPENDENT),
    )


def spec_document(spec: Spec) -> dict[str, Any]:
    """The spec as a config file's sections, which :func:`spec_from_config` reads back to an
    equal spec: what the exporter serves at ``/spec.json``, so that ``diagnose --exporter``
    judges with what the exporter judges with. No path and no secret: what a baseline file
    gave is in ``thresholds``; an uncalibrated threshold is left out (it holds its default)."""
    timing = spec.timing
    uncalibrated = spec.uncalibrated()
    return {
        "backend": spec.backend,
        "thresholds": {k: v for k, v in spec.thresholds.items() if k not in uncalibrated},
        "alerting": {
            "rate_window": timing.window,
            "evaluation_interval": timing.evaluation_interval,
            "gpu_lost_lookback": timing.gpu_lost_lookback,
            "for": dict(timing.for_),
            "fleet_labels": list(spec.fleet_labels),
            "paging": spec.paging,
            "exporter_selector": spec.exporter_selector,
            "runbook_url_base": spec.runbook_url_base,
        },
        "slos": slos_document(spec.slos),
    }
