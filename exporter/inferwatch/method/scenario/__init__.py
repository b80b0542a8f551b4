"""The alerts' promtool scenarios: readable workloads, written as promtool unit tests.

Each alert holds its scenarios (``Alert.scenarios``, in the modules of
:mod:`inferwatch.method.alerts`): where it fires, its near misses, its cross-checks.
``alerts/tests/scenarios.py`` (run by ``make generate``) writes them to alerts/tests/*.yaml.
:mod:`~inferwatch.method.scenario.workload` describes replicas, :mod:`~inferwatch.method.scenario.series` turns them into series,
:mod:`~inferwatch.method.scenario.expect` scenarios into test groups, their expected text
rendered by :mod:`~inferwatch.method.scenario.render`,
:mod:`~inferwatch.method.scenario.slo` the SLO alerts' hours of traffic into series.
"""

from inferwatch.method.scenario.expect import (
    Expected,
    Scenario,
    gpu_alert,
    instance_alert,
    model_alert,
    promtool_group,
    worker_alert,
)
from inferwatch.method.scenario.render import Series
from inferwatch.method.scenario.series import input_series
from inferwatch.method.scenario.workload import (
    CANARY_OK,
    EVAL,
    ITL_LE,
    ROUTER,
    SERVED_MODEL,
    STEP,
    TGI_DECODE,
    TGI_LE,
    TGI_PREFILL,
    TTFT_LE,
    A,
    B,
    C,
    Dist,
    KVTransfer,
    Replica,
    Router,
    Worker,
    healthy,
    tgi,
)

__all__ = [
    "CANARY_OK",
    "EVAL",
    "ITL_LE",
    "ROUTER",
    "SERVED_MODEL",
    "STEP",
    "TGI_DECODE",
    "TGI_LE",
    "TGI_PREFILL",
    "TTFT_LE",
    "A",
    "B",
    "C",
    "Dist",
    "Expected",
    "KVTransfer",
    "Replica",
    "Router",
    "Scenario",
    "Series",
    "Worker",
    "gpu_alert",
    "healthy",
    "input_series",
    "instance_alert",
    "model_alert",
    "promtool_group",
    "tgi",
    "worker_alert",
]
