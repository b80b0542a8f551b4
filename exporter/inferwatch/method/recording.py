"""Recording rules: the rates, quantiles and ratios the alerts and the fleet dashboard read.

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


# What is recorded of the histograms: only what the alerts, their descriptions and the fleet
# dashboard read (the triage dashboard computes the rest from the raw buckets when it is
# looked at). At fleet size a recorded bucket series costs as much as a raw one, and each
# rate over raw buckets is most of an evaluation's work (bench/fleet.py).
TTFT = "inferwatch_time_to_first_token_seconds"
ITL = "inferwatch_inter_token_latency_seconds"
QUEUE = "inferwatch_request_queue_time_seconds"
QUANTILES = ("0.5", "0.95", "0.99")
# Means per instance (queue share, ITL over the decode floor, the descriptions' prompt length
# and batch size) and per model (queue share).
INSTANCE_MEANS = (
    TTFT,
    QUEUE,
    ITL,
    "inferwatch_request_prompt_tokens",
    "inferwatch_engine_step_tokens",
)
MODEL_MEANS = (TTFT, QUEUE)


def _level(spec: Spec, level: str, extra: str = "") -> str:
    if level == INSTANCE:
        return f"without (engine{extra})"
    labels = ", ".join(spec.fleet_labels)
    return f"by ({labels})"


def recording_rules(spec: Spec) -> list[Record]:
    """Every recording rule, named ``level:metric:operations``; instance rules first (the
    model's ITL buckets add up the instances' within the same evaluation)."""
    return [
        *_instance_latency(spec),
        *_means(spec, INSTANCE, INSTANCE_MEANS),
        *_counter_rules(spec, INSTANCE),
        *_instance_rules(spec),
        *_model_latency(spec),
        *_means(spec, MODEL, MODEL_MEANS),
        *_counter_rules(spec, MODEL),
    ]


def _quantiles(name: str, buckets: str, quantiles: tuple[str, ...] = QUANTILES) -> list[Record]:
    return [Record(name, f"histogram_quantile({q}, {buckets})", {"quantile": q}) for q in quantiles]


def _instance_latency(spec: Spec) -> list[Record]:
    """ITL's bucket rates and its p50/p95/p99 (the tail ratio needs all three); TTFT's p95
    straight from the raw buckets (its buckets are recorded per model only)."""
    w, window = spec.w, spec.timing.window
    itl_buckets = f"instance:{ITL}_bucket:{w}"
    return [
        Record(itl_buckets, f"sum without (engine) (rate({ITL}_bucket[{window}]))"),
        *_quantiles(f"instance:{ITL}:quantile_{w}", itl_buckets),
        *_quantiles(
            f"instance:{TTFT}:quantile_{w}",
            f"sum without (engine) (rate({TTFT}_bucket[{window}]))",
            ("0.95",),
        ),
    ]


def _model_latency(spec: Spec) -> list[Record]:
    """TTFT and ITL bucket rates across replicas (ITL's from the instances' rule) and their
    p50/p95/p99."""
    w, window, by = spec.w, spec.timing.window, _level(spec, MODEL)
    by_le = by.replace(")", ", le)")
    out = [
        Record(f"model:{TTFT}_bucket:{w}", f"sum {by_le} (rate({TTFT}_bucket[{window}]))"),
        Record(f"model:{ITL}_bucket:{w}", f"sum {by_le} (instance:{ITL}_bucket:{w})"),
    ]
    for metric in (TTFT, ITL):
        out += _quantiles(f"model:{metric}:quantile_{w}", f"model:{metric}_bucket:{w}")
    return out


def _means(spec: Spec, level: str, metrics: tuple[str, ...]) -> list[Record]:
    """Rate of the sum over rate of the count, in one rule each."""
    w, window, by = spec.w, spec.timing.window, _level(spec, level)
    return [
        Record(
            f"{level}:{metric}:mean_{w}",
            f"sum {by} (rate({metric}_sum[{window}]))\n"
            f"  / (sum {by} (rate({metric}_count[{window}])) > 0)",
        )
        for metric in metrics
    ]


def _counter_rules(spec: Spec, level: str) -> list[Record]:
    """Finished requests (all reasons); per instance also the token and preemption rates and
    the prefix-cache hit ratio, per model the error and abort shares."""
    w, window, by = spec.w, spec.timing.window, _level(spec, level)
    finished = "inferwatch_requests_finished"
    by_reason = _level(spec, level, ", reason")
    if level == MODEL:  # from the instances' rule, evaluated just before
        total = f"sum {by} (instance:{finished}:{w})"
    else:
        total = f"sum {by_reason} (rate({finished}_total[{window}]))"
    out = [Record(f"{level}:{finished}:{w}", total)]
    if level == MODEL:
        return out + [
            Record(
                f"{level}:{finished}:{reason}_ratio_{w}",
                f'sum {by_reason} (rate({finished}_total{{reason="{reason}"}}[{window}]))\n'
                f"  / ({level}:{finished}:{w} > 0)",
            )
            for reason in ("error", "abort")
        ]
    for counter in ("prompt_tokens", "generation_tokens", "preemptions"):
        metric = f"inferwatch_{counter}"
        out.append(Record(f"{level}:{metric}:{w}", f"sum {by} (rate({metric}_total[{window}]))"))
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
