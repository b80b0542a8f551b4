"""A promtool scenario: replicas, the alerts expected to fire, the alerts that must stay
silent; and its promtool test group.

An expected alert is its own labels, its ``$value`` and what each query of its text returns;
its severity, phase, layer and text come from its rule, the text rendered as Prometheus
renders it (:mod:`~inferwatch.method.scenario.render`), so that it is never typed twice. The
numbers follow from the stated distributions (histogram_quantile interpolates linearly inside
a bucket: all observations in (2.5, 5] give p95 = 2.5 + 0.95 * 2.5 = 4.875 s). Thresholds are
the shipped defaults (see alerts/runbooks/*.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from inferwatch.method.scenario.render import Answer, Answers, render
from inferwatch.method.scenario.series import gpu_labels, input_series
from inferwatch.method.scenario.workload import (
    EVAL,
    ROUTER,
    ROUTER_BACKEND,
    ROUTER_MODEL,
    SERVED_MODEL,
    STEP,
    Replica,
    Router,
)


@dataclass(frozen=True)
class Expected:
    """An alert expected to fire: its labels besides its rule's, its ``$value`` (None where
    its text does not show it) and the answers to its text's queries, in the order they are
    first asked (:class:`~inferwatch.method.scenario.render.Answers`)."""

    labels: Mapping[str, str]
    value: float | None = None
    queries: tuple[Answer, ...] = ()

    def promtool(self, rule: Mapping[str, Any]) -> dict:
        """The expectation as promtool's ``exp_alerts`` item, for the alert's rule (as the
        rules file holds it: labels, and annotations with the spec's values filled in)."""
        labels = {**rule["labels"], **self.labels}
        answers = Answers(self.queries)
        annotations = {
            name: render(text, labels, self.value, answers)
            for name, text in rule["annotations"].items()
        }
        answers.check_all_asked()
        return {"exp_labels": labels, "exp_annotations": annotations}


@dataclass(frozen=True)
class Scenario:
    """What a few replicas serve and what the cause alerts make of it.

    ``file`` is the promtool test file under alerts/tests/ it is written to and ``place`` its
    position there (a number no other scenario of that file has).
    """

    name: str
    replicas: tuple[Replica | Router, ...]
    _: KW_ONLY
    file: str
    place: int
    fires: dict[str, list[Expected]]  # alert name -> the alerts expected
    silent: tuple[str, ...] = ()  # alerts that must not fire (near misses, cross-checks)
    eval_time: str = EVAL
    # Recorded series and their values at ``eval_time``: (expression, labels, value).
    records: tuple[tuple[str, str, float], ...] = ()


def instance_alert(
    instance: str,
    *,
    value: float | None = None,
    queries: tuple[Answer, ...] = (),
    backend: str | None = "vllm",
    model: str | None = SERVED_MODEL,
    **labels: str,
) -> Expected:
    """An alert of one instance (of its server's backend and model, where its series carry
    them: None where not); ``labels`` the alert's others."""
    own = {"instance": instance, "job": "inferwatch", "backend": backend, "model": model}
    return Expected({k: v for k, v in own.items() if v is not None} | labels, value, queries)


def worker_alert(worker: str, *, value: float) -> Expected:
    """An alert of the sidecar next to a vllm-router (:data:`ROUTER`) about one of its
    workers."""
    return instance_alert(
        ROUTER, value=value, backend=ROUTER_BACKEND, model=ROUTER_MODEL, worker=worker
    )


def gpu_alert(
    instance: str, *, value: float | None = None, queries: tuple[Answer, ...] = (), **labels: str
) -> Expected:
    """An alert of GPU 0 of one instance: its GPU's labels, no backend or model."""
    return instance_alert(
        instance,
        value=value,
        queries=queries,
        backend=None,
        model=None,
        **gpu_labels(instance, 0),
        **labels,
    )


def model_alert(
    *,
    value: float | None = None,
    queries: tuple[Answer, ...] = (),
    backend: str = "vllm",
    **labels: str,
) -> Expected:
    """An alert of the fleet rules: labelled by model, not by instance (``labels`` the
    alert's others: a pool's role)."""
    return Expected({"backend": backend, "model": SERVED_MODEL} | labels, value, queries)


def promtool_group(s: Scenario, rules: Mapping[str, Mapping[str, Any]]) -> dict:
    """The scenario as one promtool test: its series, each expectation, nothing else firing;
    ``rules`` the alert rules by name."""
    series = [item for r in s.replicas for item in input_series(r)]
    checks = [
        {
            "eval_time": s.eval_time,
            "alertname": name,
            "exp_alerts": [alert.promtool(rules[name]) for alert in alerts],
        }
        for name, alerts in s.fires.items()
    ]
    checks += [{"eval_time": s.eval_time, "alertname": name} for name in s.silent]
    firing = sorted(s.fires)
    return {
        "name": s.name,
        "interval": f"{STEP}s",
        "input_series": series,
        "alert_rule_test": checks,
        "promql_expr_test": [
            {
                # Nothing but the expected cause alerts fires (pending ones are not counted;
                # the SLO alerts these errors and latencies burn are judged in slos-*.yaml).
                "expr": 'count by (alertname) (ALERTS{alertstate="firing",layer!="slo"})',
                "eval_time": s.eval_time,
                "exp_samples": [
                    {"labels": f'{{alertname="{a}"}}', "value": len(s.fires[a])} for a in firing
                ],
            },
            *(
                {
                    "expr": expr,
                    "eval_time": s.eval_time,
                    "exp_samples": [{"labels": labels, "value": value}],
                }
                for expr, labels, value in s.records
            ),
        ],
    }
