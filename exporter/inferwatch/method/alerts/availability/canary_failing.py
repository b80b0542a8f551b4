"""InferenceCanaryFailing: the canary's requests fail while the server reports up."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import PLAIN_NUMBER, canary_probes, value_of
from inferwatch.method.alerts.availability.backend_down import backend_down
from inferwatch.method.scenario import (
    A,
    B,
    C,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE

CANARY_FAILS = Scenario(
    # A's canary: a probe every 12 s, 40 % answered, 40 % time out, 20 % get an HTTP error
    # (60 % failing, 10 timeouts and 5 errors in 5 m) while the server reports up. B: one
    # timeout in 11 probes (near miss). C's server is down: its canary failing is no news.
    "canary failing while the server reports up",
    (
        healthy(A, canary_probes={"ok": 1 / 30, "timeout": 1 / 30, "http_error": 1 / 60}),
        healthy(B, canary_probes={"ok": 1 / 15, "timeout": 1 / 150}),
        healthy(C, backend_up="0x40", canary_probes={"connect_error": 1 / 15}),
    ),
    file="availability.yaml",
    place=9,
    fires={
        # 60 % failing: 10 timed out, 5 got an HTTP error, none could not connect.
        "InferenceCanaryFailing": [instance_alert(A, value=0.6, queries=(10, 5, 0))],
        "InferenceBackendDown": [backend_down(C, took=0.004)],
    },
    silent=("InferenceClientGap",),
)

CANARY_FAILING = Alert(
    name="InferenceCanaryFailing",
    order=13,
    severity="critical",
    level=INSTANCE,
    phase="any",
    layer="availability",
    for_default="5m",
    summary="The canary's requests to {{ $labels.instance }} fail while the server reports up",
    description="{{ $value | humanizePercentage }} of the canary's probes of {{ $labels.model }} "
    "failed over the last %(window)s (threshold %(pct.canary_failure_ratio)s) while the "
    "server's /metrics answers: "
    + value_of(canary_probes("timeout"), INSTANCE, PLAIN_NUMBER)
    + " timed out, "
    + value_of(canary_probes("http_error"), INSTANCE, PLAIN_NUMBER)
    + " got an HTTP error, "
    + value_of(canary_probes("connect_error"), INSTANCE, PLAIN_NUMBER)
    + " could not connect. Users on the same path (ingress, gateway, authentication, the "
    "API server) fail too; the sidecar's log names each kind of failure.",
    when=(
        Cond("canary_failure_ratio", ">", "canary_failure_ratio"),
        Cond("backend_up", "==", 1),
    ),
    symptom=True,
    outside_the_slis=True,
    scenarios=(CANARY_FAILS,),
)

ALERTS = (CANARY_FAILING,)
