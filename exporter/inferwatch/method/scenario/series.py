"""A :class:`~inferwatch.method.scenario.workload.Replica` as the input series of a promtool
unit test: cumulative histogram buckets and counters growing at the stated rates, gauges
that move, the GPUs' busy time, links and health.
"""

from __future__ import annotations

from inferwatch.method.quantile import histogram_quantile
from inferwatch.method.scenario.workload import (
    CANARY_RESULTS,
    ITL_LE,
    KV_TRANSFER_LE,
    LATENCY_LE,
    NVLINK_PEAK,
    PCIE_PEAK,
    ROUTER_MODEL,
    SAMPLES,
    SERVED_MODEL,
    STEP,
    STEP_TOKENS_LE,
    TGI_LE,
    TOKEN_BUDGET,
    TOKENS_LE,
    TTFT_LE,
    Dist,
    Replica,
    Router,
)
from inferwatch.metrics import CANARY_TTFT_BOUNDS, WINDOW_QUANTILES


def labels(**pairs: str) -> str:
    """A series' label set as promtool writes it, names sorted."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items())) + "}"


def _counter(per_second: float) -> str:
    return f"0+{per_second * STEP:g}x{SAMPLES}"


def _gauge(values: tuple[float, ...]) -> str:
    return " ".join(f"{values[i % len(values)]:g}" for i in range(SAMPLES + 1))


def _series(metric: str, values: str, /, **pairs: str) -> dict:
    return {"series": metric + labels(**pairs), "values": values}


def _histogram(metric: str, target: dict, bounds: tuple, rate: float, dist: Dist) -> list[dict]:
    series = []
    for le in (*bounds, "+Inf"):
        share = 1.0 if le == "+Inf" else sum(s for ub, s in dist.shares.items() if ub <= le)
        series.append(_series(f"{metric}_bucket", _counter(rate * share), **target, le=str(le)))
    series.append(_series(f"{metric}_sum", _counter(rate * dist.mean), **target))
    series.append(_series(f"{metric}_count", _counter(rate), **target))
    return series


def _window(metric: str, pairs: dict, bounds: tuple, dist: Dist) -> list[dict]:
    """The exporter's quantiles of a histogram over the rate window (collect/window.py):
    those of the distribution, from the second sample on, as a rate has them."""
    cumulative = [(le, sum(s for ub, s in dist.shares.items() if ub <= le)) for le in bounds]
    buckets = [*cumulative, ("+Inf", 1.0)]
    return [
        _series(
            metric,
            f"_ {histogram_quantile(float(q), buckets):g}+0x{SAMPLES - 1}",
            **pairs,
            quantile=q,
        )
        for q in WINDOW_QUANTILES
    ]


def _target_series(r: Replica, target: dict) -> list[dict]:
    """The scrape's own series and the sidecar's view of its backend and collectors."""
    info = {**target, "backend": r.backend, "model": SERVED_MODEL, "version": "0.32.0"}
    info |= {k: v for k, v in (("server", r.server), ("role", r.role)) if v is not None}
    return [
        _series("up", "1x40", **target),
        _series("inferwatch_backend_up", r.backend_up, **target, backend=r.backend),
        _series(
            "inferwatch_backend_scrape_duration_seconds",
            r.scrape_duration,
            **target,
            backend=r.backend,
        ),
        _series("inferwatch_collector_success", r.gpu_collector, **target, collector="gpu"),
        _series("inferwatch_backend_info", "1x40", **info),
    ]


def _engine_series(r: Replica, engine: dict, backend: dict) -> list[dict]:
    """The engine's gauges and counters, then the sidecar's per-backend counters; a series
    whose value is None is one the server does not have."""
    rate = r.requests_per_s
    prompt_rate = rate * r.prompt_tokens.mean
    gauges = (
        ("inferwatch_requests_running", r.running),
        ("inferwatch_requests_waiting", r.waiting),
        ("inferwatch_requests_deferred", r.deferred),
        ("inferwatch_kv_cache_usage_ratio", r.kv_usage),
        (
            "inferwatch_batch_reserved_tokens",
            r.token_budget_use and tuple(TOKEN_BUDGET * u for u in r.token_budget_use),
        ),
        ("inferwatch_batch_token_budget", r.token_budget_use and (TOKEN_BUDGET,)),
    )
    hits = None if r.prefix_hit_share is None else prompt_rate * r.prefix_hit_share
    counters = (
        ("inferwatch_preemptions_total", {}, r.preemptions_per_s),
        ("inferwatch_engine_steps_total", {}, r.steps_per_s),
        ("inferwatch_prompt_tokens_total", {}, prompt_rate),
        ("inferwatch_generation_tokens_total", {}, rate * r.generation_tokens_per_request),
        ("inferwatch_prefix_cache_queries_total", {}, hits and prompt_rate),
        ("inferwatch_prefix_cache_hits_total", {}, hits),
        (
            "inferwatch_kv_transfer_prompt_tokens_total",
            {},
            None
            if r.kv_transfer_prompt_share is None
            else prompt_rate * r.kv_transfer_prompt_share,
        ),
    )
    good = {"reason": r.finished_reason}
    counters += (
        ("inferwatch_requests_finished_total", good, rate * (1 - r.error_share)),
        ("inferwatch_requests_finished_total", {"reason": "error"}, rate * r.error_share),
    )
    out = [_series(name, _gauge(v), **engine) for name, v in gauges if v is not None]
    out += [
        _series(name, _counter(per_s), **engine, **extra)
        for name, extra, per_s in counters
        if per_s is not None
    ]
    out.append(
        _series(
            "inferwatch_queued_while_idle_seconds_total",
            _counter(r.queued_while_idle_share),
            **backend,
        )
    )
    if r.frontend_cpu_cores is not None:
        cpu = _counter(r.frontend_cpu_cores)
        out.append(_series("inferwatch_frontend_cpu_seconds_total", cpu, **backend))
    return out


def _histograms(r: Replica, engine: dict, backend: dict) -> list[dict]:
    """The latency and size histograms, and the exporter's window quantiles of latency."""
    rate = r.requests_per_s
    tokens_per_s = rate * r.generation_tokens_per_request
    queue_le = TGI_LE if r.backend == "tgi" else LATENCY_LE
    ttft, itl = "inferwatch_time_to_first_token", "inferwatch_inter_token_latency"
    out = []
    if r.ttft is not None:
        out += _histogram(f"{ttft}_seconds", engine, TTFT_LE, rate, r.ttft)
    out += _histogram("inferwatch_request_queue_time_seconds", engine, queue_le, rate, r.queue)
    if r.itl is not None:
        out += _histogram(f"{itl}_seconds", engine, ITL_LE, tokens_per_s, r.itl)
    if r.ttft is not None:
        out += _window(f"{ttft}_window_seconds", backend, TTFT_LE, r.ttft)
    if r.itl is not None:
        out += _window(f"{itl}_window_seconds", backend, ITL_LE, r.itl)
    out += _histogram("inferwatch_request_prompt_tokens", engine, TOKENS_LE, rate, r.prompt_tokens)
    if r.step_tokens is not None:
        metric = "inferwatch_engine_step_tokens"
        out += _histogram(metric, engine, STEP_TOKENS_LE, r.steps_per_s, r.step_tokens)
    for kind, dist in (r.step_seconds or {}).items():
        per_s = r.steps_per_s if kind == "decode" else rate
        metric = "inferwatch_engine_step_seconds"
        out += _histogram(metric, {**engine, "kind": kind}, TGI_LE, per_s, dist)
    if r.request_seconds is not None:
        metric = "inferwatch_request_duration_seconds"
        out += _histogram(metric, engine, TGI_LE, rate, r.request_seconds)
    return out


