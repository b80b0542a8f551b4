"""The heuristics spec: the troubleshooting method as thresholds, recording rules and alerts.

This module is the single source that ``inferwatch generate`` turns into the Prometheus rules
file, the runbooks, the Alertmanager example and the dashboards, and that ``inferwatch
diagnose`` evaluates; they can therefore never disagree.

The method (see the README): split by **phase** first (TTFT high with normal per-token
latency means prefill; the reverse means decode), then by **layer** (compute, memory,
scheduling, system), and compare with a **baseline**.

Where a threshold lives: :data:`THRESHOLDS` (each with its default and why). Where the
windows and ``for`` durations live: :class:`Timing`. Both can be overridden in the config
file (``thresholds:`` and ``alerting:`` sections, parsed strictly).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from inferwatch.method.slo import SLOs, slos_from_config
from inferwatch.settings import ConfigError, check_keys

# ---------------------------------------------------------------------------------------
# Thresholds


@dataclass(frozen=True)
class Threshold:
    default: float
    unit: str
    why: str


THRESHOLDS: dict[str, Threshold] = {
    "ttft_p95_seconds": Threshold(
        2.0,
        "s",
        "Interactive chat feels broken past ~2 s to the first token; most serving SLOs put "
        "TTFT p95 between 0.5 and 2 s. Set it from your baseline (`inferwatch baseline`).",
    ),
    "itl_p95_seconds": Threshold(
        0.1,
        "s",
        "100 ms between tokens is 10 tokens/s per stream, about reading speed; a healthy GPU "
        "decodes a 7-70B model at 15-50 ms per token.",
    ),
    "itl_p99_seconds": Threshold(
        0.5,
        "s",
        "A half-second stall inside a streamed answer is visible to users; used for the "
        "tail in prefill-stalls-decode.",
    ),
    "itl_tail_ratio": Threshold(
        8.0,
        "x",
        "Decode steps take about the same time each; a p99 eight times the median means some "
        "steps carry far more work (a prefill chunk) than the others.",
    ),
    "queue_share_high": Threshold(
        0.5,
        "ratio",
        "When more than half of the mean TTFT is time spent waiting to be scheduled, the "
        "server lacks capacity: prefill itself is not what is slow.",
    ),
    "queue_share_low": Threshold(
        0.2,
        "ratio",
        "Below a fifth of TTFT spent queued, a high TTFT comes from the prefill computation.",
    ),
    "floor_factor_far": Threshold(
        3.0,
        "x",
        "Decode at more than 3x the memory-bandwidth floor leaves room for kernel, KV-cache "
        "and batching improvements.",
    ),
    "floor_factor_near": Threshold(
        1.5,
        "x",
        "Within 1.5x of the floor decode is at the hardware limit (KV reads and kernel "
        "overheads account for the rest).",
    ),
    "kv_usage_high": Threshold(
        0.9,
        "ratio",
        "Above 90 % KV-cache use the scheduler starts to preempt or refuse to admit requests.",
    ),
    "preemptions_per_second": Threshold(
        0.02,
        "1/s",
        "About one preemption a minute; each one throws away computed KV cache and recomputes "
        "it later, so a steady stream of them wastes GPU time.",
    ),
    "queued_while_idle_ratio": Threshold(
        0.1,
        "ratio",
        "Requests waiting while the GPU idles for a tenth of the time is not a blip: the "
        "scheduler or the CPU is starving the accelerator.",
    ),
    "gpu_busy_low": Threshold(
        0.3,
        "ratio",
        "A GPU busy less than 30 % of the time while requests run is mostly waiting.",
    ),
    "gpu_busy_high": Threshold(
        0.8,
        "ratio",
        "Above 80 % busy the GPU is not the one waiting; a busy frontend is then not the "
        "bottleneck.",
    ),
    "frontend_cpu_cores": Threshold(
        0.9,
        "cores",
        "The API server/tokenizer is one Python process: at ~1 core it cannot go faster.",
    ),
    "error_ratio": Threshold(
        0.05,
        "ratio",
        "More than 5 % of requests ending in a server error is user-visible (aborts are "
        "clients cancelling, shown apart).",
    ),
    "min_request_rate": Threshold(
        0.05,
        "1/s",
        "Below ~3 requests a minute quantiles rest on too few samples to page anyone.",
    ),
    "min_token_rate": Threshold(
        1.0,
        "tokens/s",
        "Decode/prefill alerts need tokens flowing; an idle server has no latency problem.",
    ),
    "regression_factor": Threshold(
        1.5,
        "x",
        "50 % worse than the benchmark at the same concurrency is beyond run-to-run noise.",
    ),
    "throttled_share": Threshold(
        0.5,
        "ratio",
        "Clocks held down for thermal or hardware reasons more than half of the window.",
    ),
}

# Throttle reasons that indicate a hardware/cooling/power problem (power capping under full
# load, sw_power_cap, is normal and left out).
THROTTLE_REASONS = "hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown"

# ---------------------------------------------------------------------------------------
# Timing and rule options

_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")


def duration(text: str) -> str:
    """A Prometheus duration such as ``30s`` or ``5m`` (one unit)."""
    text = str(text).strip()
    if not _DURATION.match(text):
        raise ConfigError(f"{text!r} is not a duration like 30s, 5m or 1h")
    return text


def seconds(text: str) -> float:
    value, unit = _DURATION.match(text).groups()
    return int(value) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


@dataclass(frozen=True)
class Timing:
    """Rate window, evaluation interval and ``for`` durations.

    The rate window must cover at least 4 scrapes (Prometheus 3 reads range selectors as
    left-open intervals; a window of 4x the scrape interval always holds 3+ samples).
    """

    window: str = "5m"
    evaluation_interval: str = "30s"
    gpu_lost_lookback: str = "6h"
    for_: Mapping[str, str] = field(default_factory=dict)

    def for_alert(self, alert: Alert) -> str:
        return self.for_.get(alert.name, alert.for_default)


@dataclass(frozen=True)
class Spec:
    """Thresholds, timing and labels: everything the generated artifacts depend on."""

    thresholds: Mapping[str, float]
    timing: Timing = Timing()
    # Labels that identify a model across replicas (add e.g. "cluster" for multi-cluster;
    # the config's list is added to these).
    fleet_labels: tuple[str, ...] = ("namespace", "backend", "model")
    slos: SLOs = field(default_factory=SLOs)
    # What pages: "slo" (burn-rate alerts page, cause alerts are tickets) or "causes" (the
    # cause alerts' own severities, for users without SLOs).
    paging: str = "slo"
    # Selects the exporter's own scrape job (its `up` series).
    exporter_selector: str = 'job=~".*inferwatch.*"'
    runbook_url_base: str = "https://github.com/inferwatch/inferwatch/blob/main/alerts/runbooks/"

    @property
    def window_seconds(self) -> float:
        return seconds(self.timing.window)

    @property
    def w(self) -> str:
        """The rate window as it appears in recording-rule names: ``rate5m``."""
        return f"rate{self.timing.window}"

    def t(self, name: str) -> float:
        return self.thresholds[name]

    def severity(self, alert: Alert) -> str:
        """The alert's severity; with SLOs paging, only a dead backend pages besides them
        (requests that never reach the server are in no SLI)."""
        if self.paging == "slo" and alert.severity == "critical":
            return "critical" if alert.name == "InferenceBackendDown" else "warning"
        return alert.severity


_ALERTING_KEYS = {
    "rate_window",
    "evaluation_interval",
    "gpu_lost_lookback",
    "for",
    "fleet_labels",
    "paging",
    "exporter_selector",
    "runbook_url_base",
}


def spec_from_config(
    config: Mapping[str, Any], baseline_thresholds: Mapping[str, float] | None = None
) -> Spec:
    """The spec with the config file's ``thresholds:`` and ``alerting:`` overrides.

    ``baseline_thresholds`` (from a baseline file) replace the latency defaults; values set
    explicitly in the config file win over both.
    """
    thresholds = {name: t.default for name, t in THRESHOLDS.items()}
    thresholds.update(baseline_thresholds or {})
    given = config.get("thresholds") or {}
    if not isinstance(given, Mapping):
        raise ConfigError("thresholds: expected a mapping of threshold names to numbers")
    check_keys(given, THRESHOLDS, "thresholds")
    for name, value in given.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ConfigError(f"thresholds.{name}: {value!r} is not a non-negative number")
        thresholds[name] = float(value)
    alerting = config.get("alerting") or {}
    if not isinstance(alerting, Mapping):
        raise ConfigError("alerting: expected a mapping")
    check_keys(alerting, _ALERTING_KEYS, "alerting")
    for_ = alerting.get("for") or {}
    if not isinstance(for_, Mapping):
        raise ConfigError("alerting.for: expected a mapping of alert names to durations")
    check_keys(for_, ALERTS, "alerting.for")
    try:
        timing = Timing(
            window=duration(alerting.get("rate_window", Timing.window)),
            evaluation_interval=duration(
                alerting.get("evaluation_interval", Timing.evaluation_interval)
            ),
            gpu_lost_lookback=duration(alerting.get("gpu_lost_lookback", Timing.gpu_lost_lookback)),
            for_={name: duration(value) for name, value in for_.items()},
        )
    except ConfigError as exc:
        raise ConfigError(f"alerting: {exc}") from None
    fleet = alerting.get("fleet_labels", [])
    if not isinstance(fleet, (list, tuple)) or not all(isinstance(x, str) for x in fleet):
        raise ConfigError("alerting.fleet_labels: expected a list of label names")
    paging = alerting.get("paging", Spec.paging)
    if paging not in ("slo", "causes"):
        raise ConfigError(f"alerting.paging: {paging!r} is not one of slo, causes")
    return Spec(
        thresholds=thresholds,
        timing=timing,
        fleet_labels=tuple(dict.fromkeys((*Spec.fleet_labels, *fleet))),
        slos=slos_from_config(config.get("slos"), str(config.get("backend", "auto"))),
        paging=paging,
        exporter_selector=str(alerting.get("exporter_selector", Spec.exporter_selector)),
        runbook_url_base=str(alerting.get("runbook_url_base", Spec.runbook_url_base)),
    )


# ---------------------------------------------------------------------------------------
# Recording rules


@dataclass(frozen=True)
class Record:
    record: str
    expr: str
    labels: Mapping[str, str] = field(default_factory=dict)


# Histograms whose latency quantiles and means are recorded, per instance and per model.
LATENCY_HISTOGRAMS = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "request_duration_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
)
# Histograms recorded as means only (request lengths, batch size proxy).
SIZE_HISTOGRAMS = ("request_prompt_tokens", "request_generation_tokens", "engine_step_tokens")
QUANTILES = ("0.5", "0.95", "0.99")

# Per instance: keep every target label (instance, job, pod, namespace...), drop the
# backend's data-parallel rank. Per model: the fleet labels.
INSTANCE = "instance"
MODEL = "model"


def _level(spec: Spec, level: str, extra: str = "") -> str:
    if level == INSTANCE:
        return f"without (engine{extra})"
    labels = ", ".join(spec.fleet_labels)
    return f"by ({labels})"


def recording_rules(spec: Spec) -> list[Record]:
    """Every recording rule, named ``level:metric:operations``."""
    w, window = spec.w, spec.timing.window
    out: list[Record] = []
    for level in (INSTANCE, MODEL):
        by = _level(spec, level)
        for hist in (*LATENCY_HISTOGRAMS, *SIZE_HISTOGRAMS):
            metric = f"inferwatch_{hist}"
            for part in ("sum", "count"):
                out.append(
                    Record(
                        f"{level}:{metric}_{part}:{w}",
                        f"sum {by} (rate({metric}_{part}[{window}]))",
                    )
                )
            out.append(
                Record(
                    f"{level}:{metric}:mean_{w}",
                    f"{level}:{metric}_sum:{w} / ({level}:{metric}_count:{w} > 0)",
                )
            )
            if hist in SIZE_HISTOGRAMS:
                continue
            by_le = _level(spec, level) if level == INSTANCE else by.replace(")", ", le)")
            out.append(
                Record(
                    f"{level}:{metric}_bucket:{w}",
                    f"sum {by_le} (rate({metric}_bucket[{window}]))",
                )
            )
            for q in QUANTILES:
                out.append(
                    Record(
                        f"{level}:{metric}:quantile_{w}",
                        f"histogram_quantile({q}, {level}:{metric}_bucket:{w})",
                        {"quantile": q},
                    )
                )
        for counter in ("prompt_tokens", "generation_tokens", "preemptions"):
            metric = f"inferwatch_{counter}"
            out.append(
                Record(f"{level}:{metric}:{w}", f"sum {by} (rate({metric}_total[{window}]))")
            )
        finished = "inferwatch_requests_finished"
        out.append(
            Record(
                f"{level}:{finished}:{w}",
                f"sum {_level(spec, level, ', reason')} (rate({finished}_total[{window}]))",
            )
        )
        for reason in ("error", "abort"):
            out.append(
                Record(
                    f"{level}:{finished}:{reason}_ratio_{w}",
                    f'sum {_level(spec, level, ", reason")} (rate({finished}_total{{reason="{reason}"}}[{window}]))\n'
                    f"  / ({level}:{finished}:{w} > 0)",
                )
            )
        out.append(
            Record(
                f"{level}:inferwatch_prefix_cache_hits:ratio_{w}",
                f"sum {by} (rate(inferwatch_prefix_cache_hits_total[{window}]))\n"
                f"  / (sum {by} (rate(inferwatch_prefix_cache_queries_total[{window}])) > 0)",
            )
        )
    # Local signals: per instance only.
    out += [
        # Judged per engine (a data-parallel pod's hung engine is not averaged away); the
        # instance's share is its worst engine's.
        Record(
            f"instance:inferwatch_queued_while_idle_seconds:{w}",
            f"max without (engine) (rate(inferwatch_queued_while_idle_seconds_total[{window}]))",
        ),
        Record(
            f"instance:inferwatch_frontend_cpu_seconds:{w}",
            f"sum without (engine) (rate(inferwatch_frontend_cpu_seconds_total[{window}]))",
        ),
        Record(
            f"instance:inferwatch_engine_steps:{w}",
            f"sum without (engine) (rate(inferwatch_engine_steps_total[{window}]))",
        ),
        Record(
            f"instance:inferwatch_gpu_busy_seconds:avg_{w}",
            f"avg without (gpu, uuid, name) (rate(inferwatch_gpu_busy_seconds_total[{window}]))",
        ),
        Record(
            f"instance:inferwatch_inter_token_latency_seconds:mean_per_decode_floor_{w}",
            f"instance:inferwatch_inter_token_latency_seconds:mean_{w}\n"
            "  / on (instance, job, backend, model) group_left max by (instance, job, backend, model) "
            "(inferwatch_decode_floor_seconds)",
        ),
        Record(
            f"instance:inferwatch_estimated_read_bytes:per_peak_bandwidth_{w}",
            f"sum without (engine) (rate(inferwatch_estimated_read_bytes_total[{window}]))\n"
            "  / on (instance, job) group_left avg by (instance, job) "
            "(inferwatch_gpu_memory_bandwidth_peak_bytes_per_second)",
        ),
    ]
    return out


# ---------------------------------------------------------------------------------------
# Signals: the quantities the alerts compare with thresholds
#
# Each has a PromQL form (over the recording rules, for the rules and `diagnose
# --prometheus`) and a local recipe (for `diagnose --exporter`, which computes it from two
# scrapes of one exporter). Both forms mean the same quantity over the same series: a
# recipe combines an exporter's engines and GPUs as the PromQL does (tests/test_signals.py
# evaluates both on the same series). Levels say which labels a signal's series carry:
#   INSTANCE  target labels + backend + model      MODEL  the fleet labels
#   NODE      target labels (+ gpu labels)         (joined to others on instance, job)

NODE = "node"


@dataclass(frozen=True)
class Quantile:
    histogram: str
    q: float


@dataclass(frozen=True)
class Mean:
    histogram: str


# How a recipe combines the series of one exporter (its engines, its GPUs): as the PromQL
# form aggregates them (``sum``/``avg``/``max without (engine)`` or ``(gpu, uuid, name)``).
Aggregation = Literal["sum", "mean", "max"]


@dataclass(frozen=True)
class Rate:
    """Per-second increase of a counter over the window, its series combined by ``how``."""

    counter: str
    where: Mapping[str, str] = field(default_factory=dict)  # label -> regex
    how: Aggregation = "sum"


@dataclass(frozen=True)
class Gauge:
    """A gauge's value, its series combined by ``how``.

    ``averaged``: each series' mean over the window (PromQL's ``avg_over_time``), else its
    last value (an instant selector).
    """

    metric: str
    where: Mapping[str, str] = field(default_factory=dict)
    how: Aggregation = "max"
    averaged: bool = False


@dataclass(frozen=True)
class Ratio:
    numerator: Recipe
    denominator: Recipe


Recipe = Quantile | Mean | Rate | Gauge | Ratio


@dataclass(frozen=True)
class Signal:
    name: str
    label: str  # how diagnose names it: "TTFT p95"
    unit: str  # seconds, ratio, per_second, tokens, cores, factor, count
    level: str
    promql: str  # %-template (see Alert)
    local: Recipe | None  # None: not computable from two scrapes of one exporter


def _q95(level: str, hist: str, q: str = "0.95") -> str:
    return f'max without (quantile) ({level}:inferwatch_{hist}:quantile_%(w)s{{quantile="{q}"}})'


_TTFT = "time_to_first_token_seconds"
_ITL = "inter_token_latency_seconds"
_QUEUE = "request_queue_time_seconds"
_BASELINE95 = '{percentile="95"}'  # the baseline's gauges carry a percentile label
_ERRORS = {"reason": "error"}
_ABORTS = {"reason": "abort"}

SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        # Latency by phase
        Signal(
            "ttft_p95",
            "TTFT p95",
            "seconds",
            INSTANCE,
            _q95("instance", _TTFT),
            Quantile(_TTFT, 0.95),
        ),
        Signal(
            "itl_p95", "ITL p95", "seconds", INSTANCE, _q95("instance", _ITL), Quantile(_ITL, 0.95)
        ),
        Signal(
            "itl_p99",
            "ITL p99",
            "seconds",
            INSTANCE,
            _q95("instance", _ITL, "0.99"),
            Quantile(_ITL, 0.99),
        ),
        Signal(
            "itl_tail_ratio",
            "ITL p99 / p50",
            "factor",
            INSTANCE,
            f"{_q95('instance', _ITL, '0.99')}\n  / {_q95('instance', _ITL, '0.5')}",
            Ratio(Quantile(_ITL, 0.99), Quantile(_ITL, 0.5)),
        ),
        Signal(
            "queue_share",
            "queue share of TTFT",
            "ratio",
            INSTANCE,
            f"instance:inferwatch_{_QUEUE}:mean_%(w)s / instance:inferwatch_{_TTFT}:mean_%(w)s",
            Ratio(Mean(_QUEUE), Mean(_TTFT)),
        ),
        Signal(
            "itl_over_floor",
            "mean ITL / decode floor",
            "factor",
            INSTANCE,
            f"instance:inferwatch_{_ITL}:mean_per_decode_floor_%(w)s",
            Ratio(Mean(_ITL), Gauge("inferwatch_decode_floor_seconds")),
        ),
        Signal(
            "ttft_over_baseline",
            "TTFT p95 / baseline",
            "factor",
            INSTANCE,
            f"{_q95('instance', _TTFT)}\n  / on (instance, job, backend, model) "
            f"inferwatch_baseline_{_TTFT}{_BASELINE95}",
            Ratio(
                Quantile(_TTFT, 0.95),
                Gauge(f"inferwatch_baseline_{_TTFT}", {"percentile": "95"}),
            ),
        ),
        Signal(
            "itl_over_baseline",
            "ITL p95 / baseline",
            "factor",
            INSTANCE,
            f"{_q95('instance', _ITL)}\n  / on (instance, job, backend, model) "
            f"inferwatch_baseline_{_ITL}{_BASELINE95}",
            Ratio(Quantile(_ITL, 0.95), Gauge(f"inferwatch_baseline_{_ITL}", {"percentile": "95"})),
        ),
        # Traffic
        Signal(
            "request_rate",
            "finished requests/s",
            "per_second",
            INSTANCE,
            "instance:inferwatch_requests_finished:%(w)s",
            Rate("inferwatch_requests_finished_total"),
        ),
        Signal(
            "generation_rate",
            "generated tokens/s",
            "per_second",
            INSTANCE,
            "instance:inferwatch_generation_tokens:%(w)s",
            Rate("inferwatch_generation_tokens_total"),
        ),
        Signal(
            "prompt_rate",
            "prompt tokens/s",
            "per_second",
            INSTANCE,
            "instance:inferwatch_prompt_tokens:%(w)s",
            Rate("inferwatch_prompt_tokens_total"),
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
        # System
        Signal(
            "frontend_cpu",
            "frontend CPU",
            "cores",
            INSTANCE,
            "instance:inferwatch_frontend_cpu_seconds:%(w)s",
            Rate("inferwatch_frontend_cpu_seconds_total"),
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
        # Availability
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
            _q95("model", _TTFT),
            Quantile(_TTFT, 0.95),
        ),
        Signal(
            "model_queue_share",
            "queue share of TTFT (fleet)",
            "ratio",
            MODEL,
            f"model:inferwatch_{_QUEUE}:mean_%(w)s / model:inferwatch_{_TTFT}:mean_%(w)s",
            Ratio(Mean(_QUEUE), Mean(_TTFT)),
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
    )
}


@dataclass(frozen=True)
class Cond:
    """``signal op threshold``; the threshold is a name in THRESHOLDS or a number."""

    signal: str
    op: str
    threshold: str | float

    def promql(self, values: Mapping[str, str]) -> str:
        signal = SIGNALS[self.signal].promql % values
        bound = (
            values[f"t.{self.threshold}"]
            if isinstance(self.threshold, str)
            else f"{self.threshold:g}"
        )
        # Comparisons bind tighter than and/or/unless, looser than arithmetic.
        return f"{signal} {self.op} {bound}"

    def bound(self, spec: Spec) -> float:
        """The number the signal is compared with under ``spec``."""
        return spec.t(self.threshold) if isinstance(self.threshold, str) else float(self.threshold)

    def holds(self, value: float, spec: Spec) -> bool:
        bound = self.bound(spec)
        return {
            ">": value > bound,
            ">=": value >= bound,
            "<": value < bound,
            "<=": value <= bound,
            "==": value == bound,
        }[self.op]


def _join(first: str, other: str) -> str:
    """The matching clause between two signals' series."""
    return "" if first == other else " on (instance, job)"


