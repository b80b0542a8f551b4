"""InferenceRequestErrors: a model's requests end in server errors."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import PLAIN_NUMBER, value_of
from inferwatch.method.scenario import (
    A,
    B,
    C,
    Scenario,
    healthy,
    model_alert,
    tgi,
)
from inferwatch.method.signals import MODEL

ERRORS = Scenario(
    # 10 % of A's and B's requests end in error (2/s each); C fails 2 % (near miss, but C
    # is part of the same model: 8.67 % across the fleet still fires).
    "request errors across replicas",
    (healthy(A, error_share=0.1), healthy(B, error_share=0.1), healthy(C, error_share=0.02)),
    file="availability.yaml",
    place=2,
    fires={
        # 7.333 % failing (with SLOs paging, the default, a cause alert is a ticket), out of
        # 6 requests/s.
        "InferenceRequestErrors": [model_alert(value=0.07333, queries=(6,))]
    },
)
ERRORS_NEAR_MISS = Scenario(
    "request errors near miss: 2 % fail",
    (healthy(A, error_share=0.02), healthy(B, error_share=0.02)),
    file="availability.yaml",
    place=3,
    fires={},
    silent=("InferenceRequestErrors",),
)

TGI_ERRORS = Scenario(
    # TGI: 10 % of A's and B's requests fail on the server's side (overloaded refusals,
    # generation faults: reason="error"; its successes count under reason="success").
    "TGI: request errors",
    (tgi(A, error_share=0.1), tgi(B, error_share=0.1)),
    file="tgi.yaml",
    place=4,
    fires={"InferenceRequestErrors": [model_alert(backend="tgi", value=0.1, queries=(4,))]},
)

REQUEST_ERRORS = Alert(
    name="InferenceRequestErrors",
    order=12,
    severity="critical",
    level=MODEL,
    phase="any",
    layer="availability",
    explains=("InferenceCanaryFailing",),
    for_default="5m",
    summary="{{ $labels.model }}: {{ $value | humanizePercentage }} of requests fail",
    description="{{ $value | humanizePercentage }} of the requests of {{ $labels.model }} finished "
    "with a server error over %(window)s (threshold %(pct.error_ratio)s; client aborts "
    "are not counted), out of "
    + value_of("model:inferwatch_requests_finished:%(w)s", MODEL, PLAIN_NUMBER)
    + " requests/s.",
    when=(
        Cond("model_error_ratio", ">", "error_ratio"),
        Cond("model_request_rate", ">", "min_request_rate"),
    ),
    scenarios=(ERRORS, ERRORS_NEAR_MISS, TGI_ERRORS),
)

ALERTS = (REQUEST_ERRORS,)
