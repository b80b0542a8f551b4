"""A GPU that is failing: what its driver's error codes (XIDs) mean, and the signals that
judge it.

From NVIDIA's XID catalog ("XID Errors", NVIDIA GPU deployment and management
documentation): what each reports, and what it takes. The exporter shows their counters
from its start (at 0, :mod:`inferwatch.collect.gpu_health`), InferenceGPUFailing fires on
any of them, its runbook prints this table. XIDs not here (13, 31, 43, 45: a program's
fault, an out-of-range access, a killed context) are the software's.
"""

from __future__ import annotations

from inferwatch.method.recipes import Gauge, Rate
from inferwatch.method.signal import NODE, Signal

GPU_XIDS_NEEDING_ATTENTION: dict[int, tuple[str, str]] = {
    48: ("double-bit ECC error: the data read was wrong", "drain, then reset the GPU"),
    63: ("a row remap or page retirement was recorded", "drain, then reset to apply it"),
    64: ("a row remap or page retirement failed to be recorded", "drain; replace if it recurs"),
    74: ("NVLink error", "drain and reset; if it recurs, check the link and its peer GPUs"),
    79: ("the GPU fell off the bus", "drain; reboot the node, then check the hardware"),
    94: ("contained uncorrectable ECC error: one process was hit", "restart that process"),
    95: ("uncontained uncorrectable ECC error: every process on the GPU", "drain, then reset"),
}

XIDS = "|".join(str(x) for x in GPU_XIDS_NEEDING_ATTENTION)

# The signals of a failing GPU (InferenceGPUFailing's): per GPU in PromQL (the alert names
# it), locally the worst GPU.
GPU_HEALTH = (
    Signal(
        name="gpu_uncorrected_ecc_rate",
        label="uncorrected ECC errors/s (GPU)",
        unit="per_second",
        level=NODE,
        promql="max without (error, counter) (rate(inferwatch_gpu_ecc_errors_total"
        '{error="uncorrected",counter="volatile"}[%(window)s]))',
        local=Rate(
            "inferwatch_gpu_ecc_errors_total",
            where={"error": "uncorrected", "counter": "volatile"},
            how="max",
        ),
    ),
    Signal(
        name="gpu_xid_rate",
        label="XID errors that need attention/s (GPU)",
        unit="per_second",
        level=NODE,
        promql=f'max without (xid) (rate(inferwatch_gpu_xid_errors_total{{xid=~"{XIDS}"}}[%(window)s]))',
        local=Rate("inferwatch_gpu_xid_errors_total", where={"xid": XIDS}, how="max"),
    ),
    *(
        Signal(
            name=f"gpu_{name}",
            label=label,
            unit="count",
            level=NODE,
            promql=f"inferwatch_gpu_{name}",
            local=Gauge(f"inferwatch_gpu_{name}"),
        )
        for name, label in (
            ("row_remap_pending", "row remap pending a reset (GPU)"),
            ("row_remap_failed", "row remap failed (GPU)"),
            ("retired_pages_pending", "retired pages pending a reset (GPU)"),
        )
    ),
)