# ---------------------------------------------------------------------------------------
# Alerts


@dataclass(frozen=True)
class Alert:
    """One alert of the contract: when it fires, what it says, where it points.

    It fires when every condition of ``when`` holds and none of ``unless`` does, or, with
    ``any_of``, when any of those holds. The value of the first condition's signal is the
    alert's ``$value``. Annotation templates hold ``%(name)s`` placeholders filled from the
    spec: ``%(t.ttft_p95_seconds)s`` (a threshold), ``%(pct.kv_usage_high)s`` (one as a
    percentage), ``%(w)s`` (``rate5m``), ``%(window)s`` (``5m``), ``%(for)s``; Go-template
    ``{{ }}`` is written as it is.
    """

    name: str
    severity: str
    level: str  # INSTANCE (a local cause) or MODEL (across replicas)
    phase: str  # prefill, decode, any
    layer: str  # compute, memory, scheduling, system, availability, baseline
    for_default: str
    summary: str
    description: str
    when: tuple[Cond, ...] = ()
    any_of: tuple[Cond, ...] = ()
    unless: tuple[Cond, ...] = ()

    def conditions(self) -> tuple[Cond, ...]:
        return self.when + self.any_of + self.unless

    def thresholds(self) -> list[str]:
        """Names of the thresholds the alert compares with, in THRESHOLDS order."""
        used = {c.threshold for c in self.conditions() if isinstance(c.threshold, str)}
        return [name for name in THRESHOLDS if name in used]

    def promql(self, values: Mapping[str, str]) -> str:
        """The alert expression, built from its conditions."""
        if self.any_of:
            first = SIGNALS[self.any_of[0].signal].level
            parts = [f"({self.any_of[0].promql(values)})"]
            for cond in self.any_of[1:]:
                join = _join(first, SIGNALS[cond.signal].level)
                parts.append(f"or{join} ({cond.promql(values)})")
            return "\n".join(parts)
        first = SIGNALS[self.when[0].signal].level
        parts = [self.when[0].promql(values)]
        for keyword, conds in (("and", self.when[1:]), ("unless", self.unless)):
            for cond in conds:
                join = _join(first, SIGNALS[cond.signal].level)
                parts.append(f"{keyword}{join} {cond.promql(values)}")
        return "\n".join(parts)


