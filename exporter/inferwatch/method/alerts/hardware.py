"""The hardware layer: a GPU that is failing, not slow (memory errors, row remapping, XIDs).

A failing GPU answers with wrong data or crashes: the SLIs count a wrong answer as a
success, so this alert pages whatever the objectives say (``outside_the_slis``).
"""

from __future__ import annotations

from inferwatch.method.alerts.alert import USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import GPU, PLAIN_NUMBER, value_of
from inferwatch.method.gpu_faults import GPU_XIDS_NEEDING_ATTENTION, XIDS
from inferwatch.method.scenario import A, B, Expected, Scenario, gpu_alert, healthy
from inferwatch.method.signals import INSTANCE

# An XID's counter: 0 until 13 minutes in, then 1 (the evaluation, at 15 minutes, sees it
# within its 5-minute window).
ONE_EVENT = "0x25 1x14"


def failing(instance: str, *, pending: int = 0, ecc: int = 0, xids: int = 0) -> Expected:
    """InferenceGPUFailing on GPU 0 of ``instance``: its rows pending a remap (none failed),
    uncorrected ECC errors and XIDs that need attention over the window."""
    return gpu_alert(instance, queries=(pending, 0, ecc, xids))


REMAP_AND_XID = Scenario(
    # A's GPU 0 has a row remap waiting for a reset; B's GPU 0 fell off the bus (XID 79).
    "failing GPUs: a row remap pending, an XID 79",
    (healthy(A, row_remap_pending="1x40"), healthy(B, xid={"79": ONE_EVENT})),
    file="hardware.yaml",
    place=1,
    fires={"InferenceGPUFailing": [failing(A, pending=1), failing(B, xids=1)]},
)
UNCORRECTED_ECC = Scenario(
    "failing GPU: an uncorrected ECC error",
    (healthy(A, uncorrected_ecc=ONE_EVENT), healthy(B)),
    file="hardware.yaml",
    place=2,
    fires={"InferenceGPUFailing": [failing(A, ecc=1)]},
)
PROGRAM_FAULT = Scenario(
    # XID 13 (graphics engine exception) is a program's fault, not the GPU's.
    "near miss: an XID 13 is the program's fault",
    (healthy(A, xid={"13": ONE_EVENT}), healthy(B)),
    file="hardware.yaml",
    place=3,
    fires={},
    silent=("InferenceGPUFailing",),
)

GPU_FAILING = Alert(
    name="InferenceGPUFailing",
    order=20,
    severity="critical",
    level=INSTANCE,
    phase="any",
    layer="hardware",
    explains=("InferenceRequestErrors", *USERS_SEE),
    outside_the_slis=True,
    for_default="0m",
    summary="GPU {{ $labels.gpu }} on {{ $labels.instance }} is failing",
    description="GPU {{ $labels.gpu }} ({{ $labels.name }}, {{ $labels.uuid }}) is failing. "
    "Row remap pending a reset: "
    + value_of("inferwatch_gpu_row_remap_pending", GPU, PLAIN_NUMBER)
    + ", failed: "
    + value_of("inferwatch_gpu_row_remap_failed", GPU, PLAIN_NUMBER)
    + "; uncorrected ECC errors in the last %(window)s: "
    + value_of(
        "sum(increase(inferwatch_gpu_ecc_errors_total"
        '{error="uncorrected",counter="volatile"}[%(window)s]))',
        GPU,
        PLAIN_NUMBER,
    )
    + "; XIDs that need attention ("
    + ", ".join(XIDS.split("|"))
    + ") in the last %(window)s: "
    + value_of(
        f'sum(increase(inferwatch_gpu_xid_errors_total{{xid=~"{XIDS}"}}[%(window)s]))',
        GPU,
        PLAIN_NUMBER,
    )
    + ". It can give wrong answers or crash: drain it; the runbook says when a reset is "
    "enough.",
    any_of=(
        Cond("gpu_row_remap_pending", ">", 0),
        Cond("gpu_row_remap_failed", ">", 0),
        Cond("gpu_retired_pages_pending", ">", 0),
        Cond("gpu_uncorrected_ecc_rate", ">", 0),
        Cond("gpu_xid_rate", ">", 0),
    ),
    reference=(
        "## The XIDs it fires on",
        "",
        "| XID | what the driver reports | what it takes |",
        "|---|---|---|",
        *(
            f"| {xid} | {what} | {action} |"
            for xid, (what, action) in GPU_XIDS_NEEDING_ATTENTION.items()
        ),
        "",
    ),
    scenarios=(REMAP_AND_XID, UNCORRECTED_ECC, PROGRAM_FAULT),
)

ALERTS = (GPU_FAILING,)
