"""Signals: the quantities the alerts compare with thresholds, in two forms.

Each has a PromQL form (over the recording rules, for the rules and ``diagnose
--prometheus``) and a local recipe (for the exporter's own evaluation: ``diagnose
--exporter``, computed from two scrapes of one exporter). Both forms mean the same quantity
over the same series: a recipe combines an exporter's engines and GPUs as the PromQL does
(tests/test_signals.py evaluates both on the same series through promtool and
:mod:`inferwatch.method.local`). What a signal is, and its levels:
:mod:`inferwatch.method.signal`; the signals read where a server lacks a signal's own
series: :mod:`inferwatch.method.fallbacks`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from inferwatch.method.fallbacks import FALLBACKS
from inferwatch.method.gpu_faults import GPU_HEALTH
from inferwatch.method.kv_transfer_signals import KV_TRANSFER_SIGNALS
from inferwatch.method.recipes import Gauge, Mean, Quantile, Rate, Ratio, ShareAbove, Sum
from inferwatch.method.router_signals import FLEET_SIGNALS, ROUTER_SIGNALS
from inferwatch.method.signal import INSTANCE, ITL, MODEL, NODE, QUEUE, TTFT, Signal
from inferwatch.method.thresholds import THROTTLE_REASONS
from inferwatch.metrics import CANARY_RESULTS


def _recorded_quantile(level: str, histogram: str, quantile: str = "0.95") -> str:
    """A latency quantile as the recording rules hold it, per ``level``."""
    return (
        f"max without (quantile) "
        f'({level}:inferwatch_{histogram}:quantile_%(w)s{{quantile="{quantile}"}})'
    )


BASELINE95 = '{percentile="95"}'  # the baseline's gauges carry a percentile label
# The baseline's capacity per replica (``serve --baseline``), and the fleet's (recorded).
CAPACITY = "inferwatch_baseline_capacity_requests_per_second"
CAPACITY_SUM = f"model:{CAPACITY}:sum"
_ERRORS = {"reason": "error"}
_ABORTS = {"reason": "abort"}
_FAILED = "|".join(r for r in CANARY_RESULTS if r != "ok")

SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        # Latency by phase
        Signal(
            name="ttft_p95",
            label="TTFT p95",
            unit="seconds",
            level=INSTANCE,
            promql=_recorded_quantile("instance", TTFT),
            local=Quantile(TTFT, 0.95),
            fallback="canary_ttft_p95",
        ),
        Signal(
            name="itl_p95",
            label="ITL p95",
            unit="seconds",
            level=INSTANCE,
            promql=_recorded_quantile("instance", ITL),
            local=Quantile(ITL, 0.95),
            fallback="decode_step_p95",
        ),
        Signal(
            name="itl_p99",
            label="ITL p99",
            unit="seconds",
            level=INSTANCE,
            promql=_recorded_quantile("instance", ITL, "0.99"),
            local=Quantile(ITL, 0.99),
        ),
        Signal(
            name="itl_tail_share",
            label="ITL share above the tail bound",
            unit="ratio",
            level=INSTANCE,
            promql=f"instance:inferwatch_{ITL}:share_above_tail_%(w)s",
            local=ShareAbove(ITL, bound="itl_tail_bound_seconds"),
        ),
        Signal(
            name="queue_share",
            label="queue share of TTFT",
            unit="ratio",
            level=INSTANCE,
            promql=f"instance:inferwatch_{QUEUE}:mean_per_ttft_mean_%(w)s",
            local=Ratio(Mean(QUEUE), Mean(TTFT)),
            fallback="queue_share_of_steps",
        ),
        Signal(
            name="itl_over_floor",
            label="mean ITL / decode floor",
            unit="factor",
            level=INSTANCE,
            promql=f"instance:inferwatch_{ITL}:mean_per_decode_floor_%(w)s",
            local=Ratio(Mean(ITL), Gauge("inferwatch_decode_floor_seconds")),
            fallback="decode_step_over_floor",
        ),
        Signal(
            name="ttft_over_baseline",
            label="TTFT p95 / baseline",
            unit="factor",
            level=INSTANCE,
            promql=f"{_recorded_quantile('instance', TTFT)}\n  / on (instance, job, backend, model) "
            f"inferwatch_baseline_{TTFT}{BASELINE95}",
            local=Ratio(
                Quantile(TTFT, 0.95),
                Gauge(f"inferwatch_baseline_{TTFT}", where={"percentile": "95"}),
            ),
        ),
        Signal(
            name="itl_over_baseline",
            label="ITL p95 / baseline",
            unit="factor",
            level=INSTANCE,
            promql=f"{_recorded_quantile('instance', ITL)}\n  / on (instance, job, backend, model) "
            f"inferwatch_baseline_{ITL}{BASELINE95}",
            local=Ratio(
                Quantile(ITL, 0.95), Gauge(f"inferwatch_baseline_{ITL}", where={"percentile": "95"})
            ),
        ),
        # Traffic
        Signal(
            name="request_rate",
            label="finished requests/s",
            unit="per_second",
            level=INSTANCE,
            promql="instance:inferwatch_requests_finished:%(w)s",
            local=Rate("inferwatch_requests_finished_total"),
            fallback="request_duration_rate",
        ),
        # Scheduler and memory
        Signal(
            name="queued_while_idle_ratio",
            label="queued-while-idle share",
            unit="ratio",
            level=INSTANCE,
            promql="instance:inferwatch_queued_while_idle_seconds:%(w)s",
            local=Rate("inferwatch_queued_while_idle_seconds_total", how="max"),
        ),
        Signal(
            name="kv_usage",
            label="KV-cache use",
            unit="ratio",
            level=INSTANCE,
            promql="max without (engine) (avg_over_time(inferwatch_kv_cache_usage_ratio[%(window)s]))",
            local=Gauge("inferwatch_kv_cache_usage_ratio", averaged=True),
            fallback="token_budget_use",
        ),
        Signal(
            name="preemption_rate",
            label="preemptions/s",
            unit="per_second",
            level=INSTANCE,
            promql="instance:inferwatch_preemptions:%(w)s",
            local=Rate("inferwatch_preemptions_total"),
        ),
        Signal(
            name="running",
            label="running requests",
            unit="count",
            level=INSTANCE,
            promql="sum without (engine) (avg_over_time(inferwatch_requests_running[%(window)s]))",
            local=Gauge("inferwatch_requests_running", how="sum", averaged=True),
        ),
        Signal(
            name="waiting",
            label="waiting requests",
            unit="count",
            level=INSTANCE,
            promql="sum without (engine) (avg_over_time(inferwatch_requests_waiting[%(window)s]))",
            local=Gauge("inferwatch_requests_waiting", how="sum", averaged=True),
        ),
        Signal(
            name="engine_step_rate",
            label="engine steps/s",
            unit="per_second",
            level=INSTANCE,
            promql="sum without (engine) (rate(inferwatch_engine_steps_total[%(window)s]))",
            local=Rate("inferwatch_engine_steps_total"),
        ),
        # System
        Signal(
            name="frontend_cpu",
            label="frontend CPU",
            unit="cores",
            level=INSTANCE,
            promql="instance:inferwatch_frontend_cpu_seconds:%(w)s",
            local=Rate("inferwatch_frontend_cpu_seconds_total"),
        ),
        # Of the time the server's threads were ready to run, the share they waited for a
        # CPU (run-queue wait over wait + run time, collect/server_cpu.py).
        Signal(
            name="server_cpu_wait_share",
            label="server CPU wait share",
            unit="ratio",
            level=NODE,
            promql="instance:inferwatch_server_cpu_wait_seconds:share_%(w)s",
            local=Ratio(
                Rate("inferwatch_server_cpu_wait_seconds_total"),
                Sum(
                    (
                        Rate("inferwatch_server_cpu_wait_seconds_total"),
                        Rate("inferwatch_server_cpu_seconds_total"),
                    )
                ),
            ),
        ),
        Signal(
            name="gpu_busy",
            label="GPU busy",
            unit="ratio",
            level=NODE,
            promql="instance:inferwatch_gpu_busy_seconds:avg_%(w)s",
            local=Rate("inferwatch_gpu_busy_seconds_total", how="mean"),
        ),
        Signal(
            name="gpu_throttled",
            label="GPU clocks throttled",
            unit="ratio",
            level=NODE,
            promql=f'avg_over_time(inferwatch_gpu_clock_throttled{{reason=~"{THROTTLE_REASONS}"}}[%(window)s])',
            # Judged per GPU and reason (the alert names them); locally, the worst one.
            local=Gauge(
                "inferwatch_gpu_clock_throttled", where={"reason": THROTTLE_REASONS}, averaged=True
            ),
        ),
        *GPU_HEALTH,
        *ROUTER_SIGNALS,
        *FLEET_SIGNALS,
        # Communication. Per GPU in PromQL, its busier direction over its link's peak;
        # locally the busiest GPU and direction over the largest peak: the same where a
        # node's GPUs share one link type, as they do.
        Signal(
            name="nvlink_share",
            label="NVLink use (share of peak)",
            unit="ratio",
            level=NODE,
            promql="clamp_max(\n  max without (direction) (rate(inferwatch_gpu_nvlink_bytes_total[%(window)s]))\n"
            "  / inferwatch_gpu_nvlink_peak_bytes_per_second,\n  1\n)",
            local=Ratio(
                Rate("inferwatch_gpu_nvlink_bytes_total", how="max"),
                Gauge("inferwatch_gpu_nvlink_peak_bytes_per_second"),
            ),
        ),
        Signal(
            name="pcie_share",
            label="PCIe use (share of peak)",
            unit="ratio",
            level=NODE,
            promql="clamp_max(\n  max without (direction) (avg_over_time(inferwatch_gpu_pcie_bytes_per_second[%(window)s]))\n"
            "  / inferwatch_gpu_pcie_peak_bytes_per_second,\n  1\n)",
            local=Ratio(
                Gauge("inferwatch_gpu_pcie_bytes_per_second", averaged=True),
                Gauge("inferwatch_gpu_pcie_peak_bytes_per_second"),
            ),
        ),
        *KV_TRANSFER_SIGNALS,
        Signal(
            name="canary_ttft_gap",
            label="client gap (canary TTFT - server TTFT)",
            unit="seconds",
            level=INSTANCE,
            # The last value in the window: a missed scrape (a stale series) must not reset
            # the alert's `for`.
            promql="last_over_time(inferwatch_canary_ttft_gap_seconds[%(window)s])",
            local=Gauge("inferwatch_canary_ttft_gap_seconds"),
        ),
        # Availability
        Signal(
            name="canary_failure_ratio",
            label="canary probes failing",
            unit="ratio",
            level=INSTANCE,
            promql=f'sum without (result) (rate(inferwatch_canary_probes_total{{result=~"{_FAILED}"}}'
            "[%(window)s]))\n  / sum without (result) "
            "(rate(inferwatch_canary_probes_total[%(window)s]))",
            local=Ratio(
                Rate("inferwatch_canary_probes_total", where={"result": _FAILED}),
                Rate("inferwatch_canary_probes_total"),
            ),
        ),
        Signal(
            name="backend_up",
            label="backend up",
            unit="count",
            level=NODE,
            promql="inferwatch_backend_up",
            local=Gauge("inferwatch_backend_up"),
        ),
        Signal(
            name="exporter_up",
            label="exporter up",
            unit="count",
            level=NODE,
            promql="up{%(exporter_selector)s}",
            local=None,
        ),
        Signal(
            name="gpu_collection",
            label="GPU collection ok",
            unit="count",
            level=NODE,
            promql='inferwatch_collector_success{collector="gpu"}',
            local=Gauge("inferwatch_collector_success", where={"collector": "gpu"}),
        ),
        Signal(
            name="gpu_collection_recent",
            label="GPU collection ok lately",
            unit="count",
            level=NODE,
            promql='max_over_time(inferwatch_collector_success{collector="gpu"}[%(lookback)s])',
            local=None,
        ),
        # Across replicas
        Signal(
            name="model_ttft_p95",
            label="TTFT p95 (fleet)",
            unit="seconds",
            level=MODEL,
            promql=_recorded_quantile("model", TTFT),
            local=Quantile(TTFT, 0.95),
        ),
        Signal(
            name="model_queue_share",
            label="queue share of TTFT (fleet)",
            unit="ratio",
            level=MODEL,
            promql=f"model:inferwatch_{QUEUE}:mean_per_ttft_mean_%(w)s",
            local=Ratio(Mean(QUEUE), Mean(TTFT)),
        ),
        Signal(
            name="model_deferred_share",
            label="deferred share of the waiting requests (fleet)",
            unit="ratio",
            level=MODEL,
            promql="model:inferwatch_requests_deferred:share_%(w)s",
            local=Ratio(
                Gauge("inferwatch_requests_deferred", how="sum", averaged=True),
                Gauge("inferwatch_requests_waiting", how="sum", averaged=True),
            ),
        ),
        Signal(
            name="model_error_ratio",
            label="server-error share (fleet)",
            unit="ratio",
            level=MODEL,
            promql="model:inferwatch_requests_finished:error_ratio_%(w)s",
            local=Ratio(
                Rate("inferwatch_requests_finished_total", where=_ERRORS),
                Rate("inferwatch_requests_finished_total"),
            ),
        ),
        Signal(
            name="model_abort_ratio",
            label="abort share (fleet): clients cancelling",
            unit="ratio",
            level=MODEL,
            promql="model:inferwatch_requests_finished:abort_ratio_%(w)s",
            local=Ratio(
                Rate("inferwatch_requests_finished_total", where=_ABORTS),
                Rate("inferwatch_requests_finished_total"),
            ),
        ),
        Signal(
            name="model_request_rate",
            label="finished requests/s (fleet)",
            unit="per_second",
            level=MODEL,
            promql="model:inferwatch_requests_finished:%(w)s",
            local=Rate("inferwatch_requests_finished_total"),
        ),
        Signal(
            name="model_capacity_use",
            label="share of the measured capacity in use (fleet)",
            unit="ratio",
            level=MODEL,
            promql=f"model:inferwatch_requests_finished:%(w)s\n  / ({CAPACITY_SUM} > 0)",
            local=Ratio(
                Rate("inferwatch_requests_finished_total"),
                Gauge(CAPACITY, how="sum"),
            ),
        ),
        *FALLBACKS,
    )
}


def expression(name: str, values: Mapping[str, str]) -> str:
    """A signal's PromQL as the alerts compare it: its own series, and its fallback's for
    the label sets that have none of its own (PromQL's ``or``)."""
    signal = SIGNALS[name]
    own = signal.promql % values
    if signal.fallback is None:
        return own
    fallback = expression(signal.fallback, values)
    return f"(\n{textwrap.indent(own, '  ')}\n  or\n{textwrap.indent(fallback, '  ')}\n)"
