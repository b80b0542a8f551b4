"""InferenceDecodeBottleneck: decode far slower than the memory bandwidth allows."""

from __future__ import annotations

from inferwatch.method.alerts.alert import STEP_SPAN, USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import (
    CANARY_TTFT_P95,
    DECODE_STEP_OVER_FLOOR,
    INSTANCE_ITL,
    INSTANCE_TTFT,
    P95,
    PLAIN_NUMBER,
    if_present,
    value_of,
    window_mean,
)
from inferwatch.method.scenario import (
    TGI_LE,
    TGI_PREFILL,
    A,
    B,
    C,
    Dist,
    Scenario,
    healthy,
    instance_alert,
    tgi,
)
from inferwatch.method.signals import INSTANCE

DECODE_BOUND = Scenario(
    # ITL in (0.15, 0.2] -> p95 197.5 ms, mean 170 ms = 35.4x the 4.8 ms floor; TTFT normal.
    # Replica C decodes as slowly but its floor is 100 ms (a huge model): within 3x of the
    # floor, so not a decode *inefficiency* (near miss).
    "decode-bound: far above the hardware floor",
    (
        healthy(A, itl=Dist({0.2: 1.0}, 0.17), step_tokens=Dist({256: 1.0}, 256)),
        healthy(C, itl=Dist({0.2: 1.0}, 0.17), step_tokens=Dist({256: 1.0}, 256), decode_floor=0.1),
    ),
    file="phase.yaml",
    place=5,
    fires={
        "InferenceDecodeBottleneck": [
            # ITL p95 (its series present); TTFT p95, mean ITL over the floor, step tokens.
            instance_alert(A, value=0.1975, queries=(0.1975, 0.4875, 35.42, 256))
        ]
    },
    silent=(
        "InferencePrefillBottleneck",
        "InferenceQueueingDelay",
        "InferenceDecodeAtHardwareFloor",
    ),
)

TGI_DECODE_BOUND = Scenario(
    # TGI: no inter-token histogram; decode steps in (147.8, 221.7] ms -> p95 218 ms, mean
    # 200 ms = 41.7x the 4.8 ms floor; the canary's first tokens normal. B's decode steps in
    # (65.7, 98.5] ms -> p95 96.9 ms (near miss). C is an old TGI without step histograms
    # or canary: nothing to judge the phase on, so silent.
    "TGI: decode steps slow",
    (
        tgi(A, step_seconds={"prefill": TGI_PREFILL, "decode": Dist({TGI_LE[18]: 1.0}, 0.2)}),
        tgi(B, step_seconds={"prefill": TGI_PREFILL, "decode": Dist({TGI_LE[16]: 1.0}, 0.09)}),
        tgi(C, step_seconds=None, canary_ttft=None, canary_probes=None, token_budget_use=None),
    ),
    file="tgi.yaml",
    place=1,
    fires={
        "InferenceDecodeBottleneck": [
            # No ITL series: the decode steps' p95; the canary's TTFT p95, the mean decode
            # step over the floor, the requests running.
            instance_alert(A, backend="tgi", value=0.218, queries=(None, 0.2425, 41.67, 9.82))
        ]
    },
    silent=("InferencePrefillBottleneck", "InferenceDecodeAtHardwareFloor"),
)

DECODE_BOTTLENECK = Alert(
    name="InferenceDecodeBottleneck",
    order=5,
    severity="warning",
    level=INSTANCE,
    phase="decode",
    layer="memory",
    explains=USERS_SEE,
    slow_tokens_spent_in="decode",
    for_default="5m",
    summary="Decode is the bottleneck on {{ $labels.instance }} ({{ $labels.model }})",
    # Where the server has no inter-token histogram (TGI), its decode steps and the canary's
    # first tokens stand in (method/fallbacks.py), and the text says so.
    description=if_present(
        f"{INSTANCE_ITL}:quantile_%(w)s{P95}",
        INSTANCE,
        "Inter-token latency p95 is {{ $value | humanizeDuration }} (threshold "
        "%(t.itl_p95_seconds)ss) while TTFT p95 is a normal "
        + value_of(f"{INSTANCE_TTFT}:quantile_%(w)s{P95}", INSTANCE, "humanizeDuration")
        + "; mean ITL over the hardware floor is "
        + value_of(f"{INSTANCE_ITL}:mean_per_decode_floor_%(w)s", INSTANCE, PLAIN_NUMBER)
        + "x (n/a: floor unknown), with "
        + value_of(window_mean("inferwatch_engine_step_tokens"), INSTANCE)
        + " tokens per engine step.",
        "Decode steps take {{ $value | humanizeDuration }} at p95 (threshold "
        "%(t.itl_p95_seconds)ss; a decode step is every running request's next token, "
        "timed by the server) while the canary's TTFT p95 is a normal "
        + value_of(CANARY_TTFT_P95, INSTANCE, "humanizeDuration")
        + "; the mean decode step over the hardware floor is "
        + value_of(DECODE_STEP_OVER_FLOOR, INSTANCE, PLAIN_NUMBER)
        + "x (n/a: floor unknown), with "
        + value_of("avg_over_time(inferwatch_requests_running[%(window)s])", INSTANCE, PLAIN_NUMBER)
        + " requests running.",
    )
    + " Decode is slower than the memory bandwidth allows.",
    when=(
        Cond("itl_p95", ">", "itl_p95_seconds"),
        Cond("ttft_p95", "<=", "ttft_p95_seconds"),
        Cond("generation_rate", ">", "min_token_rate"),
    ),
    unless=(Cond("itl_over_floor", "<", "floor_factor_far"),),
    evidence=(
        f"Decode-only steps (`execute_context_0(0)_generation_<D>(<d>)`, {STEP_SPAN}) and "
        "their durations: a step time that grows with D is the batch's memory traffic; "
        "gaps between steps are host overhead (scheduling, sampling, detokenization: see "
        "the API server's stacks)."
    ),
    scenarios=(DECODE_BOUND, TGI_DECODE_BOUND),
)

ALERTS = (DECODE_BOTTLENECK,)