def _q(selector: str, level: str, fmt: str = "humanize", match_model: bool = True) -> str:
    """Annotation snippet: the value of another series for the alert's own labels.

    ``selector`` is a metric name with optional extra matchers (``foo`` or
    ``foo{quantile="0.95"}``), possibly inside functions (``count(last_over_time(foo[6h]))``:
    the matchers go on the innermost metric name). ``fmt`` is a template function applied to
    the value, or ``label "name"`` to print one of the series' labels instead.
    ``match_model=False`` matches on instance and job only (series without a model label).
    """
    pipe = fmt if fmt.startswith("label ") else f"value | {fmt}"
    part = r"(?:[a-zA-Z0-9_:]|%\(\w+\)s)"  # a name character, or a %(w)s placeholder
    match = re.search(rf"{part}*inferwatch_{part}+(\{{[^}}]*\}})?", selector)
    assert match is not None, selector
    name, extra = match.group(0).partition("{")[::2]
    extra = "," + extra.rstrip("}") if extra else ""
    if level == INSTANCE:
        labels = 'instance="%%s",job="%%s"' + (',model="%%s"' if match_model else "")
        args = "$labels.instance $labels.job" + (" $labels.model" if match_model else "")
    else:
        labels = 'namespace="%%s",backend="%%s",model="%%s"'
        args = "$labels.namespace $labels.backend $labels.model"
    query = selector[: match.start()] + f"{name}{{{labels}{extra}}}" + selector[match.end() :]
    return (
        f"{{{{ with printf `{query}` {args} | query }}}}"
        f"{{{{ . | first | {pipe} }}}}{{{{ else }}}}n/a{{{{ end }}}}"
    )


