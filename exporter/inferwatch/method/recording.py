"""Recording rules: the rates, quantiles and ratios the alerts and the fleet dashboard read.

Named ``level:metric:operations`` (Prometheus' convention). Per instance they keep every
target label and drop the backend's data-parallel rank (``engine``); per model they keep
the fleet labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field

from inferwatch.method.router_signals import POOL_CAPACITY_USE, POOL_REPLICAS_NEEDED, POOL_ROLE
from inferwatch.method.signals import CAPACITY, CAPACITY_SUM, INSTANCE, MODEL
from inferwatch.method.slo.series import bucket_matcher
from inferwatch.method.spec import Spec
from inferwatch.metrics import WINDOW_QUANTILES


@dataclass(frozen=True)
class Record:
    record: str
    expr: str
    _: KW_ONLY
    labels: Mapping[str, str] = field(default_factory=dict)


# What is recorded: only what the alerts and the fleet dashboard read (alert descriptions
# query the rest while the alert is active, the triage dashboard when it is looked at). At
# fleet size a rule costs per series it reads and writes (bench/fleet.py): per model the
# histograms' buckets are added up across replicas; per instance the quantiles are the
# exporter's own (collect/window.py), copied.
TTFT = "inferwatch_time_to_first_token_seconds"
ITL = "inferwatch_inter_token_latency_seconds"
QUEUE = "inferwatch_request_queue_time_seconds"
SHARE = "mean_per_ttft_mean"  # the queue's share of TTFT: mean queue time / mean TTFT


def _level(spec: Spec, level: str, extra: str = "") -> str:
    if level == INSTANCE:
        return f"without (engine{extra})"
    labels = ", ".join(spec.fleet_labels)
    return f"by ({labels})"


def recording_rules(spec: Spec) -> list[Record]:
    """Every recording rule, named ``level:metric:operations``; instance rules first (the
    model's finished requests add up the instances' within the same evaluation)."""
    return [
        *_instance_latency(spec),
        _queue_share(spec, INSTANCE),
        *_counter_rules(spec, INSTANCE),
        *_instance_rules(spec),
        *_model_latency(spec),
        _queue_share(spec, MODEL),
        _deferred_share(spec),
        *_counter_rules(spec, MODEL),
        *_capacity_rules(spec),
    ]


def _deferred_share(spec: Spec) -> Record:
    """The share of the fleet's waiting requests held back by other than capacity."""
    window, by = spec.timing.window, _level(spec, MODEL)
    deferred, waiting = (
        f"sum {by} (avg_over_time(inferwatch_requests_{name}[{window}]))"
        for name in ("deferred", "waiting")
    )
    return Record(
        f"model:inferwatch_requests_deferred:share_{spec.rate_name}",
        _share(f"{deferred}\n  / ({waiting} > 0)"),
    )


def _capacity_rules(spec: Spec) -> list[Record]:
    """The fleet's measured capacity (its replicas' added up), and the replicas its traffic
    needs: the finished requests/s over one replica's capacity (for an autoscaler to target
    below 1 per replica: deploy/kubernetes/autoscaling); per pool of a disaggregated model, the
    share of the pool's capacity in use and the replicas the pool needs."""
    w, by = spec.rate_name, _level(spec, MODEL)
    pool = by.replace(")", ", role)")

    def per_pool(series: str) -> str:
        return f"(\n    {series}\n    * on (instance, job) group_left (role)\n    {POOL_ROLE}\n  )"

    finished, capacity = per_pool(f"instance:inferwatch_requests_finished:{w}"), per_pool(CAPACITY)
    return [
        Record(CAPACITY_SUM, f"sum {by} ({CAPACITY})"),
        Record(
            f"model:inferwatch_replicas_needed:{w}",
            f"model:inferwatch_requests_finished:{w}\n  / (avg {by} ({CAPACITY}) > 0)",
        ),
        # A disaggregated model's pools, each on its own (the two do different work).
        Record(
            POOL_CAPACITY_USE % {"w": w},
            f"sum {pool} {finished}\n  / (sum {pool} {capacity} > 0)",
        ),
        Record(
            POOL_REPLICAS_NEEDED % {"w": w},
            f"sum {pool} {finished}\n  / (avg {pool} {capacity} > 0)",
        ),
    ]


def _quantiles(name: str, buckets: str) -> list[Record]:
    return [
        Record(name, f"histogram_quantile({q}, {buckets})", labels={"quantile": q})
        for q in WINDOW_QUANTILES
    ]


