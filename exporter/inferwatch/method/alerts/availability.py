"""Availability: a server the sidecar cannot read, requests that fail, GPUs that vanish."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import PLAIN_NUMBER, canary_probes, value_of
from inferwatch.method.alerts.scheduling import queued_while_idle_on_a
from inferwatch.method.scenario import (
    SERVED_MODEL,
    A,
    B,
    C,
    Scenario,
    healthy,
    instance_alert,
    model_alert,
    tgi,
)
from inferwatch.method.signals import INSTANCE, MODEL

# ---------------------------------------------------------------------------------------
# InferenceBackendDown


def backend_down(instance: str, took: str) -> dict:
    """InferenceBackendDown for ``instance``, its last scrape attempt having taken ``took``."""
    return instance_alert(
        "InferenceBackendDown",
        instance,
        "critical",
        "any",
        "availability",
        f"inferwatch on {instance} has not been able to read the vllm server's /metrics (or the "
        f"sidecar itself is down) for 1m; its last scrape attempt took {took} (the sidecar's log "
        "names the cause). Latency alerts of this pod are inhibited meanwhile.",
        f"Inference backend on {instance} cannot be scraped",
        no_model="",
        backend="vllm",
    )


DOWN = Scenario(
    # A's backend stops answering at 5m; B misses a single scrape (near miss).
    "backend down",
    (
        healthy(A, backend_up="1x10 0x30", scrape_duration="0.004x10 2x30"),
        healthy(B, backend_up="1x10 0 1x29"),
    ),
    file="availability.yaml",
    place=1,
    fires={"InferenceBackendDown": [backend_down(A, "2s")]},
)

BACKEND_DOWN = Alert(
    name="InferenceBackendDown",
    order=1,
    severity="critical",
    level=INSTANCE,
    phase="any",
    layer="availability",
    for_default="1m",
    summary="Inference backend on {{ $labels.instance }} cannot be scraped",
    description="inferwatch on {{ $labels.instance }} has not been able to read the "
    '{{ or $labels.backend "inference" }} server\'s /metrics (or the sidecar itself '
    "is down) for %(for)s; its last scrape attempt took "
    + value_of(
        "inferwatch_backend_scrape_duration_seconds",
        INSTANCE,
        "humanizeDuration",
        match_model=False,
    )
    + " (the sidecar's log names the cause). Latency alerts of this pod are inhibited "
    "meanwhile.",
    any_of=(Cond("backend_up", "==", 0), Cond("exporter_up", "==", 0)),
    outside_the_slis=True,
    scenarios=(DOWN,),
)

# ---------------------------------------------------------------------------------------
# InferenceRequestErrors

ERRORS = Scenario(
    # 10 % of A's and B's requests end in error (2/s each); C fails 2 % (near miss, but C
    # is part of the same model: 8.67 % across the fleet still fires).
    "request errors across replicas",
    (healthy(A, error_share=0.1), healthy(B, error_share=0.1), healthy(C, error_share=0.02)),
    file="availability.yaml",
    place=2,
    fires={
        "InferenceRequestErrors": [
            model_alert(
                "InferenceRequestErrors",
                "warning",  # with SLOs paging (the default) a cause alert is a ticket
                "any",
                "availability",
                f"7.333% of the requests of {SERVED_MODEL} finished with a server error over 5m "
                "(threshold 5 %; client aborts are not counted), out of 6 requests/s.",
                f"{SERVED_MODEL}: 7.333% of requests fail",
            )
        ]
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
    fires={
        "InferenceRequestErrors": [
            model_alert(
                "InferenceRequestErrors",
                "warning",
                "any",
                "availability",
                f"10% of the requests of {SERVED_MODEL} finished with a server error over 5m "
                "(threshold 5 %; client aborts are not counted), out of 4 requests/s.",
                f"{SERVED_MODEL}: 10% of requests fail",
                backend="tgi",
            )
        ]
    },
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

# ---------------------------------------------------------------------------------------
# InferenceCanaryFailing

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
        "InferenceCanaryFailing": [
            instance_alert(
                "InferenceCanaryFailing",
                A,
                "critical",
                "any",
                "availability",
                f"60% of the canary's probes of {SERVED_MODEL} failed over the last 5m (threshold "
                "25 %) while the server's /metrics answers: 10 timed out, 5 got an HTTP "
                "error, 0 could not connect. Users on the same path (ingress, gateway, "
                "authentication, the API server) fail too; the sidecar's log names each kind "
                "of failure.",
                f"The canary's requests to {A} fail while the server reports up",
            )
        ],
        "InferenceBackendDown": [backend_down(C, "4ms")],
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

# ---------------------------------------------------------------------------------------
# InferenceExporterGPUMissing

GPUS_LOST = Scenario(
    # NVML on A worked, then fails from 5m on; C never had a GPU (CPU-only): silent.
    "exporter lost its GPUs",
    (
        healthy(
            A,
            gpu_collector="1x10 0x30",
            gpu_busy=(0.85,),
            gpu_memory_total="85899345920x10 _x30",
        ),
        healthy(C, gpu_collector="0x40", gpu_busy=None),
    ),
    file="availability.yaml",
    place=8,
    fires={
        "InferenceExporterGPUMissing": [
            instance_alert(
                "InferenceExporterGPUMissing",
                A,
                "warning",
                "any",
                "availability",
                f"NVML collection on {A} worked within the last 6h (GPUs seen: 1) and now fails: "
                "a GPU vanished (fell off the bus, Xid error) or the driver/NVML became "
                "unavailable. GPU series and the GPU-based idle signal are missing meanwhile.",
                f"inferwatch on {A} lost its GPUs",
                no_model="",
                collector="gpu",
            )
        ]
    },
)

EXPORTER_GPU_MISSING = Alert(
    name="InferenceExporterGPUMissing",
    order=17,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="availability",
    for_default="5m",
    summary="inferwatch on {{ $labels.instance }} lost its GPUs",
    description="NVML collection on {{ $labels.instance }} worked within the last %(lookback)s "
    "(GPUs seen: "
    + value_of(
        "count(last_over_time(inferwatch_gpu_memory_total_bytes[%(lookback)s]))",
        INSTANCE,
        PLAIN_NUMBER,
        match_model=False,
    )
    + ") and now fails: a GPU vanished (fell off the bus, Xid error) or the "
    "driver/NVML became unavailable. GPU series and the GPU-based idle signal are "
    "missing meanwhile.",
    when=(Cond("gpu_collection", "==", 0), Cond("gpu_collection_recent", "==", 1)),
    scenarios=(GPUS_LOST,),
)

# ---------------------------------------------------------------------------------------
# InferenceEngineHung

ENGINE_HUNG = Scenario(
    # B: six requests "running" for the whole window, and not a token generated nor a
    # prompt read. C serves embeddings: requests run, prompts are read, no token is generated
    # (near miss). A's engine is paused with requests waiting: InferenceQueuedWhileIdle's
    # case, not this one.
    "a hung engine behind an API server that still answers",
    (
        healthy(A, requests_per_s=0.0, steps_per_s=0.0, waiting=(9,), queued_while_idle_share=0.9),
        healthy(B, requests_per_s=0.0, steps_per_s=0.0, running=(6,), waiting=(0,)),
        healthy(C, generation_tokens_per_request=0),
    ),
    file="availability.yaml",
    place=11,
    fires={
        "InferenceEngineHung": [
            instance_alert(
                "InferenceEngineHung",
                B,
                "critical",
                "any",
                "availability",
                f"{SERVED_MODEL} on {B} had 6 requests running over the last 5m and generated "
                "no token nor read a prompt: its engine has died or hung while its API server "
                "still answers. Its running and waiting gauges are the engine's last report, "
                "not the present.",
                f"The engine of {B} is hung while its API server answers",
            )
        ],
        "InferenceQueuedWhileIdle": [queued_while_idle_on_a(90, 9)],
    },
)

ENGINE_HUNG_ALERT = Alert(
    name="InferenceEngineHung",
    order=21,
    severity="critical",
    level=INSTANCE,
    phase="any",
    layer="availability",
    # Its gauges froze at the engine's last report: a full KV cache among them is stale.
    explains=(
        "InferenceKVCachePressure",
        "InferenceGPUUnderutilized",
        "InferenceCanaryFailing",
        "InferenceClientGap",
    ),
    # Requests that never finish are counted by no SLI until a client gives up.
    outside_the_slis=True,
    for_default="2m",
    summary="The engine of {{ $labels.instance }} is hung while its API server answers",
    description="{{ $labels.model }} on {{ $labels.instance }} had "
    '{{ $value | printf "%%.3g" }} requests running over the last %(window)s and generated no '
    "token nor read a prompt: its engine has died or hung while its API server still answers. "
    "Its running and waiting gauges are the engine's last report, not the present.",
    when=(
        Cond("running", ">=", 1),
        Cond("generation_rate", "<=", 0),
        Cond("prompt_rate", "<=", 0),
    ),
    # With requests waiting too, the stall is InferenceQueuedWhileIdle's, which says more.
    unless=(Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),),
    scenarios=(ENGINE_HUNG,),
)

ALERTS = (BACKEND_DOWN, REQUEST_ERRORS, CANARY_FAILING, EXPORTER_GPU_MISSING, ENGINE_HUNG_ALERT)
