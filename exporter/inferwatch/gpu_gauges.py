"""The GPU gauges: one row per NVML reading exposed as one gauge per GPU.

A row is the whole gauge, as a line of dcgm-exporter's counters file: the NVML call, its
scale to the base unit, the contract name and help, the panel that plots it. The GPU source
reads it (:mod:`inferwatch.collect.gpu`), the metric contract, the page and the triage
dashboard's GPU rows take it from here, and the tests' fake NVML answers it with ``example``.
A row renders as::

    inferwatch_gpu_power_watts{gpu="0",uuid="GPU-8e1...",name="NVIDIA H100 80GB HBM3"} 350.0

What is more than one reading (busy time integrated from samples, memory bandwidth's peak,
clock-event reasons, links and health) is read by its own code.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.panels import Panel


@dataclass(frozen=True)
class Scale:
    """From NVML's unit to the base unit: ``reading * multiply / divide``, exact for whole
    numbers (a float factor such as 1e-3 is not)."""

    multiply: int = 1
    divide: int = 1

    def apply(self, reading: float) -> float:
        return float(reading) * self.multiply / self.divide


AS_IS = Scale()
PERCENT = Scale(divide=100)  # percent -> ratio
MILLI = Scale(divide=1000)  # mW -> W
MEGA = Scale(multiply=1_000_000)  # MHz -> Hz


@dataclass(frozen=True, kw_only=True)
class GpuGauge:
    """One gauge per GPU, read with ``query`` (a ``pynvml`` function called with the handle
    and the ``pynvml`` constants named in ``args``) or, on GPUs with GPM (Hopper and newer),
    as the GPM metric ``gpm`` over the poll interval."""

    name: str  # the contract key: exposed as inferwatch_<name>
    help: str
    query: str = ""
    args: tuple[str, ...] = ()
    gpm: str = ""  # an NVML_GPM_METRIC_* constant
    scale: Scale = AS_IS
    example: float  # what NVML returns on an H100 SXM5 under load (the fake NVML's default)
    panel: Panel  # the triage dashboard's panel that plots it, one line per GPU
    legend: str  # the line's legend before "<instance> GPU <gpu>"
    unit: str  # Grafana's unit of the value

    def __post_init__(self) -> None:
        if bool(self.query) == bool(self.gpm):
            raise ValueError(f"{self.name}: read with a query or a GPM metric, one of them")


GPU_GAUGES: tuple[GpuGauge, ...] = (
    GpuGauge(
        name="gpu_sm_clock_hertz",
        help="Current SM clock.",
        query="nvmlDeviceGetClockInfo",
        args=("NVML_CLOCK_SM",),
        scale=MEGA,
        example=1980,
        panel=Panel.GPU_CLOCKS,
        legend="SM clock",
        unit="hertz",
    ),
    GpuGauge(
        name="gpu_power_watts",
        help="Current power draw.",
        query="nvmlDeviceGetPowerUsage",
        scale=MILLI,
        example=350_000,
        panel=Panel.GPU_POWER,
        legend="power",
        unit="watt",
    ),
    GpuGauge(
        name="gpu_temperature_celsius",
        help="GPU core temperature.",
        query="nvmlDeviceGetTemperature",
        args=("NVML_TEMPERATURE_GPU",),
        example=61,
        panel=Panel.GPU_POWER,
        legend="temperature",
        unit="celsius",
    ),
    GpuGauge(
        name="gpu_sm_active_ratio",
        help="GPM: fraction of SMs busy over the poll interval.",
        gpm="NVML_GPM_METRIC_SM_UTIL",
        scale=PERCENT,
        example=62.5,
        panel=Panel.GPU_ACTIVITY,
        legend="SM",
        unit="percentunit",
    ),
    GpuGauge(
        name="gpu_tensor_active_ratio",
        help="GPM: fraction of time tensor cores were active.",
        gpm="NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        scale=PERCENT,
        example=40.0,
        panel=Panel.GPU_ACTIVITY,
        legend="tensor",
        unit="percentunit",
    ),
    GpuGauge(
        name="gpu_dram_active_ratio",
        help="GPM: fraction of peak DRAM bandwidth used.",
        gpm="NVML_GPM_METRIC_DRAM_BW_UTIL",
        scale=PERCENT,
        example=85.0,
        panel=Panel.GPU_ACTIVITY,
        legend="DRAM",
        unit="percentunit",
    ),
)