def _instance_latency(spec: Spec) -> list[Record]:
    """ITL's p50/p95/p99 (the tail's description shows p50 and p99) and TTFT's p95: the exporter's
    quantiles over the same window, under the names the rules and dashboards read."""
    w = spec.rate_name
    return [
        Record(f"instance:{ITL}:quantile_{w}", "inferwatch_inter_token_latency_window_seconds"),
        Record(
            f"instance:{TTFT}:quantile_{w}",
            'inferwatch_time_to_first_token_window_seconds{quantile="0.95"}',
        ),
    ]


def _model_latency(spec: Spec) -> list[Record]:
    """TTFT and ITL bucket rates across replicas and their p50/p95/p99."""
    w, window, by = spec.rate_name, spec.timing.window, _level(spec, MODEL)
    by_le = by.replace(")", ", le)")
    out = []
    for metric in (TTFT, ITL):
        buckets = f"model:{metric}_bucket:{w}"
        out.append(Record(buckets, f"sum {by_le} (rate({metric}_bucket[{window}]))"))
        out += _quantiles(f"model:{metric}:quantile_{w}", buckets)
    return out


def _mean(spec: Spec, level: str, metric: str) -> str:
    """Rate of the sum over rate of the count."""
    window, by = spec.timing.window, _level(spec, level)
    return (
        f"sum {by} (rate({metric}_sum[{window}]))\n"
        f"  / (sum {by} (rate({metric}_count[{window}])) > 0)"
    )


def _share(expr: str) -> str:
    """A share is at most 1 (see ``Window.signal``): a queue timed apart from TTFT can
    outlast it, and a counter of seconds can gain a stall's first seconds at once."""
    return f"clamp_max(\n  {expr},\n  1\n)"


def _share_above(spec: Spec, metric: str, bound: float) -> str:
    """The share of a histogram's observations above one of its bucket bounds, counted."""
    window = spec.timing.window
    return (
        f"clamp_min(\n  1 - sum without (engine, le) "
        f"(rate({metric}_bucket{{{bucket_matcher(bound)}}}[{window}]))\n"
        f"  / (sum without (engine) (rate({metric}_count[{window}])) > 0),\n  0\n)"
    )


def _queue_share(spec: Spec, level: str) -> Record:
    """Mean queue time over mean TTFT, in one rule (the means alone are only described)."""
    return Record(
        f"{level}:{QUEUE}:{SHARE}_{spec.rate_name}",
        _share(f"({_mean(spec, level, QUEUE)})\n  / ({_mean(spec, level, TTFT)})"),
    )


def _counter_rules(spec: Spec, level: str) -> list[Record]:
    """Finished requests (all reasons); per instance also the token and preemption rates, per
    model the error and abort shares."""
    w, window, by = spec.rate_name, spec.timing.window, _level(spec, level)
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
    return out


def _instance_rules(spec: Spec) -> list[Record]:
    """Local signals: per instance only."""
    w, window = spec.rate_name, spec.timing.window
    return [
        # Judged per engine (a data-parallel pod's hung engine is not averaged away); the
        # instance's share is its worst engine's.
        Record(
            f"instance:inferwatch_queued_while_idle_seconds:{w}",
            _share(
                f"max without (engine) (rate(inferwatch_queued_while_idle_seconds_total[{window}]))"
            ),
        ),
        Record(
            f"instance:inferwatch_frontend_cpu_seconds:{w}",
            f"sum without (engine) (rate(inferwatch_frontend_cpu_seconds_total[{window}]))",
        ),
        Record(
            f"instance:{ITL}:share_above_tail_{w}",
            _share_above(spec, ITL, spec.threshold("itl_tail_bound_seconds")),
        ),
        Record(
            f"instance:inferwatch_server_cpu_wait_seconds:share_{w}",
            _share(
                f"rate(inferwatch_server_cpu_wait_seconds_total[{window}])\n"
                f"  / (rate(inferwatch_server_cpu_wait_seconds_total[{window}])\n"
                f"     + rate(inferwatch_server_cpu_seconds_total[{window}]) > 0)"
            ),
        ),
        Record(
            f"instance:inferwatch_gpu_busy_seconds:avg_{w}",
            _share(
                f"avg without (gpu, uuid, name) (rate(inferwatch_gpu_busy_seconds_total[{window}]))"
            ),
        ),
        Record(
            f"instance:{ITL}:mean_per_decode_floor_{w}",
            f"({_mean(spec, INSTANCE, ITL)})\n"
            "  / on (instance, job, backend, model) group_left max by (instance, job, backend, model) "
            "(inferwatch_decode_floor_seconds)",
        ),
    ]
