"""The alert table: when each cause alert fires, what it says, where it points.

An :class:`Alert` is built from :class:`Cond` itions over :data:`~inferwatch.method.signals.SIGNALS`;
its PromQL, its local evaluation and its runbook all come from this one entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferwatch.method.signals import BASELINE95, INSTANCE, ITL, MODEL, QUEUE, SIGNALS, TTFT
from inferwatch.method.thresholds import THRESHOLDS

if TYPE_CHECKING:
    from inferwatch.method.spec import Spec


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
    layer: str  # compute, memory, communication, scheduling, system, availability, baseline
    for_default: str
    summary: str
    description: str
    when: tuple[Cond, ...] = ()
    any_of: tuple[Cond, ...] = ()
    unless: tuple[Cond, ...] = ()
    # Says what users see, not why: the client's view (the canary's alerts), which the
    # server-side causes found with it explain; ``diagnose`` and the verdict list it after.
    symptom: bool = False

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
    ``foo{quantile="0.95"}``), possibly inside functions (``count(last_over_time(foo[6h]))``),
    or an expression over several (:func:`_mean`): the matchers go on every metric name.
    ``fmt`` is a template function applied to the value, or ``label "name"`` to print one of
    the series' labels instead. ``match_model=False`` matches on instance and job only
    (series without a model label).
    """
    pipe = fmt if fmt.startswith("label ") else f"value | {fmt}"
    part = r"(?:[a-zA-Z0-9_:]|%\(\w+\)s)"  # a name character, or a %(w)s placeholder
    metric = re.compile(rf"{part}*inferwatch_{part}+(\{{[^}}]*\}})?")
    if level == INSTANCE:
        labels = 'instance="%%s",job="%%s"' + (',model="%%s"' if match_model else "")
        args = "$labels.instance $labels.job" + (" $labels.model" if match_model else "")
    else:
        labels = 'namespace="%%s",backend="%%s",model="%%s"'
        args = "$labels.namespace $labels.backend $labels.model"

    def with_labels(match: re.Match) -> str:
        name, extra = match.group(0).partition("{")[::2]
        return f"{name}{{{labels}{',' + extra.rstrip('}') if extra else ''}}}"

    query, count = metric.subn(with_labels, selector)
    assert count, selector
    return (
        f"{{{{ with printf `{query}` {' '.join([args] * count)} | query }}}}"
        f"{{{{ . | first | {pipe} }}}}{{{{ else }}}}n/a{{{{ end }}}}"
    )


def _mean(numerator: str, denominator: str = "") -> str:
    """A description's mean over the rate window, read when the alert is active: a
    histogram's (its rate of sum over rate of count), or one counter's rate over another's."""
    num, den = (
        (numerator, denominator) if denominator else (f"{numerator}_sum", f"{numerator}_count")
    )
    return f"sum(rate({num}[%(window)s])) / sum(rate({den}[%(window)s]))"


NUM = 'printf "%%.3g"'  # plain numbers (rates, ratios): 0.1, not humanize's "100m"


def _probes(result: str) -> str:
    """The canary's probes with this result over the window, for an annotation."""
    return f'sum(increase(inferwatch_canary_probes_total{{result="{result}"}}[%(window)s]))'


P95, P99, P50 = '{quantile="0.95"}', '{quantile="0.99"}', '{quantile="0.5"}'


