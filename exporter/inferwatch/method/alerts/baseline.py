"""Against the baseline: live latency measured against the benchmark at comparable load, and
live traffic against the capacity the baseline's load search measured."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import (
    INSTANCE_ITL,
    INSTANCE_TTFT,
    P95,
    PLAIN_NUMBER,
    value_of,
)
from inferwatch.method.router_signals import POOL_CAPACITY_USE, POOL_REPLICAS_NEEDED
from inferwatch.method.scenario import (
    SERVED_MODEL,
    A,
    B,
    C,
    Scenario,
    Series,
    healthy,
    instance_alert,
    model_alert,
)
from inferwatch.method.signals import BASELINE95, CAPACITY_SUM, INSTANCE, ITL, MODEL, TTFT

REGRESSION = Scenario(
    # Baseline at concurrency 8: TTFT p95 300 ms, ITL p95 40 ms. Live TTFT p95 487.5 ms is
    # 1.625x (fires; printed with 3 digits, half to even); live ITL p95 48.75 ms is 1.22x.
    # B's baseline TTFT 400 ms makes its 487.5 ms only 1.22x (near miss).
    "latency regression against the baseline",
    (healthy(A, baseline=(0.3, 0.04)), healthy(B, baseline=(0.4, 0.04))),
    file="baseline.yaml",
    place=1,
    fires={
        # 1.625x; the baseline's TTFT p95 at its concurrency, live TTFT p95, live and
        # baseline ITL p95.
        "InferenceLatencyRegression": [
            instance_alert(
                A, value=1.625, queries=(Series(0.3, {"concurrency": "8"}), 0.4875, 0.04875, 0.04)
            )
        ]
    },
    eval_time="19m",  # its `for` is 15m
)

LATENCY_REGRESSION = Alert(
    name="InferenceLatencyRegression",
    order=14,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="baseline",
    for_default="15m",
    summary="Latency on {{ $labels.instance }} regressed against the baseline",
    description='Live p95 latency of {{ $labels.model }} is {{ $value | printf "%%.3g" }}x the '
    "baseline at comparable load (concurrency "
    + value_of(f"inferwatch_baseline_{TTFT}{BASELINE95}", INSTANCE, 'label "concurrency"')
    + "; threshold %(t.regression_factor)sx): TTFT p95 "
    + value_of(f"{INSTANCE_TTFT}:quantile_%(w)s{P95}", INSTANCE, "humanizeDuration")
    + " vs "
    + value_of(f"inferwatch_baseline_{TTFT}{BASELINE95}", INSTANCE, "humanizeDuration")
    + ", inter-token latency p95 "
    + value_of(f"{INSTANCE_ITL}:quantile_%(w)s{P95}", INSTANCE, "humanizeDuration")
    + " vs "
    + value_of(f"inferwatch_baseline_{ITL}{BASELINE95}", INSTANCE, "humanizeDuration")
    + ".",
    any_of=(
        Cond("ttft_over_baseline", ">", "regression_factor"),
        Cond("itl_over_baseline", ">", "regression_factor"),
    ),
    evidence=(
        "Compare the trace's step durations with a capture taken at baseline load "
        "(`inferwatch capture` on a healthy replica): the same step shape taking longer is "
        "the hardware or the build; a different shape is the load."
    ),
    scenarios=(REGRESSION,),
)

# ---------------------------------------------------------------------------------------
# InferenceNearCapacity

REPLICAS_NEEDED = "model:inferwatch_replicas_needed:rate5m"
REPLICAS_NEEDED_LABELS = f'{{__name__="{REPLICAS_NEEDED}",backend="vllm",model="{SERVED_MODEL}"}}'

# Three replicas finishing 2 requests/s each; the baseline measured 2.15 requests/s per
# replica at the goodput target: 6 of 6.45 in use, 93 %, 2.79 replicas' worth of traffic.
NEAR_CAPACITY = Scenario(
    "near capacity: the traffic is 93 % of what the baseline carried",
    tuple(healthy(i, capacity=2.15) for i in (A, B, C)),
    file="baseline.yaml",
    place=2,
    fires={
        # 93.02 % in use: 6 finished requests/s against 6.45, 2.79 replicas needed.
        "InferenceNearCapacity": [model_alert(value=0.9302, queries=(6, 6.45, 2.79))]
    },
    records=(
        (
            REPLICAS_NEEDED,
            REPLICAS_NEEDED_LABELS,
            6 / 2.15,
        ),
    ),
)

# 10 % below the threshold: 6 of 7.5 requests/s, 80 %.
NEAR_CAPACITY_MISS = Scenario(
    "near miss: the traffic is 80 % of the measured capacity",
    tuple(healthy(i, capacity=2.5) for i in (A, B, C)),
    file="baseline.yaml",
    place=3,
    fires={},
    silent=("InferenceNearCapacity",),
    records=(
        (
            REPLICAS_NEEDED,
            REPLICAS_NEEDED_LABELS,
            2.4,
        ),
    ),
)

NEAR_CAPACITY_ALERT = Alert(
    name="InferenceNearCapacity",
    order=19,
    severity="warning",
    level=MODEL,
    phase="any",
    layer="baseline",
    # No place a slow first token waits: near the capacity it waits behind the batch's
    # prefill chunks before any queue forms, past it in the queue (InferenceQueueingDelay).
    # Near the capacity, requests queue, and latency exceeds what the baseline measured at
    # a lower load: both are the load's. So are the phases' own symptoms before any queue:
    # each step carries a full batch's decodes (slower tokens) and admits new prompts'
    # prefill chunks (slower first tokens, and the streams' tail waits behind them).
    explains=(
        "InferenceQueueingDelay",
        "InferenceLatencyRegression",
        "InferencePrefillBottleneck",
        "InferenceDecodeBottleneck",
        "InferencePrefillStallsDecode",
    ),
    for_default="5m",
    summary="{{ $labels.model }} is near the capacity its baseline measured",
    description="{{ $labels.model }} serves {{ $value | humanizePercentage }} of the capacity "
    "its baseline measured (threshold %(pct.capacity_use_high)s): "
    + value_of("model:inferwatch_requests_finished:%(w)s", MODEL, PLAIN_NUMBER)
    + " finished requests/s across its replicas against "
    + value_of(CAPACITY_SUM, MODEL, PLAIN_NUMBER)
    + " requests/s at the goodput target. This traffic needs "
    + value_of("model:inferwatch_replicas_needed:%(w)s", MODEL, PLAIN_NUMBER)
    + " replicas at full capacity.",
    when=(Cond("model_capacity_use", ">", "capacity_use_high"),),
    evidence=(
        "Compare the capture's engine steps with the baseline's at the same rate: the same "
        "step shape at more requests per step is the load; longer steps at the same load are "
        "a slower service (InferenceLatencyRegression), whose capacity is lower than measured."
    ),
    scenarios=(NEAR_CAPACITY, NEAR_CAPACITY_MISS),
)

# ---------------------------------------------------------------------------------------
# InferencePrefillDecodeImbalance

# Prefill A and B each finish 1.9 requests/s of the 2 their baselines carry: the prefill pool
# at 95 %.
FULL_PREFILL = tuple(healthy(i, role="prefill", requests_per_s=1.9, capacity=2.0) for i in (A, B))

# Decode C finishes the same 3.8 requests/s of the 10 its baseline carries: 38 %. The model as
# a whole is at 7.6 of 14, 54 %: no InferenceNearCapacity.
PREFILL_POOL_FULL = Scenario(
    "disaggregated: the prefill pool is near its capacity while the decode pool has room",
    (*FULL_PREFILL, healthy(C, role="decode", requests_per_s=3.8, capacity=10.0)),
    file="baseline.yaml",
    place=4,
    fires={
        # 95 %; the decode pool at 38 %; 1.9 prefill and 0.38 decode replicas needed, 2 and 1
        # running.
        "InferencePrefillDecodeImbalance": [
            model_alert(value=0.95, queries=(0.38, 1.9, 0.38, 2, 1), role="prefill")
        ]
    },
)

# The reverse: decode B and C at 2 of 2.1 requests/s together (95.2 %), prefill A at 2 of 5.
DECODE_POOL_FULL = Scenario(
    "disaggregated: the decode pool is near its capacity while the prefill pool has room",
    (
        healthy(A, role="prefill", requests_per_s=2.0, capacity=5.0),
        healthy(B, role="decode", requests_per_s=1.0, capacity=1.05),
        healthy(C, role="decode", requests_per_s=1.0, capacity=1.05),
    ),
    file="baseline.yaml",
    place=5,
    fires={
        # 95.2 %; the prefill pool at 40 %; 0.4 prefill and 1.9 decode replicas needed.
        "InferencePrefillDecodeImbalance": [
            model_alert(value=2 / 2.1, queries=(0.4, 0.4, 2 / 1.05, 1, 2), role="decode")
        ]
    },
)

# Near miss: the prefill pool at 95 %, the decode pool at 60 %: the decode pool has too little
# room to give a replica away.
POOL_WITHOUT_ROOM = Scenario(
    "disaggregated near miss: the other pool has too little room",
    (*FULL_PREFILL, healthy(C, role="decode", requests_per_s=3.8, capacity=3.8 / 0.6)),
    file="baseline.yaml",
    place=6,
    fires={},
    silent=("InferencePrefillDecodeImbalance",),
)

# Near miss: unified replicas (no role) at 95 % and 38 % of their capacities: no pools.
NO_POOLS = Scenario(
    "disaggregation near miss: replicas without a role are no pools",
    (
        healthy(A, requests_per_s=1.9, capacity=2.0),
        healthy(B, requests_per_s=3.8, capacity=10.0),
    ),
    file="baseline.yaml",
    place=7,
    fires={},
    silent=("InferencePrefillDecodeImbalance",),
)


def _needed(role: str) -> str:
    """The replicas a pool's traffic needs at full capacity."""
    return value_of(f'{POOL_REPLICAS_NEEDED}{{role="{role}"}}', MODEL, PLAIN_NUMBER)


