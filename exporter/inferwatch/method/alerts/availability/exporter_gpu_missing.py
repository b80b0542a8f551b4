"""InferenceExporterGPUMissing: the sidecar lost the GPUs it saw."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.annotations import PLAIN_NUMBER, value_of
from inferwatch.method.scenario import (
    A,
    C,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE

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
        # The GPUs seen within the lookback: 1.
        "InferenceExporterGPUMissing": [
            instance_alert(A, backend=None, model=None, collector="gpu", queries=(1,))
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

ALERTS = (EXPORTER_GPU_MISSING,)
