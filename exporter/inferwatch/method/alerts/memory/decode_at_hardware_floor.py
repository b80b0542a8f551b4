"""InferenceDecodeAtHardwareFloor: decode at the memory-bandwidth floor."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import (
    value_of,
)
from inferwatch.method.scenario import (
    A,
    B,
    Dist,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE

AT_THE_FLOOR = Scenario(
    # Mean ITL 6 ms against a 4.8 ms floor: 1.25x, hardware-bound (info only).
    "decode at the hardware floor",
    (healthy(A, itl=Dist({0.01: 1.0}, 0.006)), healthy(B, itl=Dist({0.01: 1.0}, 0.009))),
    file="phase.yaml",
    place=6,
    fires={
        # 1.25x the floor, the floor 4.8 ms.
        "InferenceDecodeAtHardwareFloor": [instance_alert(A, value=1.25, queries=(0.0048,))]
    },
    # B runs at 1.875x the floor: neither at the floor nor a bottleneck (ITL p95 9.5 ms).
    silent=("InferenceDecodeBottleneck",),
)

DECODE_AT_HARDWARE_FLOOR = Alert(
    name="InferenceDecodeAtHardwareFloor",
    order=6,
    severity="info",
    level=INSTANCE,
    phase="decode",
    layer="memory",
    for_default="10m",
    summary="Decode on {{ $labels.instance }} runs at the memory-bandwidth floor",
    description='Mean inter-token latency of {{ $labels.model }} is {{ $value | printf "%%.3g" }}x '
    "the floor of "
    + value_of("inferwatch_decode_floor_seconds", INSTANCE, "humanizeDuration")
    + " (weight bytes / peak memory bandwidth). Decode is hardware-bound: only a "
    "smaller or quantized model, or more GPUs, make it faster.",
    when=(
        Cond("itl_over_floor", "<", "floor_factor_near"),
        Cond("generation_rate", ">", "min_token_rate"),
    ),
    scenarios=(AT_THE_FLOOR,),
)

ALERTS = (DECODE_AT_HARDWARE_FLOOR,)
