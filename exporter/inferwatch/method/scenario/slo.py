"""The SLO alerts' scenarios: stretches of traffic over hours or days, and what fires when.

The SLO rules judge the raw TTFT histogram and the finished requests by reason, so a
:class:`Phase` says only how many requests there are and which shares miss or end badly;
:func:`slo_series` writes one replica's series over several phases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.method.scenario.series import labels
from inferwatch.method.scenario.workload import TTFT_LE, A

SLO_MODEL, SLO_LARGE = "llama-3-8b", "llama-3-70b"  # 0.5 s and 2.5 s TTFT objectives


@dataclass(frozen=True)
class Phase:
    """A stretch of traffic: its length, request rate and which shares miss or end badly."""

    minutes: int
    requests_per_s: float = 2.0
    slow_share: float = 0.0  # first token after 2.5-5 s instead of 0.25-0.5 s
    medium_share: float = 0.0  # first token after 0.5-2.5 s
    error_share: float = 0.0
    abort_share: float = 0.0


# Long windows hold only the history there is: healthy traffic first, as long as the
# longest window a scenario judges apart from the short ones (6 h), so that each window
# means what it says.
SIX_HOURS = Phase(6 * 60)
ONSET = 6 * 60  # minutes


def after_onset(minutes: int, onset: int = ONSET) -> str:
    """The evaluation time ``minutes`` after the healthy hours."""
    return f"{onset + minutes}m"


def _piecewise(step: int, phases: tuple[Phase, ...], per_request: Callable[[Phase], float]) -> str:
    """A counter's promtool values growing at ``per_request(phase) x rate`` per phase."""
    parts, value, first = [], 0.0, True
    for p in phases:
        samples = p.minutes * 60 // step
        inc = per_request(p) * p.requests_per_s * step
        if first:
            parts.append(f"{value:g}+{inc:g}x{samples}")
            value += inc * samples
            first = False
        else:
            parts.append(f"{value + inc:g}+{inc:g}x{samples - 1}")
            value += inc * samples
    return " ".join(parts)


def slo_series(
    step: int,
    phases: tuple[Phase, ...],
    model: str = SLO_MODEL,
    namespace: str = "prod",
    instance: str = A,
    bounds: tuple[float, ...] = TTFT_LE,
) -> list[dict]:
    """TTFT histogram and finished requests by reason of one replica over ``phases``."""
    engine = {"instance": instance, "job": "inferwatch", "namespace": namespace}
    engine |= {"backend": "vllm", "model": model, "engine": "0"}
    metric = "inferwatch_time_to_first_token_seconds"
    out = []
    for le in (*bounds, "+Inf"):

        def below(p: Phase, le=le) -> float:
            fast = 1 - p.slow_share - p.medium_share
            if le == "+Inf" or le >= 5.0:
                return 1.0
            return fast * (le >= 0.5) + p.medium_share * (le >= 2.5)

        out.append(
            {
                "series": f"{metric}_bucket" + labels(**engine, le=str(le)),
                "values": _piecewise(step, phases, below),
            }
        )
    out.append(
        {
            "series": f"{metric}_count" + labels(**engine),
            "values": _piecewise(step, phases, lambda p: 1.0),
        }
    )
    for reason, share in (
        ("stop", lambda p: 1 - p.error_share - p.abort_share),
        ("error", lambda p: p.error_share),
        ("abort", lambda p: p.abort_share),
    ):
        out.append(
            {
                "series": "inferwatch_requests_finished_total" + labels(**engine, reason=reason),
                "values": _piecewise(step, phases, share),
            }
        )
    return out


def firing(alert: str, slo: str, model: str = SLO_MODEL, namespace: str = "prod") -> dict:
    """The alert's series in ``ALERTS`` (labels only: promql_expr_test shows no annotations)."""
    severity = "critical" if alert == "InferenceSLOFastBurn" else "warning"
    pairs = {"alertname": alert, "alertstate": "firing", "severity": severity, "slo": slo}
    pairs |= {"layer": "slo", "namespace": namespace, "backend": "vllm", "model": model}
    return {"labels": "ALERTS" + labels(**pairs), "value": 1}


def slo_checks(
    at: str, fast: tuple[dict, ...] | None = (), slow: tuple[dict, ...] | None = ()
) -> list[dict]:
    """What fires at ``at``: the fast and slow burns expected (None: not checked)."""
    checks = []
    for alert, expected in (("InferenceSLOFastBurn", fast), ("InferenceSLOSlowBurn", slow)):
        if expected is None:
            continue
        checks.append(
            {
                "expr": f'ALERTS{{alertname="{alert}",alertstate="firing"}}',
                "eval_time": at,
                "exp_samples": list(expected),
            }
        )
    return checks