def _optional_series(r: Replica, backend: dict) -> list[dict]:
    """The decode floor, the baseline, its capacity and the canary, where the replica has
    them."""
    out = []
    if r.decode_floor is not None:
        out.append(_series("inferwatch_decode_floor_seconds", f"{r.decode_floor:g}x40", **backend))
    if r.baseline is not None:
        cell = {"percentile": "95", "concurrency": "8", "prompt_tokens": "800"}
        for metric, value in zip(
            ("time_to_first_token", "inter_token_latency"), r.baseline, strict=True
        ):
            out.append(
                _series(
                    f"inferwatch_baseline_{metric}_seconds",
                    f"{value:g}x40",
                    **backend,
                    **cell,
                    output_tokens="200",
                )
            )
    if r.capacity is not None:
        shape = {"prompt_tokens": "800", "output_tokens": "200"}
        metric = "inferwatch_baseline_capacity_requests_per_second"
        out.append(_series(metric, f"{r.capacity:g}x40", **backend, **shape))
    if r.canary_gap is not None:
        out.append(_series("inferwatch_canary_ttft_gap_seconds", r.canary_gap, **backend))
    if r.canary_ttft is not None:
        metric = "inferwatch_canary_time_to_first_token_seconds"
        out += _histogram(metric, backend, CANARY_TTFT_BOUNDS, 1 / 15, r.canary_ttft)
    for result in CANARY_RESULTS if r.canary_probes is not None else ():
        probes = _counter(r.canary_probes.get(result, 0.0))
        out.append(_series("inferwatch_canary_probes_total", probes, **backend, result=result))
    return out


