"""Optional NVML readings of one GPU, as the GPU source's parts take them.

A reading that fails short of the GPU being lost gives None and leaves only its own series
out, logged once per GPU, reading and error; one the GPU does not support is not asked for
again. NVML_ERROR_GPU_IS_LOST is raised, so the GPU source drops that GPU from the poll.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

# The GPU source's logger: these lines are about a GPU, and keep the name they always had.
log = logging.getLogger("inferwatch.collect.gpu")


def is_error(nv: ModuleType, exc: Exception, code_name: str) -> bool:
    """Whether ``exc`` is the NVMLError ``code_name`` (e.g. ``"NVML_ERROR_NOT_SUPPORTED"``)."""
    return getattr(exc, "value", None) == getattr(nv, code_name)


class Readings:
    """One GPU's optional readings; ``index`` names the GPU in logs."""

    def __init__(self, nvml: ModuleType, index: int) -> None:
        self._nvml = nvml
        self._index = index
        self.unsupported: set[str] = set()  # readings NOT_SUPPORTED: not asked again
        self._logged: set[tuple[str, int]] = set()

    def __call__(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None when it fails (see the module)."""
        if what in self.unsupported:
            return None
        nv = self._nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if is_error(nv, exc, "NVML_ERROR_GPU_IS_LOST"):
                raise
            if is_error(nv, exc, "NVML_ERROR_NOT_SUPPORTED"):
                self.unsupported.add(what)
            self.log_once(what, exc.value, str(exc))
            return None

    def log_once(self, what: str, code: int, text: str) -> None:
        if (what, code) in self._logged:
            return
        self._logged.add((what, code))
        log.info("GPU %d: %s unavailable (%s); its series are left out", self._index, what, text)
