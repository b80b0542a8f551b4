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
from inferwatch.method.recipes import Gauge, Mean, Quantile, Rate, Ratio, ShareAbove, Sum
from inferwatch.method.signal import INSTANCE, ITL, MODEL, NODE, QUEUE, TTFT, Signal
from inferwatch.method.thresholds import THROTTLE_REASONS
from inferwatch.metrics import CANARY_RESULTS


def _q95(level: str, hist: str, q: str = "0.95") -> str:
    return f'max without (quantile) ({level}:inferwatch_{hist}:quantile_%(w)s{{quantile="{q}"}})'


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
            "ttft_p95",
            "TTFT p95",
            "seconds",
            INSTANCE,
            _q95("instance", TTFT),
            Quantile(TTFT, 0.95),
            fallback="canary_ttft_p95",
        ),
        Signal(
            "itl_p95",
            "ITL p95",
            "seconds",
            INSTANCE,
            _q95("instance", ITL),
            Quantile(ITL, 0.95),
            fallback="decode_step_p95",
        ),
        Signal(
            "itl_p99",
            "ITL p99",
            "seconds",
            INSTANCE,
            _q95("instance", ITL, "0.99"),
            Quantile(ITL, 0.99),
        ),
        Signal(
            "itl_tail_share",
            "ITL share above the tail bound",
            "ratio",
            INSTANCE,
            f"instance:inferwatch_{ITL}:share_above_tail_%(w)s",
            ShareAbove(ITL, "itl_tail_bound_seconds"),
        ),
        Signal(
            "queue_share",
            "queue share of TTFT",
            "ratio",
            INSTANCE,
            f"instance:inferwatch_{QUEUE}:mean_per_ttft_mean_%(w)s",
            Ratio(Mean(QUEUE), Mean(TTFT)),
            fallback="queue_share_of_steps",
        ),
        Signal(
            "itl_over_floor",
            "mean ITL / decode floor",
            "factor",
            INSTANCE,
            f"instance:inferwatch_{ITL}:mean_per_decode_floor_%(w)s",
            Ratio(Mean(ITL), Gauge("inferwatch_decode_floor_seconds")),
            fallback="decode_step_over_floor",
        ),
        Signal(
            "ttft_over_baseline",
            "TTFT p95 / baseline",
            "factor",
            INSTANCE,
            f"{_q95('instance', TTFT)}\n  / on (instance, job, backend, model) "
            f"inferwatch_baseline_{TTFT}{BASELINE95}",
            Ratio(
                Quantile(TTFT, 0.95),
                Gauge(f"inferwatch_baseline_{TTFT}", {"percentile": "95"}),
            ),
        ),
        Signal(
            "itl_over_baseline",
            "ITL p95 / baseline",
            "factor",
            INSTANCE,
            f"{_q95('instance', ITL)}\n  / on (instance, job, backend, model) "
            f"inferwatch_baseline_{ITL}{BASELINE95}",
            Ratio(Quantile(ITL, 0.95), Gauge(f"inferwatch_baseline_{ITL}", {"percentile": "95"})),
        ),
        # Traffic
        Signal(
            "request_rate",
            "finished requests/s",
            "per_second",
            INSTANCE,
            "instance:inferwatch_requests_finished:%(w)s",
            Rate("inferwatch_requests_finished_total"),
            fallback="request_duration_rate",
        ),
        # Scheduler and memory
        Signal(
            "queued_while_idle_ratio",
            "queued-while-idle share",
            "ratio",
            INSTANCE,
            "instance:inferwatch_queued_while_idle_seconds:%(w)s",
            Rate("inferwatch_queued_while_idle_seconds_total", how="max"),
        ),
        Signal(
            "kv_usage",
            "KV-cache use",
            "ratio",
            INSTANCE,
            "max without (engine) (avg_over_time(inferwatch_kv_cache_usage_ratio[%(window)s]))",
            Gauge("inferwatch_kv_cache_usage_ratio", averaged=True),
            fallback="token_budget_use",
        ),
        Signal(
            "preemption_rate",
            "preemptions/s",
            "per_second",
            INSTANCE,
            "instance:inferwatch_preemptions:%(w)s",
            Rate("inferwatch_preemptions_total"),
        ),
        Signal(
            "running",
            "running requests",
            "count",
            INSTANCE,
            "sum without (engine) (avg_over_time(inferwatch_requests_running[%(window)s]))",
            Gauge("inferwatch_requests_running", how="sum", averaged=True),
        ),
        Signal(
            "engine_step_rate",
            "engine steps/s",
            "per_second",
            INSTANCE,
            "sum without (engine) (rate(inferwatch_engine_steps_total[%(window)s]))",
            Rate("inferwatch_engine_steps_total"),
        ),
        # System
        Signal(
            "frontend_cpu",
            "frontend CPU",
            "cores",
            INSTANCE,
            "instance:inferwatch_frontend_cpu_seconds:%(w)s",
            Rate("inferwatch_frontend_cpu_seconds_total"),
        ),
        # Of the time the server's threads were ready to run, the share they waited for a
        # CPU (run-queue wait over wait + run time, collect/server_cpu.py).
        Signal(
            "server_cpu_wait_share",
            "server CPU wait share",
            "ratio",
            NODE,
            "instance:inferwatch_server_cpu_wait_seconds:share_%(w)s",
            Ratio(
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
            "gpu_busy",
            "GPU busy",
            "ratio",
            NODE,
            "instance:inferwatch_gpu_busy_seconds:avg_%(w)s",
            Rate("inferwatch_gpu_busy_seconds_total", how="mean"),
        ),
        Signal(
            "gpu_throttled",
            "GPU clocks throttled",
            "ratio",
            NODE,
            f'avg_over_time(inferwatch_gpu_clock_throttled{{reason=~"{THROTTLE_REASONS}"}}[%(window)s])',
            # Judged per GPU and reason (the alert names them); locally, the worst one.
            Gauge("inferwatch_gpu_clock_throttled", {"reason": THROTTLE_REASONS}, averaged=True),
        ),
        *GPU_HEALTH,
        # Communication. Per GPU in PromQL, its busier direction over its link's peak;
        # locally the busiest GPU and direction over the largest peak: the same where a
        # node's GPUs share one link type, as they do.
        Signal(
            "nvlink_share",
            "NVLink use (share of peak)",
            "ratio",
            NODE,
            "clamp_max(\n  max without (direction) (rate(inferwatch_gpu_nvlink_bytes_total[%(window)s]))\n"
            "  / inferwatch_gpu_nvlink_peak_bytes_per_second,\n  1\n)",
            Ratio(
                Rate("inferwatch_gpu_nvlink_bytes_total", how="max"),
                Gauge("inferwatch_gpu_nvlink_peak_bytes_per_second"),
            ),
        ),
        Signal(
            "pcie_share",
            "PCIe use (share of peak)",
            "ratio",
            NODE,
            "clamp_max(\n  max without (direction) (avg_over_time(inferwatch_gpu_pcie_bytes_per_second[%(window)s]))\n"
            "  / inferwatch_gpu_pcie_peak_bytes_per_second,\n  1\n)",
            Ratio(
                Gauge("inferwatch_gpu_pcie_bytes_per_second", averaged=True),
                Gauge("inferwatch_gpu_pcie_peak_bytes_per_second"),
            ),
        ),
        Signal(
            "canary_ttft_gap",
            "client gap (canary TTFT - server TTFT)",
            "seconds",
            INSTANCE,
            # The last value in the window: a missed scrape (a stale series) must not reset
            # the alert's `for`.
            "last_over_time(inferwatch_canary_ttft_gap_seconds[%(window)s])",
            Gauge("inferwatch_canary_ttft_gap_seconds"),
        ),
        # Availability
        Signal(
            "canary_failure_ratio",
            "canary probes failing",
            "ratio",
            INSTANCE,
            f'sum without (result) (rate(inferwatch_canary_probes_total{{result=~"{_FAILED}"}}'
            "[%(window)s]))\n  / sum without (result) "
            "(rate(inferwatch_canary_probes_total[%(window)s]))",
            Ratio(
                Rate("inferwatch_canary_probes_total", {"result": _FAILED}),
                Rate("inferwatch_canary_probes_total"),
            ),
        ),
        Signal(
            "backend_up",
            "backend up",
            "count",
            NODE,
            "inferwatch_backend_up",
            Gauge("inferwatch_backend_up"),
        ),
        Signal("exporter_up", "exporter up", "count", NODE, "up{%(exporter_selector)s}", None),
        Signal(
            "gpu_collection",
            "GPU collection ok",
            "count",
            NODE,
            'inferwatch_collector_success{collector="gpu"}',
            Gauge("inferwatch_collector_success", {"collector": "gpu"}),
        ),
        Signal(
            "gpu_collection_recent",
            "GPU collection ok lately",
            "count",
            NODE,
            'max_over_time(inferwatch_collector_success{collector="gpu"}[%(lookback)s])',
            None,
        ),
        # Across replicas
        Signal(
            "model_ttft_p95",
            "TTFT p95 (fleet)",
            "seconds",
            MODEL,
            _q95("model", TTFT),
            Quantile(TTFT, 0.95),
        ),
        Signal(
            "model_queue_share",
            "queue share of TTFT (fleet)",
            "ratio",
            MODEL,
            f"model:inferwatch_{QUEUE}:mean_per_ttft_mean_%(w)s",
            Ratio(Mean(QUEUE), Mean(TTFT)),
        ),
        Signal(
            "model_deferred_share",
            "deferred share of the waiting requests (fleet)",
            "ratio",
            MODEL,
            "model:inferwatch_requests_deferred:share_%(w)s",
            Ratio(
                Gauge("inferwatch_requests_deferred", how="sum", averaged=True),
                Gauge("inferwatch_requests_waiting", how="sum", averaged=True),
            ),
        ),
        Signal(
            "model_error_ratio",
            "server-error share (fleet)",
            "ratio",
            MODEL,
            "model:inferwatch_requests_finished:error_ratio_%(w)s",
            Ratio(
                Rate("inferwatch_requests_finished_total", _ERRORS),
                Rate("inferwatch_requests_finished_total"),
            ),
        ),
        Signal(
            "model_abort_ratio",
            "abort share (fleet): clients cancelling",
            "ratio",
            MODEL,
            "model:inferwatch_requests_finished:abort_ratio_%(w)s",
            Ratio(
                Rate("inferwatch_requests_finished_total", _ABORTS),
                Rate("inferwatch_requests_finished_total"),
            ),
        ),
        Signal(
            "model_request_rate",
            "finished requests/s (fleet)",
            "per_second",
            MODEL,
            "model:inferwatch_requests_finished:%(w)s",
            Rate("inferwatch_requests_finished_total"),
        ),
        Signal(
            "model_capacity_use",
            "share of the measured capacity in use (fleet)",
            "ratio",
            MODEL,
            f"model:inferwatch_requests_finished:%(w)s\n  / ({CAPACITY_SUM} > 0)",
            Ratio(
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
