"""The system layer: the server's CPU side, and the path between the client and the engine."""

from __future__ import annotations

from inferwatch.method.alerts.alert import USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import value_of, window_mean
from inferwatch.method.scenario import (
    CANARY_OK,
    SERVED_MODEL,
    A,
    B,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE, TTFT

# ---------------------------------------------------------------------------------------
# InferenceFrontendCPUSaturated

FRONTEND_BUSY = Scenario(
    # The frontend burns 0.98 cores on A (no NVML there); on B as much, but its GPUs are
    # 95 % busy: the GPU is not waiting (near miss).
    "frontend CPU saturated",
    (
        healthy(A, frontend_cpu_cores=0.98, gpu_busy=None, gpu_collector="0x40"),
        healthy(B, frontend_cpu_cores=0.98, gpu_busy=(0.95, 0.95)),
    ),
    file="system.yaml",
    place=2,
    fires={
        "InferenceFrontendCPUSaturated": [
            instance_alert(
                "InferenceFrontendCPUSaturated",
                A,
                "warning",
                "any",
                "system",
                "The server's frontend process used 0.98 CPU cores over 5m (threshold 0.9) "
                "while the GPU was not busy: tokenization, detokenization and HTTP handling "
                "in one Python process are the bottleneck.",
                f"API server / tokenizer CPU saturated on {A}",
            )
        ]
    },
    silent=("InferenceExporterGPUMissing",),  # A never had a GPU: nothing went missing
)

FRONTEND_CPU_SATURATED = Alert(
    name="InferenceFrontendCPUSaturated",
    order=10,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="system",
    explains=(
        "InferenceQueuedWhileIdle",
        "InferenceQueueingDelay",
        "InferenceGPUUnderutilized",
        *USERS_SEE,
    ),
    for_default="5m",
    summary="API server / tokenizer CPU saturated on {{ $labels.instance }}",
    description='The server\'s frontend process used {{ $value | printf "%%.2f" }} CPU cores over '
    "%(window)s (threshold %(t.frontend_cpu_cores)s) while the GPU was not busy: "
    "tokenization, detokenization and HTTP handling in one Python process are the "
    "bottleneck.",
    when=(Cond("frontend_cpu", ">", "frontend_cpu_cores"),),
    unless=(Cond("gpu_busy", ">", "gpu_busy_high"),),
    evidence=(
        "`stacks.speedscope.json` (Left Heavy) of the API server process: tokenizer, "
        "detokenizer, JSON or the OpenAI protocol layer taking most samples is the "
        "bottleneck; a slow Python tokenizer shows up at once."
    ),
    scenarios=(FRONTEND_BUSY,),
)

# ---------------------------------------------------------------------------------------
# InferenceClientGap

SLOW_PATH = Scenario(
    # The canary's first tokens come 250 ms after the server's own TTFT on A; B's path adds
    # 40 ms (near miss).
    "client path adds to the first token",
    (
        healthy(A, canary_gap="0.25x40", canary_probes=CANARY_OK),
        healthy(B, canary_gap="0.04x40", canary_probes=CANARY_OK),
    ),
    file="system.yaml",
    place=3,
    fires={
        "InferenceClientGap": [
            instance_alert(
                "InferenceClientGap",
                A,
                "warning",
                "any",
                "system",
                f"The canary's first tokens from {SERVED_MODEL} arrive 250ms later than the "
                "server's own TTFT says (medians over the last 5m; threshold 0.1s; the server's "
                "mean TTFT 400ms). The time is spent between the client and the engine: the "
                "network, an ingress or gateway, the API server's HTTP handling and "
                "tokenization, or SSE framing.",
                f"The path to {A} adds 250ms to the first token",
            )
        ]
    },
    silent=("InferenceCanaryFailing",),
)

CLIENT_GAP = Alert(
    name="InferenceClientGap",
    order=11,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="system",
    for_default="5m",
    summary="The path to {{ $labels.instance }} adds {{ $value | humanizeDuration }} to the "
    "first token",
    description="The canary's first tokens from {{ $labels.model }} arrive {{ $value | "
    "humanizeDuration }} later than the server's own TTFT says (medians over the last "
    "%(window)s; threshold %(t.client_gap_seconds)ss; the server's mean TTFT "
    + value_of(window_mean(f"inferwatch_{TTFT}"), INSTANCE, "humanizeDuration")
    + "). The time is spent between the client and the engine: the network, an ingress "
    "or gateway, the API server's HTTP handling and tokenization, or SSE framing.",
    when=(Cond("canary_ttft_gap", ">", "client_gap_seconds"),),
    symptom=True,
    scenarios=(SLOW_PATH,),
)

ALERTS = (FRONTEND_CPU_SATURATED, CLIENT_GAP)