def _kv_transfer_series(r: Replica, engine: dict) -> list[dict]:
    """The KV transfer's histogram and counters, on an instance of a prefill/decode pair."""
    kv = r.kv_transfer
    if kv is None:
        return []
    metric = "inferwatch_kv_transfer"
    out = _histogram(f"{metric}_seconds", engine, KV_TRANSFER_LE, kv.per_s, kv.seconds)
    counters = (
        ("bytes", kv.per_s * kv.bytes_each),
        ("failures", kv.failures_per_s),
        ("expired_requests", kv.expired_per_s),
    )
    out += [
        _series(f"{metric}_{name}_total", _counter(per_s), **engine)
        for name, per_s in counters
        if per_s is not None
    ]
    return out


def _server_cpu_series(r: Replica, target: dict) -> list[dict]:
    """The CPU under the server, where the sidecar reads it."""
    if r.server_cpu_cores is None:
        return []
    return [
        _series(f"inferwatch_{name}_total", _counter(per_second), **target)
        for name, per_second in (
            ("server_cpu_seconds", r.server_cpu_cores),
            ("server_cpu_wait_seconds", r.server_cpu_wait),
            ("node_cpu_pressure_seconds", r.node_cpu_pressure),
            ("server_cpu_throttled_seconds", r.server_cpu_throttled),
        )
    ]


def gpu_labels(instance: str, gpu: int) -> dict[str, str]:
    """The labels of a replica's GPU series: its index, a UUID of its own, an H100's name."""
    return {"gpu": str(gpu), "uuid": f"GPU-{instance[5]}{gpu}", "name": "NVIDIA H100 80GB HBM3"}


def _gpu_series(r: Replica, target: dict) -> list[dict]:
    """Each GPU's busy time, memory, throttling, links and health."""
    out = []
    for gpu, busy in enumerate(r.gpu_busy or ()):
        pairs = {**target, **gpu_labels(r.instance, gpu)}
        out.append(_series("inferwatch_gpu_busy_seconds_total", _counter(busy), **pairs))
        out.append(_series("inferwatch_gpu_memory_total_bytes", r.gpu_memory_total, **pairs))
        for reason in ("sw_power_cap", "hw_thermal_slowdown"):
            values = r.throttled.get(reason, "0x40") if gpu == 0 else "0x40"
            out.append(_series("inferwatch_gpu_clock_throttled", values, **pairs, reason=reason))
        out += _links(r, gpu, pairs)
        out += _health(r, gpu, pairs)
    return out