NUM = 'printf "%%.3g"'  # plain numbers (rates, ratios): 0.1, not humanize's "100m"
BASE95 = _BASELINE95
P95, P99, P50 = '{quantile="0.95"}', '{quantile="0.99"}', '{quantile="0.5"}'


def _alerts() -> list[Alert]:
    I, M = INSTANCE, MODEL  # noqa: E741 (short level names keep the templates readable)
    ittft, iitl, iqueue = (f"instance:inferwatch_{h}" for h in (_TTFT, _ITL, _QUEUE))
    mttft, mqueue = f"model:inferwatch_{_TTFT}", f"model:inferwatch_{_QUEUE}"
    return [
        Alert(
            "InferenceBackendDown",
            "critical",
            I,
            "any",
            "availability",
            "1m",
            "Inference backend on {{ $labels.instance }} cannot be scraped",
            "inferwatch on {{ $labels.instance }} has not been able to read the "
            '{{ or $labels.backend "inference" }} server\'s /metrics (or the sidecar itself '
            "is down) for %(for)s; its last scrape attempt took "
            + _q(
                "inferwatch_backend_scrape_duration_seconds",
                I,
                "humanizeDuration",
                match_model=False,
            )
            + " (the sidecar's log names the cause). Latency alerts of this pod are inhibited "
            "meanwhile.",
            any_of=(Cond("backend_up", "==", 0), Cond("exporter_up", "==", 0)),
        ),
        Alert(
            "InferenceQueuedWhileIdle",
            "warning",
            I,
            "any",
            "scheduling",
            "1m",
            "Requests wait while the accelerator idles on {{ $labels.instance }}",
            "Requests for {{ $labels.model }} waited while the GPU (or, without NVML, the "
            "engine) sat idle {{ $value | humanizePercentage }} of the last %(window)s "
            "(threshold %(pct.queued_while_idle_ratio)s); queue depth now "
            + _q("inferwatch_requests_waiting", I, NUM)
            + ". The scheduler or the CPU is not feeding the accelerator.",
            when=(Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),),
        ),
        Alert(
            "InferenceQueueingDelay",
            "warning",
            M,
            "prefill",
            "scheduling",
            "5m",
            "{{ $labels.model }}: time to first token is dominated by queueing",
            "TTFT p95 of {{ $labels.model }} across replicas is {{ $value | humanizeDuration }} "
            "(threshold %(t.ttft_p95_seconds)ss) and requests wait "
            + _q(f"{mqueue}:mean_%(w)s", M, "humanizeDuration")
            + " of a mean TTFT of "
            + _q(f"{mttft}:mean_%(w)s", M, "humanizeDuration")
            + " to be scheduled: the fleet lacks capacity.",
            when=(
                Cond("model_ttft_p95", ">", "ttft_p95_seconds"),
                Cond("model_queue_share", ">", "queue_share_high"),
            ),
        ),
        Alert(
            "InferencePrefillBottleneck",
            "warning",
            I,
            "prefill",
            "compute",
            "5m",
            "Prefill is the bottleneck on {{ $labels.instance }} ({{ $labels.model }})",
            "TTFT p95 is {{ $value | humanizeDuration }} (threshold %(t.ttft_p95_seconds)ss) "
            "while queueing takes only "
            + _q(f"{iqueue}:mean_%(w)s", I, "humanizeDuration")
            + " and inter-token latency p95 is a normal "
            + _q(f"{iitl}:quantile_%(w)s{P95}", I, "humanizeDuration")
            + ". Prompts take long to compute: mean prompt "
            + _q("instance:inferwatch_request_prompt_tokens:mean_%(w)s", I)
            + " tokens, prefix-cache hit ratio "
            + _q("instance:inferwatch_prefix_cache_hits:ratio_%(w)s", I, "humanizePercentage")
            + ".",
            when=(
                Cond("ttft_p95", ">", "ttft_p95_seconds"),
                Cond("queue_share", "<", "queue_share_low"),
                Cond("itl_p95", "<=", "itl_p95_seconds"),
                Cond("request_rate", ">", "min_request_rate"),
            ),
            # Preempted requests wait for KV space again after being scheduled, which the
            # queue time does not count: a slow first token is then the memory layer's.
            # Requests that reach a stalled engine are not queued yet either (vLLM starts
            # the queue timer when the engine core takes them in): their TTFT is the stall's.
            unless=(
                Cond("preemption_rate", ">", "preemptions_per_second"),
                Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),
            ),
        ),
        Alert(
            "InferenceDecodeBottleneck",
            "warning",
            I,
            "decode",
            "memory",
            "5m",
            "Decode is the bottleneck on {{ $labels.instance }} ({{ $labels.model }})",
            "Inter-token latency p95 is {{ $value | humanizeDuration }} (threshold "
            "%(t.itl_p95_seconds)ss) while TTFT p95 is a normal "
            + _q(f"{ittft}:quantile_%(w)s{P95}", I, "humanizeDuration")
            + "; mean ITL over the hardware floor is "
            + _q(f"{iitl}:mean_per_decode_floor_%(w)s", I, NUM)
            + "x (n/a: floor unknown), with "
            + _q("instance:inferwatch_engine_step_tokens:mean_%(w)s", I)
            + " tokens per engine step. Decode is slower than the memory bandwidth allows.",
            when=(
                Cond("itl_p95", ">", "itl_p95_seconds"),
                Cond("ttft_p95", "<=", "ttft_p95_seconds"),
                Cond("generation_rate", ">", "min_token_rate"),
            ),
            unless=(Cond("itl_over_floor", "<", "floor_factor_far"),),
        ),
        Alert(
            "InferenceDecodeAtHardwareFloor",
            "info",
            I,
            "decode",
            "memory",
            "10m",
            "Decode on {{ $labels.instance }} runs at the memory-bandwidth floor",
            'Mean inter-token latency of {{ $labels.model }} is {{ $value | printf "%%.3g" }}x '
            "the floor of "
            + _q("inferwatch_decode_floor_seconds", I, "humanizeDuration")
            + " (weight bytes / peak memory bandwidth). Decode is hardware-bound: only a "
            "smaller or quantized model, or more GPUs, make it faster.",
            when=(
                Cond("itl_over_floor", "<", "floor_factor_near"),
                Cond("generation_rate", ">", "min_token_rate"),
            ),
        ),
        Alert(
            "InferenceKVCachePressure",
            "warning",
            I,
            "decode",
            "memory",
            "5m",
            "KV cache under pressure on {{ $labels.instance }} ({{ $labels.model }})",
            "KV-cache use now "
            + _q("inferwatch_kv_cache_usage_ratio", I, "humanizePercentage")
            + " (threshold %(pct.kv_usage_high)s averaged over %(window)s) and the scheduler "
            "preempted "
            + _q("instance:inferwatch_preemptions:%(w)s", I, NUM)
            + " requests/s (threshold %(t.preemptions_per_second)s/s). Preempted requests lose "
            "their KV cache and are recomputed later.",
            any_of=(
                Cond("kv_usage", ">", "kv_usage_high"),
                Cond("preemption_rate", ">", "preemptions_per_second"),
            ),
        ),
        Alert(
            "InferencePrefillStallsDecode",
            "warning",
            I,
            "decode",
            "scheduling",
            "5m",
            "Prefill stalls decode on {{ $labels.instance }} ({{ $labels.model }})",
            'Inter-token latency p99 is {{ $value | printf "%%.3g" }}x its median ('
            + _q(f"{iitl}:quantile_%(w)s{P99}", I, "humanizeDuration")
            + " vs "
            + _q(f"{iitl}:quantile_%(w)s{P50}", I, "humanizeDuration")
            + ") while prompts are prefilled at "
            + _q("instance:inferwatch_prompt_tokens:%(w)s", I)
            + " tokens/s with "
            + _q("instance:inferwatch_engine_step_tokens:mean_%(w)s", I)
            + " tokens per engine step: decode steps wait behind prefill chunks.",
            when=(
                Cond("itl_tail_ratio", ">", "itl_tail_ratio"),
                Cond("itl_p99", ">", "itl_p99_seconds"),
                Cond("prompt_rate", ">", "min_token_rate"),
            ),
            # A stalled engine cuts every stream for the stall's length and then prefills the
            # backlog: a long tail that prefill did not cause. Under overload every step admits
            # new prompts, and under KV pressure preempted requests are prefilled again: the
            # tail is then capacity's or memory's (QueueingDelay, KVCachePressure say what to
            # change), not the chunk size's.
            unless=(
                Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),
                Cond("queue_share", ">", "queue_share_high"),
                Cond("preemption_rate", ">", "preemptions_per_second"),
            ),
        ),
        Alert(
            "InferenceGPUUnderutilized",
            "warning",
            I,
            "any",
            "compute",
            "10m",
            "GPUs on {{ $labels.instance }} mostly idle while requests run",
            "The GPUs were busy {{ $value | humanizePercentage }} of the time over %(window)s "
            "(threshold %(pct.gpu_busy_low)s) while requests were running: batches are too "
            "small or the CPU side (tokenization, scheduling, output processing) cannot keep "
            "the GPU fed.",
            when=(Cond("gpu_busy", "<", "gpu_busy_low"), Cond("running", ">=", 1)),
        ),
        Alert(
            "InferenceFrontendCPUSaturated",
            "warning",
            I,
            "any",
            "system",
            "5m",
            "API server / tokenizer CPU saturated on {{ $labels.instance }}",
            'The server\'s frontend process used {{ $value | printf "%%.2f" }} CPU cores over '
            "%(window)s (threshold %(t.frontend_cpu_cores)s) while the GPU was not busy: "
            "tokenization, detokenization and HTTP handling in one Python process are the "
            "bottleneck.",
            when=(Cond("frontend_cpu", ">", "frontend_cpu_cores"),),
            unless=(Cond("gpu_busy", ">", "gpu_busy_high"),),
        ),
        Alert(
            "InferenceRequestErrors",
            "critical",
            M,
            "any",
            "availability",
            "5m",
            "{{ $labels.model }}: {{ $value | humanizePercentage }} of requests fail",
            "{{ $value | humanizePercentage }} of the requests of {{ $labels.model }} finished "
            "with a server error over %(window)s (threshold %(pct.error_ratio)s; client aborts "
            "are not counted), out of "
            + _q("model:inferwatch_requests_finished:%(w)s", M, NUM)
            + " requests/s.",
            when=(
                Cond("model_error_ratio", ">", "error_ratio"),
                Cond("model_request_rate", ">", "min_request_rate"),
            ),
        ),
        Alert(
            "InferenceLatencyRegression",
            "warning",
            I,
            "any",
            "baseline",
            "15m",
            "Latency on {{ $labels.instance }} regressed against the baseline",
            'Live p95 latency of {{ $labels.model }} is {{ $value | printf "%%.3g" }}x the '
            "baseline at comparable load (concurrency "
            + _q(f"inferwatch_baseline_{_TTFT}{BASE95}", I, 'label "concurrency"')
            + "; threshold %(t.regression_factor)sx): TTFT p95 "
            + _q(f"{ittft}:quantile_%(w)s{P95}", I, "humanizeDuration")
            + " vs "
            + _q(f"inferwatch_baseline_{_TTFT}{BASE95}", I, "humanizeDuration")
            + ", inter-token latency p95 "
            + _q(f"{iitl}:quantile_%(w)s{P95}", I, "humanizeDuration")
            + " vs "
            + _q(f"inferwatch_baseline_{_ITL}{BASE95}", I, "humanizeDuration")
            + ".",
            any_of=(
                Cond("ttft_over_baseline", ">", "regression_factor"),
                Cond("itl_over_baseline", ">", "regression_factor"),
            ),
        ),
        Alert(
            "InferenceGPUThrottling",
            "warning",
            I,
            "any",
            "compute",
            "5m",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }} is throttled ({{ $labels.reason }})",
            "GPU {{ $labels.gpu }} ({{ $labels.name }}) had its clocks held down for "
            "{{ $labels.reason }} {{ $value | humanizePercentage }} of the last %(window)s: "
            "every kernel runs slower until cooling or power delivery is fixed.",
            when=(Cond("gpu_throttled", ">", "throttled_share"),),
        ),
        Alert(
            "InferenceExporterGPUMissing",
            "warning",
            I,
            "any",
            "availability",
            "5m",
            "inferwatch on {{ $labels.instance }} lost its GPUs",
            "NVML collection on {{ $labels.instance }} worked within the last %(lookback)s "
            "(GPUs seen: "
            + _q(
                "count(last_over_time(inferwatch_gpu_memory_total_bytes[%(lookback)s]))",
                I,
                NUM,
                match_model=False,
            )
            + ") and now fails: a GPU vanished (fell off the bus, Xid error) or the "
            "driver/NVML became unavailable. GPU series and the GPU-based idle signal are "
            "missing meanwhile.",
            when=(Cond("gpu_collection", "==", 0), Cond("gpu_collection_recent", "==", 1)),
        ),
    ]