def _running(role: str) -> str:
    """The replicas whose sidecars report the role."""
    return value_of(f'count(inferwatch_backend_info{{role="{role}"}})', MODEL, PLAIN_NUMBER)


PREFILL_DECODE_IMBALANCE = Alert(
    name="InferencePrefillDecodeImbalance",
    order=29,
    severity="warning",
    level=MODEL,
    phase="any",
    layer="baseline",
    # A pool past its capacity queues its requests, and they wait longer than the baseline
    # measured: the pool's load, as InferenceNearCapacity's for a whole model.
    explains=("InferenceQueueingDelay", "InferenceLatencyRegression"),
    for_default="5m",
    summary="The {{ $labels.role }} pool of {{ $labels.model }} is near its capacity while "
    "the other pool has room",
    description="The {{ $labels.role }} replicas of {{ $labels.model }} serve {{ $value | "
    "humanizePercentage }} of the capacity their baselines measured (threshold "
    "%(pct.capacity_use_high)s) while its least used pool serves "
    + value_of(f"min({POOL_CAPACITY_USE})", MODEL, "humanizePercentage")
    + " of its own (below %(pct.pool_capacity_use_low)s): the split between prefill and decode "
    "replicas is wrong, not the fleet's size. At full capacity this traffic needs "
    + _needed("prefill")
    + " prefill and "
    + _needed("decode")
    + " decode replicas; "
    + _running("prefill")
    + " and "
    + _running("decode")
    + " run. Move replicas to the {{ $labels.role }} pool, or add them there.",
    when=(
        Cond("pool_capacity_use", ">", "capacity_use_high"),
        Cond("least_used_pool_capacity_use", "<", "pool_capacity_use_low"),
    ),
    evidence=(
        "Compare a capture from a replica of each pool: the full pool's engine steps carry "
        "full batches of its phase, the other pool's steps are sparse."
    ),
    scenarios=(PREFILL_POOL_FULL, DECODE_POOL_FULL, POOL_WITHOUT_ROOM, NO_POOLS),
)

ALERTS = (LATENCY_REGRESSION, NEAR_CAPACITY_ALERT, PREFILL_DECODE_IMBALANCE)