# The alert table, in the order of the rules file. Short names for the series it quotes:
I, M = INSTANCE, MODEL  # noqa: E741 (short level names keep the templates readable)
ittft, iitl = (f"instance:inferwatch_{h}" for h in (TTFT, ITL))
ALERTS: dict[str, Alert] = {
    a.name: a
    for a in (
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
            "(threshold %(t.ttft_p95_seconds)ss) and requests spend "
            + _q(f"model:inferwatch_{QUEUE}:mean_per_ttft_mean_%(w)s", M, "humanizePercentage")
            + " of their mean TTFT waiting to be scheduled: the fleet lacks capacity.",
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
            + _q(_mean(f"inferwatch_{QUEUE}"), I, "humanizeDuration")
            + " and inter-token latency p95 is a normal "
            + _q(f"{iitl}:quantile_%(w)s{P95}", I, "humanizeDuration")
            + ". Prompts take long to compute: mean prompt "
            + _q(_mean("inferwatch_request_prompt_tokens"), I)
            + " tokens, prefix-cache hit ratio "
            + _q(
                _mean(
                    "inferwatch_prefix_cache_hits_total", "inferwatch_prefix_cache_queries_total"
                ),
                I,
                "humanizePercentage",
            )
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
            + _q(_mean("inferwatch_engine_step_tokens"), I)
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
            + _q(_mean("inferwatch_engine_step_tokens"), I)
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
            "InferenceClientGap",
            "warning",
            I,
            "any",
            "system",
            "5m",
            "The path to {{ $labels.instance }} adds {{ $value | humanizeDuration }} to the "
            "first token",
            "The canary's first tokens from {{ $labels.model }} arrive {{ $value | "
            "humanizeDuration }} later than the server's own TTFT says (medians over the last "
            "%(window)s; threshold %(t.client_gap_seconds)ss; the server's mean TTFT "
            + _q(_mean(f"inferwatch_{TTFT}"), I, "humanizeDuration")
            + "). The time is spent between the client and the engine: the network, an ingress "
            "or gateway, the API server's HTTP handling and tokenization, or SSE framing.",
            when=(Cond("canary_ttft_gap", ">", "client_gap_seconds"),),
            symptom=True,
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
            "InferenceCanaryFailing",
            "critical",
            I,
            "any",
            "availability",
            "5m",
            "The canary's requests to {{ $labels.instance }} fail while the server reports up",
            "{{ $value | humanizePercentage }} of the canary's probes of {{ $labels.model }} "
            "failed over the last %(window)s (threshold %(pct.canary_failure_ratio)s) while the "
            "server's /metrics answers: "
            + _q(_probes("timeout"), I, NUM)
            + " timed out, "
            + _q(_probes("http_error"), I, NUM)
            + " got an HTTP error, "
            + _q(_probes("connect_error"), I, NUM)
            + " could not connect. Users on the same path (ingress, gateway, authentication, the "
            "API server) fail too; the sidecar's log names each kind of failure.",
            when=(
                Cond("canary_failure_ratio", ">", "canary_failure_ratio"),
                Cond("backend_up", "==", 1),
            ),
            symptom=True,
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
            + _q(f"inferwatch_baseline_{TTFT}{BASELINE95}", I, 'label "concurrency"')
            + "; threshold %(t.regression_factor)sx): TTFT p95 "
            + _q(f"{ittft}:quantile_%(w)s{P95}", I, "humanizeDuration")
            + " vs "
            + _q(f"inferwatch_baseline_{TTFT}{BASELINE95}", I, "humanizeDuration")
            + ", inter-token latency p95 "
            + _q(f"{iitl}:quantile_%(w)s{P95}", I, "humanizeDuration")
            + " vs "
            + _q(f"inferwatch_baseline_{ITL}{BASELINE95}", I, "humanizeDuration")
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
            "InferenceInterconnectSaturated",
            "warning",
            I,
            "any",
            "communication",
            "10m",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }}: a link runs near its peak",
            "GPU {{ $labels.gpu }} ({{ $labels.name }}) moved {{ $value | humanizePercentage }} "
            "of its NVLink (or, without NVLink traffic that high, PCIe) peak over the last "
            "%(window)s (threshold %(pct.link_share_high)s): the link, not compute or memory, "
            "sets the pace: tensor-parallel all-reduce between GPUs, or host transfers.",
            any_of=(
                Cond("nvlink_share", ">", "link_share_high"),
                Cond("pcie_share", ">", "link_share_high"),
            ),
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
    )
}

# Critical alerts about requests the server never counts (a dead server, a path to it that
# fails): no SLI sees them, so they page even where the SLOs do the paging.
OUTSIDE_THE_SLIS = ("InferenceBackendDown", "InferenceCanaryFailing")

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