ALERTS: dict[str, Alert] = {a.name: a for a in _alerts()}

# Alertmanager inhibitions: (source alert, target alerts, labels that must be equal).
INHIBITIONS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "InferenceBackendDown",
        tuple(
            a.name
            for a in ALERTS.values()
            if a.level == INSTANCE and a.name != "InferenceBackendDown"
        ),
        ("instance",),
    ),
    ("InferenceQueuedWhileIdle", ("InferenceQueueingDelay",), ("model",)),
    # The page says it; the ticket for the same objective would say it again.
    ("InferenceSLOFastBurn", ("InferenceSLOSlowBurn",), ("slo", "namespace", "backend", "model")),
)


def placeholders(spec: Spec, alert: Alert | None = None) -> dict[str, str]:
    values = {
        "w": spec.w,
        "window": spec.timing.window,
        "lookback": spec.timing.gpu_lost_lookback,
        "exporter_selector": spec.exporter_selector,
    }
    for name, value in spec.thresholds.items():
        values[f"t.{name}"] = f"{value:g}"
        values[f"pct.{name}"] = f"{value * 100:g} %"
    if alert is not None:
        values["for"] = spec.timing.for_alert(alert)
    return values


def render_alert(spec: Spec, alert: Alert) -> dict[str, Any]:
    """The alert as a Prometheus rule mapping."""
    values = placeholders(spec, alert)
    return {
        "alert": alert.name,
        "expr": alert.promql(values),
        "for": spec.timing.for_alert(alert),
        "labels": {"severity": spec.severity(alert), "phase": alert.phase, "layer": alert.layer},
        "annotations": {
            "summary": alert.summary % values,
            "description": alert.description % values,
            "runbook_url": spec.runbook_url_base + alert.name + ".md",
        },
    }