def _health(r: Replica, gpu: int, pairs: dict) -> list[dict]:
    """The GPU's ECC errors, row remapping and XID counters (GPU 0's as the replica says)."""
    ecc = "inferwatch_gpu_ecc_errors_total"
    out = [_series(ecc, "0x40", **pairs, error="corrected", counter="volatile")]
    out.append(
        _series(
            ecc, r.uncorrected_ecc if gpu == 0 else "0x40", **pairs, error="uncorrected",
            counter="volatile",
        )
    )  # fmt: skip
    pending = r.row_remap_pending if gpu == 0 else "0x40"
    out.append(_series("inferwatch_gpu_row_remap_pending", pending, **pairs))
    out.append(_series("inferwatch_gpu_row_remap_failed", "0x40", **pairs))
    for xid in ("13", "79"):  # 13: a program's fault (not the GPU's); 79: off the bus
        values = r.xid.get(xid, "0x40") if gpu == 0 else "0x40"
        out.append(_series("inferwatch_gpu_xid_errors_total", values, **pairs, xid=xid))
    return out


def _links(r: Replica, gpu: int, pairs: dict) -> list[dict]:
    """The GPU's NVLink counters and PCIe gauges by direction, with their peaks."""
    out = [_series("inferwatch_gpu_pcie_peak_bytes_per_second", _gauge((PCIE_PEAK,)), **pairs)]
    for direction in ("tx", "rx"):
        share = r.pcie_share if gpu == 0 and direction == "tx" else 0.1 * r.pcie_share
        out.append(
            _series(
                "inferwatch_gpu_pcie_bytes_per_second",
                _gauge((share * PCIE_PEAK,)),
                **pairs,
                direction=direction,
            )
        )
    if r.nvlink_share is None:
        return out
    out.append(
        _series("inferwatch_gpu_nvlink_peak_bytes_per_second", _gauge((NVLINK_PEAK,)), **pairs)
    )
    for direction in ("tx", "rx"):
        share = r.nvlink_share if gpu == 0 and direction == "rx" else 0.1
        out.append(
            _series(
                "inferwatch_gpu_nvlink_bytes_total",
                _counter(share * NVLINK_PEAK),
                **pairs,
                direction=direction,
            )
        )
    return out


def router_series(r: Router) -> list[dict]:
    """Every router series a sidecar next to a router would expose (the router names no
    model)."""
    router = {"instance": r.instance, "job": "inferwatch", "backend": r.backend}
    router |= {"model": ROUTER_MODEL}
    out = []
    for w in r.workers:
        pairs = {**router, "worker": w.url}
        out.append(
            _series("inferwatch_router_worker_requests_total", _counter(w.requests_per_s), **pairs)
        )
        succeeded = _counter(w.requests_per_s - w.failures_per_s)
        out.append(_series("inferwatch_router_worker_successes_total", succeeded, **pairs))
        if w.failures_per_s:
            failed = _counter(w.failures_per_s)
            out.append(_series("inferwatch_router_worker_failures_total", failed, **pairs))
        out.append(_series("inferwatch_router_worker_healthy", w.healthy, **pairs))
        out.append(_series("inferwatch_router_worker_circuit_state", w.circuit, **pairs))
    if r.duration is not None:
        answered = sum(w.requests_per_s - w.failures_per_s for w in r.workers)
        metric = "inferwatch_router_request_duration_seconds"
        out += _histogram(metric, router, TGI_LE, answered, r.duration)
    return out


def input_series(r: Replica | Router) -> list[dict]:
    """Every series inferwatch would expose for one replica, or one router."""
    if isinstance(r, Router):
        return router_series(r)
    target = {"instance": r.instance, "job": "inferwatch"}
    backend = {**target, "backend": r.backend, "model": SERVED_MODEL}
    engine = {**backend, "engine": "0"} if r.backend == "vllm" else backend
    return [
        *_target_series(r, target),
        *_engine_series(r, engine, backend),
        *_histograms(r, engine, backend),
        *_optional_series(r, backend),
        *_kv_transfer_series(r, engine),
        *_server_cpu_series(r, target),
        *_gpu_series(r, target),
    ]
