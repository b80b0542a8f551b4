"""What a GPU's driver error codes (XIDs) mean: those that say the GPU needs attention.

From NVIDIA's XID catalog ("XID Errors", NVIDIA GPU deployment and management
documentation): what each reports, and what it takes. The exporter shows their counters
from its start (at 0, :mod:`inferwatch.collect.gpu_health`), InferenceGPUFailing fires on
any of them, its runbook prints this table. XIDs not here (13, 31, 43, 45: a program's
fault, an out-of-range access, a killed context) are the software's.
"""

from __future__ import annotations

GPU_XIDS_NEEDING_ATTENTION: dict[int, tuple[str, str]] = {
    48: ("double-bit ECC error: the data read was wrong", "drain, then reset the GPU"),
    63: ("a row remap or page retirement was recorded", "drain, then reset to apply it"),
    64: ("a row remap or page retirement failed to be recorded", "drain; replace if it recurs"),
    74: ("NVLink error", "drain and reset; if it recurs, check the link and its peer GPUs"),
    79: ("the GPU fell off the bus", "drain; reboot the node, then check the hardware"),
    94: ("contained uncorrectable ECC error: one process was hit", "restart that process"),
    95: ("uncontained uncorrectable ECC error: every process on the GPU", "drain, then reset"),
}
