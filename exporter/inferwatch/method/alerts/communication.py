"""The communication layer: NVLink and PCIe links that run near their peak."""

from __future__ import annotations

from inferwatch.method.alerts.alert import USERS_SEE, Alert, Cond
from inferwatch.method.scenario import A, B, Scenario, gpu_alert, healthy
from inferwatch.method.signals import INSTANCE

NVLINK_NEAR_PEAK = Scenario(
    # A's GPU 0 receives 90 % of its NVLink peak (tensor-parallel all-reduce); B's GPU 0
    # sends 75 % of its PCIe peak: a near miss, silent.
    "interconnect: NVLink near its peak",
    (healthy(A, nvlink_share=0.9), healthy(B, pcie_share=0.75)),
    file="availability.yaml",
    place=4,
    fires={"InferenceInterconnectSaturated": [gpu_alert(A, value=0.9)]},
)
LINKS_NEAR_MISS = Scenario(
    "interconnect near miss: NVLink and PCIe at 75 %",
    (healthy(A, nvlink_share=0.75), healthy(B, nvlink_share=None, pcie_share=0.75)),
    file="availability.yaml",
    place=5,
    fires={},
    silent=("InferenceInterconnectSaturated",),
)
PCIE_NEAR_PEAK = Scenario(
    # No NVLink on A: tensor parallel over PCIe at 85 % of its peak.
    "interconnect: PCIe near its peak",
    (healthy(A, nvlink_share=None, pcie_share=0.85), healthy(B)),
    file="availability.yaml",
    place=6,
    fires={"InferenceInterconnectSaturated": [gpu_alert(A, value=0.85)]},
)

INTERCONNECT_SATURATED = Alert(
    name="InferenceInterconnectSaturated",
    order=16,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="communication",
    explains=("InferencePrefillBottleneck", "InferenceDecodeBottleneck", *USERS_SEE),
    for_default="10m",
    summary="GPU {{ $labels.gpu }} on {{ $labels.instance }}: a link runs near its peak",
    description="GPU {{ $labels.gpu }} ({{ $labels.name }}) moved "
    "{{ $value | humanizePercentage }} of its NVLink (or, without NVLink traffic that high, "
    "PCIe) peak over the last %(window)s (threshold %(pct.link_share_high)s): the link, not "
    "compute or memory, sets the pace: tensor-parallel all-reduce between GPUs, or host "
    "transfers.",
    any_of=(
        Cond("nvlink_share", ">", "link_share_high"),
        Cond("pcie_share", ">", "link_share_high"),
    ),
    scenarios=(NVLINK_NEAR_PEAK, LINKS_NEAR_MISS, PCIE_NEAR_PEAK),
)

ALERTS = (INTERCONNECT_SATURATED,)
