"""The "Inference triage" dashboard: its rows in order, each built in its own module.

The top row answers "prefill or decode, and which layer?" at a glance (``top_row.py``); the
service level objectives below it say what users feel (``slo.py``); the rows below follow
the method: latency by phase (``latency.py``), scheduler (``scheduler.py``), GPU and
communication (``gpu.py``), system (``system.py``), baseline and capacity (``baseline.py``).
"""

from __future__ import annotations

from inferwatch.dashboards.baseline import baseline_panels, capacity_panels
from inferwatch.dashboards.gpu import communication_panels, gpu_panels
from inferwatch.dashboards.latency import latency_panels
from inferwatch.dashboards.queries import Row
from inferwatch.dashboards.scheduler import scheduler_panels
from inferwatch.dashboards.slo import slo_panels
from inferwatch.dashboards.system import system_panels
from inferwatch.dashboards.top_row import top_row_panels
from inferwatch.method.spec import Spec


def triage_panels(spec: Spec) -> list[Row]:
    """(row title, panels) in order; the first row has no header."""
    return [
        (None, top_row_panels(spec)),
        ("Service level objectives: what do users feel?", slo_panels(spec)),
        ("Latency by phase: prefill or decode?", latency_panels(spec)),
        ("Scheduler: is continuous batching working?", scheduler_panels(spec)),
        ("GPU: compute and memory", gpu_panels(spec)),
        ("Communication: NVLink and PCIe", communication_panels()),
        ("System: frontend CPU, the client's path, workload", system_panels(spec)),
        ("Baseline: what regressed?", baseline_panels(spec)),
        ("Capacity: how much more load?", capacity_panels(spec)),
    ]
