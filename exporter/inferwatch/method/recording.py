"""Recording rules: the rates, quantiles and ratios every alert and dashboard reads.

Named ``level:metric:operations`` (Prometheus' convention). Per instance they keep every
target label and drop the backend's data-parallel rank (``engine``); per model they keep
the fleet labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferwatch.method.signals import INSTANCE, MODEL
from inferwatch.method.spec import Spec


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


def _level(spec: Spec, level: str, extra: str = "") -> str:
    if level == INSTANCE:
        return f"without (engine{extra})"
    labels = ", ".join(spec.fleet_labels)
    return f"by ({labels})"


def recording_rules(spec: Spec) -> list[Record]:
    """Every recording rule, named ``level:metric:operations``."""
    out: list[Record] = []
    for level in (INSTANCE, MODEL):
        for hist in (*LATENCY_HISTOGRAMS, *SIZE_HISTOGRAMS):
            out += _histogram_rules(spec, level, hist)
        out += _counter_rules(spec, level)
    return out + _instance_rules(spec)


def _histogram_rules(spec: Spec, level: str, hist: str) -> list[Record]:
    """Rates of sum and count and the mean; for latencies also the buckets and quantiles."""
    w, window, by = spec.w, spec.timing.window, _level(spec, level)
    metric = f"inferwatch_{hist}"
    out = [
        Record(f"{level}:{metric}_{part}:{w}", f"sum {by} (rate({metric}_{part}[{window}]))")
        for part in ("sum", "count")
    ]
    out.append(
        Record(
            f"{level}:{metric}:mean_{w}",
            f"{level}:{metric}_sum:{w} / ({level}:{metric}_count:{w} > 0)",
        )
    )
    if hist in SIZE_HISTOGRAMS:
        return out
    by_le = by if level == INSTANCE else by.replace(")", ", le)")
    out.append(
        Record(f"{level}:{metric}_bucket:{w}", f"sum {by_le} (rate({metric}_bucket[{window}]))")
    )
    out += [
        Record(
            f"{level}:{metric}:quantile_{w}",
            f"histogram_quantile({q}, {level}:{metric}_bucket:{w})",
            {"quantile": q},
        )
        for q in QUANTILES
    ]
    return out


def _counter_rules(spec: Spec, level: str) -> list[Record]:
    """Token and preemption rates, finished requests by reason, the prefix-cache hit ratio."""
    w, window, by = spec.w, spec.timing.window, _level(spec, level)
    out = []
    for counter in ("prompt_tokens", "generation_tokens", "preemptions"):
        metric = f"inferwatch_{counter}"
        out.append(Record(f"{level}:{metric}:{w}", f"sum {by} (rate({metric}_total[{window}]))"))
    finished = "inferwatch_requests_finished"
    by_reason = _level(spec, level, ", reason")
    out.append(
        Record(f"{level}:{finished}:{w}", f"sum {by_reason} (rate({finished}_total[{window}]))")
    )
    for reason in ("error", "abort"):
        out.append(
            Record(
                f"{level}:{finished}:{reason}_ratio_{w}",
                f'sum {by_reason} (rate({finished}_total{{reason="{reason}"}}[{window}]))\n'
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
    return out


def _instance_rules(spec: Spec) -> list[Record]:
    """Local signals: per instance only."""
    w, window = spec.w, spec.timing.window
    return [
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
