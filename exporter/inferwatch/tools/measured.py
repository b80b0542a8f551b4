"""The docs' regions that a run writes, never ``make generate``: measured figures never come
from a hand-edited line.

- ``docs/performance.md``: :data:`BENCH`, written by ``make bench`` (``bench/exporter.py
  --write-docs`` calls :func:`write_figures`), :data:`CANARY_BENCH`, by
  ``bench/canary.py --write-docs``, and :data:`FLEET_BENCH`, by ``bench/fleet.py
  --write-docs``;
- ``README.md``: :data:`E2E_TIMES`, the e2e's times from each fault's onset, on every core
  and pinned to one, written by ``make e2e-times`` (tests/test_e2e.py).

Each body says where and when its figures were measured (:func:`this_machine`).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path

from inferwatch.tools.docs import Region, cell, prose

# -- docs/performance.md: written by `make bench` ----------------------------------------

PERFORMANCE = "docs/performance.md"
NOT_MEASURED = "Not measured yet: run `make bench`.\n"


def _no_render() -> str:
    raise RuntimeError("measured figures come from a run: the one its region's marker names")


BENCH = Region("bench figures", "bench/exporter.py", _no_render, by="make bench")
# The canary's cost, a run of its own (minutes of a real vLLM, not part of `make bench`).
CANARY_BENCH = Region(
    "canary figures", "bench/canary.py", _no_render, by="bench/canary.py --write-docs"
)
# The rules' cost on a real Prometheus at fleet size, a run of its own (minutes per size).
FLEET_BENCH = Region(
    "fleet figures", "bench/fleet.py", _no_render, by="bench/fleet.py --write-docs"
)


# The e2e's times from each fault's onset, a run on every core and one pinned to one core
# (`make e2e-times`; tests/test_e2e.py writes the region of the cores it ran on).
README = "README.md"
E2E_TIMES = {
    pinned: Region(f"e2e times {where}", "tests/test_e2e.py", _no_render, by="make e2e-times")
    for pinned, where in ((False, "on every core"), (True, "pinned to one core"))
}


def cpu_model(cpuinfo: str) -> str:
    """The CPU's model name as /proc/cpuinfo gives it (x86 ``model name``, Arm ``Model``)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def this_machine() -> dict[str, str]:
    """Where and when figures are measured: the date, the cores this process may run on,
    the CPU and Python."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "cores (nproc)": str(len(os.sched_getaffinity(0))),
        "CPU": cpu_model(cpuinfo),
        "Python": platform.python_version(),
    }


def figures_region(
    figures: Mapping[str, str], machine: Mapping[str, str], region: Region = BENCH
) -> str:
    """The body of a measured region: where and when the figures were measured, then each."""
    about = ", ".join(f"{k} {v}" for k, v in machine.items())
    run = "`make bench` (`bench/exporter.py --write-docs`)" if region is BENCH else f"`{region.by}`"
    rows = [
        f"Measured by {run}: {prose(about)}.",
        "",
        "| scenario | from the fault's onset |"
        if region in E2E_TIMES.values()
        else "| figure | value |",
        "|---|---|",
        *(f"| {cell(name)} | {cell(value)} |" for name, value in figures.items()),
    ]
    return "\n".join(rows) + "\n"


def write_figures(
    path: Path, figures: Mapping[str, str], machine: Mapping[str, str], region: Region = BENCH
) -> None:
    """Rewrites a measured region of ``path`` (a bench's of docs/performance.md, the e2e's
    of the README) with a run's figures."""
    text = path.read_text()
    path.write_text(region.write(text, figures_region(figures, machine, region), str(path)))
