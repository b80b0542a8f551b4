"""Every signal means the same in its two forms: the PromQL of the rules and the local recipe.

``diagnose --exporter`` computes each signal of the heuristics spec from two scrapes of one
exporter (``Signal.local``, evaluated by :class:`inferwatch.method.local.Window`); the rules and
``diagnose --prometheus`` compute it in PromQL over the recording rules (``Signal.promql``).
Here both run over the same series: the pages of one exporter in front of a data-parallel
server (two engines) on two GPUs, every engine and GPU with its own values, rendered by the
exporter's own renderer every 10 s over 50 s. The local form reads the first and the last
page; promtool feeds all six pages to the generated rules (rate window 50 s, so ``rate()``
spans exactly the two pages the local form reads) and evaluates each signal's PromQL.

The series move at a constant slope (gauges linearly, or a flag that turns on half-way),
so ``rate()`` is the increase over the interval and ``avg_over_time()`` the mean of the
first and last samples: what the local recipe computes from its two pages.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from inferwatch.collect.backends import BACKENDS
from inferwatch.collect.canary import CanarySample
from inferwatch.collect.server_cpu import ServerCpuSample
from inferwatch.collect.textparse import read_page
from inferwatch.collect.window import SUMMARIZED, LatencyWindow
from inferwatch.method.local import Samples, Window
from inferwatch.method.router_signals import FLEET_SIGNALS, ROUTER_SIGNALS
from inferwatch.method.rules import dump_yaml, placeholders, rules_document
from inferwatch.method.signals import SIGNALS, expression
from inferwatch.method.spec import spec_from_config
from inferwatch.metrics import WINDOW_QUANTILES
from inferwatch.model import (
    BackendSample,
    CollectorStatus,
    Derived,
    GpuHealth,
    GpuSample,
    Histogram,
    Labels,
    Snapshot,
)
from inferwatch.serve.exposition import render

from conftest import fixture_text, promtool_series

STEP_SECONDS = 10
STEPS = 5  # six pages, at 0, 10, ..., 50 s
WINDOW_SECONDS = STEP_SECONDS * STEPS
# The router counters a worker's failure share reads.
TRIES, SUCCESSES = (
    "inferwatch_router_worker_requests_total",
    "inferwatch_router_worker_successes_total",
)
SPEC = spec_from_config(
    {"alerting": {"rate_window": f"{WINDOW_SECONDS}s", "evaluation_interval": f"{STEP_SECONDS}s"}}
)
TARGET = {"instance": "10.0.0.7:10177", "job": "inferwatch"}  # what Prometheus attaches
MODEL = "llama-3-70b"
ENGINES = ("0", "1")

# Per engine: gauges (first page, last page) and counters (per second).
RUNNING = {"0": (4.0, 8.0), "1": (12.0, 6.0)}
KV_USAGE = {"0": (0.2, 0.6), "1": (0.9, 0.7)}
WAITING = {"0": (0.0, 2.0), "1": (3.0, 1.0)}
# Of the waiting, those held back by other than capacity (a grammar, a KV transfer).
DEFERRED = {"0": (0.0, 1.0), "1": (2.0, 0.0)}
# A server that admits by a token budget: tokens reserved (first, last page) of a budget.
RESERVED_TOKENS = {"0": (9000.0, 15000.0), "1": (12000.0, 14000.0)}
TOKEN_BUDGET = {"0": (16000.0, 16000.0), "1": (16000.0, 16000.0)}
PREEMPTIONS = {"0": 0.1, "1": 0.3}
PROMPT_TOKENS = {"0": 800.0, "1": 1200.0}
GENERATION_TOKENS = {"0": 150.0, "1": 90.0}
ENGINE_STEPS = {"0": 40.0, "1": 30.0}
FINISHED = {  # reason -> engine -> requests/s
    "stop": {"0": 2.0, "1": 1.0},
    "length": {"0": 0.5, "1": 0.25},
    "error": {"0": 0.1, "1": 0.0},
    "abort": {"0": 0.0, "1": 0.05},
}
KV_FAILURES = {"0": 0.04, "1": 0.1}  # KV transfers failed per second
# Of the prompt tokens, those whose KV arrived by transfer (the pod is a decode instance).
KV_PROMPT_TOKENS = {"0": 600.0, "1": 900.0}
KV_EXPIRED = {"0": 0.02, "1": 0.0}  # requests whose KV expired unfetched, per second
QUEUED_WHILE_IDLE = {"0": 0.05, "1": 0.2}  # seconds per second
DECODE_FLOOR = {"0": 0.004, "1": 0.006}
FRONTEND_CPU = 0.7  # cores (one API server for both engines)
SERVER_CPU = (1.6, 0.4)  # the server's threads: CPU seconds, run-queue wait, per second
# Histograms: observations per second in each bucket (not cumulative), and their mean.
HISTOGRAMS = {
    "time_to_first_token_seconds": (
        ("0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf"),
        {
            "0": ((0.5, 1.0, 0.5, 0.3, 0.1, 0.05, 0.0), 0.45),
            "1": ((0, 0.2, 0.3, 0.5, 0.6, 0.2, 0.1), 1.9),
        },
    ),
    "inter_token_latency_seconds": (
        ("0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "+Inf"),
        {"0": ((20, 60, 40, 15, 8, 2, 0), 0.04), "1": ((5, 30, 25, 20, 6, 3, 1), 0.07)},
    ),
    "request_queue_time_seconds": (
        ("0.01", "0.1", "0.5", "1.0", "5.0", "+Inf"),
        {"0": ((1.0, 0.8, 0.4, 0.2, 0.05, 0.0), 0.12), "1": ((0.2, 0.5, 0.4, 0.3, 0.2, 0.0), 0.6)},
    ),
    "kv_transfer_seconds": (
        ("0.05", "0.1", "0.5", "+Inf"),
        {"0": ((0.6, 0.8, 0.3, 0.1), 0.12), "1": ((0.2, 0.5, 0.4, 0.1), 0.2)},
    ),
    "request_duration_seconds": (
        ("1.0", "5.0", "20.0", "+Inf"),
        {"0": ((0.5, 1.2, 0.8, 0.1), 6.0), "1": ((0.2, 0.4, 0.6, 0.1), 9.0)},
    ),
}
# The engines' step durations by kind (a server that times its steps, as TGI does).
ENGINE_STEP_SECONDS = {
    "decode": (
        ("0.01", "0.025", "0.05", "0.1", "+Inf"),
        {"0": ((10, 25, 4, 1, 0), 0.02), "1": ((6, 20, 10, 3, 1), 0.03)},
    ),
    "prefill": (
        ("0.05", "0.1", "0.5", "+Inf"),
        {"0": ((1.0, 0.5, 0.2, 0.0), 0.08), "1": ((0.4, 0.6, 0.3, 0.1), 0.2)},
    ),
}
# Per GPU (GPU k runs engine k): busy seconds per second, and one throttle flag that turns
# on half-way (off on the first three pages, on on the last three: avg_over_time 0.5).
GPU_BUSY = {0: 0.5, 1: 0.3}
THERMAL_FROM_STEP = {0: 3, 1: None}
BASELINE = {"time_to_first_token_seconds": 0.9, "inter_token_latency_seconds": 0.035}
# The baseline's capacity at the measured shape nearest the live one (requests/s).
CAPACITY = 7.5
CAPACITY_SHAPE = (
    ("backend", "vllm"),
    ("model", MODEL),
    ("prompt_tokens", "512"),
    ("output_tokens", "128"),
)

# The canary: probes per second by result, and its TTFT gap (first page, last page).
CANARY_PROBES = {"ok": 0.2, "http_error": 0.02, "timeout": 0.05, "connect_error": 0.0}
CANARY_GAP = (0.02, 0.3)

# Per GPU and direction (both GPUs on one link type: the same peaks): NVLink bytes per
# second (counters), PCIe bytes per second (gauges, first page and last page).
NVLINK_PEAK, PCIE_PEAK = 4.78e11, 6.3e10
NVLINK = {0: {"tx": 2.0e11, "rx": 3.1e11}, 1: {"tx": 0.9e11, "rx": 1.2e11}}
PCIE = {0: {"tx": (1e9, 3e9), "rx": (2e9, 2e9)}, 1: {"tx": (4e9, 8e9), "rx": (5e8, 1e9)}}

# Signals judged per GPU and reason (the alert names which): the local recipe is the worst
# series', which is what an alert on any of them reduces to for one exporter.
PER_SERIES = {
    "gpu_throttled": 2,
    "nvlink_share": 2,
    "pcie_share": 2,
    "gpu_uncorrected_ecc_rate": 2,
    "gpu_xid_rate": 2,
    "gpu_row_remap_pending": 2,
    "gpu_row_remap_failed": 2,
    "gpu_retired_pages_pending": 2,
}

# Per GPU: uncorrected ECC errors per second, XID 79 and XID 13 events per second (13 is a
# program's fault: not counted), and the remap and retirement flags (first page, last page).
UNCORRECTED_ECC = {0: 0.0, 1: 0.05}
XID_EVENTS = {0: {"79": 0.02, "13": 0.5}, 1: {"79": 0.0, "13": 0.0}}
REMAP_PENDING = {0: (0.0, 1.0), 1: (0.0, 0.0)}
REMAP_FAILED = {0: (0.0, 0.0), 1: (0.0, 1.0)}
RETIRED_PENDING = {0: (0.0, 0.0), 1: (1.0, 1.0)}


def _line(first_last: tuple[float, float], step: int) -> float:
    first, last = first_last
    return first + (last - first) * step / STEPS


def _counter(per_second: float, step: int) -> float:
    """A counter that started a minute before the first page."""
    return per_second * (60 + step * STEP_SECONDS)


def _engine(engine: str, *extra: tuple[str, str]) -> Labels:
    return (("model", MODEL), ("engine", engine), *extra)


def _histogram(
    bounds: tuple[str, ...], per_bucket: Iterable[float], mean: float, step: int
) -> Histogram:
    cumulative, total = [], 0.0
    for per_second in per_bucket:
        total += _counter(per_second, step)
        cumulative.append(total)
    return Histogram(tuple(zip(bounds, cumulative, strict=True)), total * mean, total)


def backend_sample(step: int) -> BackendSample:
    """What the exporter's backend module reads from the server at ``step * STEP_SECONDS``."""

    def per_engine(make: Callable[[str], float]) -> dict[Labels, float]:
        return {_engine(e): make(e) for e in ENGINES}

    values: dict[str, dict[Labels, float]] = {
        "requests_running": per_engine(lambda e: _line(RUNNING[e], step)),
        "requests_waiting": per_engine(lambda e: _line(WAITING[e], step)),
        "requests_deferred": per_engine(lambda e: _line(DEFERRED[e], step)),
        "kv_cache_usage_ratio": per_engine(lambda e: _line(KV_USAGE[e], step)),
        "batch_reserved_tokens": per_engine(lambda e: _line(RESERVED_TOKENS[e], step)),
        "batch_token_budget": per_engine(lambda e: _line(TOKEN_BUDGET[e], step)),
        "preemptions": per_engine(lambda e: _counter(PREEMPTIONS[e], step)),
        "prompt_tokens": per_engine(lambda e: _counter(PROMPT_TOKENS[e], step)),
        "generation_tokens": per_engine(lambda e: _counter(GENERATION_TOKENS[e], step)),
        "engine_steps": per_engine(lambda e: _counter(ENGINE_STEPS[e], step)),
        "kv_transfer_failures": per_engine(lambda e: _counter(KV_FAILURES[e], step)),
        "kv_transfer_expired_requests": per_engine(lambda e: _counter(KV_EXPIRED[e], step)),
        "kv_transfer_prompt_tokens": per_engine(lambda e: _counter(KV_PROMPT_TOKENS[e], step)),
        "requests_finished": {
            _engine(e, ("reason", reason)): _counter(rates[e], step)
            for reason, rates in FINISHED.items()
            for e in ENGINES
        },
        "frontend_cpu_seconds": {(("model", MODEL),): _counter(FRONTEND_CPU, step)},
    }
    histograms = {
        name: {_engine(e): _histogram(bounds, *per[e], step) for e in ENGINES}
        for name, (bounds, per) in HISTOGRAMS.items()
    }
    histograms["engine_step_seconds"] = {
        _engine(e, ("kind", kind)): _histogram(bounds, *per[e], step)
        for kind, (bounds, per) in ENGINE_STEP_SECONDS.items()
        for e in ENGINES
    }
    return BackendSample("vllm", MODEL, "0.32.0", values, histograms)


def _latency_windows() -> list[dict[str, dict[Labels, float]]]:
    """The exporter's latency quantiles at each page, from its own polls (one per page)."""
    window = LatencyWindow(WINDOW_SECONDS)
    return [window.update(step * STEP_SECONDS, backend_sample(step)) for step in range(STEPS + 1)]


LATENCY_WINDOWS = _latency_windows()


def snapshot(step: int) -> Snapshot:
    """The exporter's snapshot at ``step * STEP_SECONDS``."""
    gpus = tuple(
        GpuSample(
            index=k,
            uuid=f"GPU-{k}",
            name="NVIDIA H100 80GB HBM3",
            utilization_ratio=busy,
            busy_seconds_total=_counter(busy, step),
            memory_bandwidth_peak_bytes_per_second=3.35e12,
            clock_throttled={
                "hw_thermal_slowdown": THERMAL_FROM_STEP[k] is not None
                and step >= THERMAL_FROM_STEP[k],
                "sw_power_cap": True,  # normal under load: not a throttle the rules count
            },
            pcie_bytes_per_second={d: _line(v, step) for d, v in PCIE[k].items()},
            pcie_peak_bytes_per_second=PCIE_PEAK,
            nvlink_bytes_total={d: _counter(v, step) for d, v in NVLINK[k].items()},
            nvlink_peak_bytes_per_second=NVLINK_PEAK,
            health=GpuHealth(
                ecc_errors_total={
                    ("uncorrected", "volatile"): _counter(UNCORRECTED_ECC[k], step),
                    ("corrected", "volatile"): _counter(3.0, step),
                },
                row_remap_pending=_line(REMAP_PENDING[k], step),
                row_remap_failed=_line(REMAP_FAILED[k], step),
                retired_pages_pending=_line(RETIRED_PENDING[k], step),
                xid_errors_total={x: _counter(v, step) for x, v in XID_EVENTS[k].items()},
            ),
        )
        for k, busy in GPU_BUSY.items()
    )
    vllm = (("backend", "vllm"),)
    baseline_cell = (
        *vllm,
        ("model", MODEL),
        ("concurrency", "16"),
        ("prompt_tokens", "512"),
        ("output_tokens", "128"),
        ("percentile", "95"),
    )
    return Snapshot(
        backend_kind="vllm",
        backend_up=True,
        backend_scrape_seconds=0.004,
        backend=backend_sample(step),
        role="decode",  # the decode side of a prefill/decode pair: its prompts' KV arrives
        collectors={"backend": CollectorStatus(True, 0.004), "gpu": CollectorStatus(True, 0.002)},
        gpus=gpus,
        derived=Derived(
            queued_while_idle={(*vllm, *_engine(e)): False for e in ENGINES},
            queued_while_idle_seconds_total={
                (*vllm, *_engine(e)): _counter(QUEUED_WHILE_IDLE[e], step) for e in ENGINES
            },
            decode_floor_seconds={(*vllm, *_engine(e)): DECODE_FLOOR[e] for e in ENGINES},
            latency_window=LATENCY_WINDOWS[step],
        ),
        baseline={
            **{f"baseline_{name}": {baseline_cell: value} for name, value in BASELINE.items()},
            "baseline_capacity_requests_per_second": {CAPACITY_SHAPE: CAPACITY},
        },
        sources={
            "server_cpu": ServerCpuSample(
                cpu_seconds=_counter(SERVER_CPU[0], step),
                wait_seconds=_counter(SERVER_CPU[1], step),
                threads=40,
                pressure_seconds=_counter(0.3, step),
                throttled_seconds=_counter(0.1, step),
                throttled_periods=_counter(2.0, step),
            ),
            "canary": CanarySample(
                model=MODEL,
                ttft=_histogram(("0.1", "+Inf"), (0.2, 0.0), 0.05, step),
                itl=_histogram(("0.01", "+Inf"), (2.0, 0.0), 0.008, step),
                e2e=_histogram(("0.5", "+Inf"), (0.2, 0.0), 0.2, step),
                probes={result: _counter(rate, step) for result, rate in CANARY_PROBES.items()},
                ttft_gap_seconds=_line(CANARY_GAP, step),
            ),
        },
    )


PAGES: list[Samples] = [read_page(render(snapshot(step)).decode()) for step in range(STEPS + 1)]
WINDOW = Window(PAGES[0], PAGES[-1], seconds=WINDOW_SECONDS, spec=SPEC)
# A router's, read off its own page (each worker's, and the router whole): the router test.
ROUTER_PAGE = {signal.name for signal in ROUTER_SIGNALS if signal.local is not None}
# The signals of one exporter next to a server.
LOCAL = {
    name: WINDOW.value(s.local)
    for name, s in SIGNALS.items()
    if s.local is not None and name not in ROUTER_PAGE
}


def promtool_tests(
    folder: Path, checks: dict[str, list[dict[str, Any]]], pages: list[Samples] = PAGES
) -> subprocess.CompletedProcess:
    """Runs one promtool test group per signal over the pages; returns promtool's result."""
    (folder / "rules.yaml").write_text(dump_yaml(rules_document(SPEC)))
    given = promtool_series(pages, TARGET)
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": f"{STEP_SECONDS}s",
        "tests": [
            {
                "name": name,
                "interval": f"{STEP_SECONDS}s",
                "input_series": given,
                "promql_expr_test": tests,
            }
            for name, tests in checks.items()
        ],
    }
    (folder / "signals_test.yaml").write_text(dump_yaml(doc))
    return subprocess.run(
        ["promtool", "test", "rules", "signals_test.yaml"],
        cwd=folder,
        capture_output=True,
        text=True,
    )


def _check(expr: str, value: float) -> dict[str, Any]:
    return {
        "expr": expr,
        "eval_time": f"{WINDOW_SECONDS}s",
        "exp_samples": [{"labels": "{}", "value": value}],
    }


PER_WORKER = {signal.name for signal in ROUTER_SIGNALS if signal.per == "worker"}


def test_the_synthetic_pod_gives_every_signal_a_value() -> None:
    missing = sorted(name for name, value in LOCAL.items() if value is None or math.isnan(value))
    assert missing == [], "the pages must give every local recipe a value"
    assert {n for n, s in SIGNALS.items() if s.local is None} == {
        "exporter_up",  # the exporter answering is the local form's premise
        "gpu_collection_recent",  # needs a look-back of hours
        # A fleet's: one exporter's pages show one replica, or a router without its replicas.
        *({s.name for s in (*ROUTER_SIGNALS, *FLEET_SIGNALS)} - ROUTER_PAGE),
    }


def _router_page(capture: str) -> Samples:
    sample = BACKENDS["vllm-router"].normalize(fixture_text(f"vllm-router-0.1.17{capture}.prom"))
    snap = Snapshot(
        backend_kind="vllm-router",
        backend_up=True,
        backend_scrape_seconds=0.001,
        backend=sample,
        collectors={"backend": CollectorStatus(True, 0.001)},
    )
    return read_page(render(snap).decode())


def test_a_routers_worker_signals_agree_in_promql_and_locally(tmp_path: Path) -> None:
    """Real vllm-router pages, healthy then with one replica down, the window apart: each
    worker's signals in both forms (the local one over that worker's series alone)."""
    healthy, one_down = _router_page(""), _router_page("-one-down")
    window = Window(healthy, one_down, seconds=WINDOW_SECONDS, spec=SPEC)
    values, checks = placeholders(SPEC), {}
    workers = sorted(window.label_values("worker", SIGNALS["router_worker_request_rate"].local))
    assert workers == ["http://127.0.0.1:18101", "http://127.0.0.1:18102"]
    for worker in workers:
        one = Window(healthy, one_down, seconds=WINDOW_SECONDS, spec=SPEC, scope={"worker": worker})
        for name in sorted(PER_WORKER):
            local = one.value(SIGNALS[name].local)
            assert local is not None, (name, worker)
            only = f'label_replace(vector(1), "worker", "{worker}", "", "")'
            promql = f"(({SIGNALS[name].promql % values}) and on (worker) {only})"
            checks[f"{name} {worker}"] = [
                _check(f"count({promql})", 1),
                _check(f"abs(max({promql}) - {local!r}) <= bool 1e-9", 1),
            ]
    # The dead replica: 13 tries since the healthy page, 4 answered; its check still passes.
    up = {"worker": workers[0]}
    dead = Window(healthy, one_down, WINDOW_SECONDS, SPEC, scope={"worker": workers[1]})
    assert dead.signal("router_worker_failure_share") == pytest.approx(9 / 13)
    # Its 9 failures are a series born on the second page: counted whole, as its tries were
    # counted on the first. A worker whose tries outrun its answers with no failure (its
    # requests in flight: long generations, the router's first traffic) fails none.
    answers = {"inferwatch_router_worker_successes_total": healthy[SUCCESSES]}
    in_flight = Window(healthy, {**one_down, **answers}, WINDOW_SECONDS, SPEC, scope=up)
    assert in_flight.signal("router_worker_failure_share") == 0.0
    # Where the tries were not counted at the window's start (a failed poll's page), a
    # failure series on the next page is no failure of this window.
    unpolled = {**healthy, TRIES: []}
    gap = Window(unpolled, one_down, WINDOW_SECONDS, SPEC, scope={"worker": workers[1]})
    assert gap.value(SIGNALS["router_worker_failure_share"].local.numerator) == 0.0
    # The counters stand still for five pages, then jump: rate() over the window is the
    # increase between the two pages, as the local form reads it.
    out = promtool_tests(tmp_path, checks, [healthy] * STEPS + [one_down])
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_signal_agrees_in_promql_and_locally(tmp_path: Path) -> None:
    values = placeholders(SPEC)
    checks = {}
    for name, local in LOCAL.items():
        assert local is not None
        promql = SIGNALS[name].promql % values
        tolerance = 1e-9 * max(1.0, abs(local))
        checks[name] = [
            _check(f"count({promql})", PER_SERIES.get(name, 1)),
            _check(f"abs(max({promql}) - {local!r}) <= bool {tolerance!r}", 1),
        ]
    out = promtool_tests(tmp_path, checks)
    if out.returncode != 0:
        # promtool names a failing test by its expression (Go's %q: JSON's quoting here).
        failed = [
            name
            for name, tests in checks.items()
            if any(json.dumps(t["expr"]) in out.stdout + out.stderr for t in tests)
        ]
        # What PromQL computed: the failing signals again, expecting the local value exactly.
        exact = {
            name: [_check(f"max({SIGNALS[name].promql % values})", LOCAL[name])] for name in failed
        }
        (tmp_path / "exact").mkdir()
        detail = promtool_tests(tmp_path / "exact", exact)
        pytest.fail(
            f"PromQL and local forms disagree for {failed or 'a signal'}; PromQL (got) against the "
            f"local value (exp):\n{detail.stdout}{detail.stderr}\npromtool:\n{out.stdout}{out.stderr}"
        )
    assert out.stdout.count("SUCCESS") == 1, out.stdout


# What a server without per-request latency histograms, KV-cache gauge or finish reasons
# (TGI) leaves of the same pod: the signals with a fallback are read off it.
LACKING = {"time_to_first_token_seconds", "inter_token_latency_seconds", "kv_cache_usage_ratio"}
LACKING_PAGES = [
    read_page(
        render(
            dataclasses.replace(
                snap,
                backend=dataclasses.replace(
                    snap.backend,
                    values={
                        k: v
                        for k, v in snap.backend.values.items()
                        if k not in LACKING | {"requests_finished"}
                    },
                    histograms={
                        k: v for k, v in snap.backend.histograms.items() if k not in LACKING
                    },
                ),
                derived=dataclasses.replace(snap.derived, latency_window={}),
            )
        ).decode()
    )
    for snap in map(snapshot, range(STEPS + 1))
]


def test_a_signal_without_its_series_reads_its_fallback_in_both_forms(tmp_path: Path) -> None:
    window = Window(LACKING_PAGES[0], LACKING_PAGES[-1], seconds=WINDOW_SECONDS, spec=SPEC)
    falling_back = [name for name, s in SIGNALS.items() if s.fallback is not None]
    readings = {name: window.reading(name) for name in falling_back}
    # Each one reads its fallback, which has a value, and the full pod reads itself.
    assert {name: read for name, (read, _) in readings.items()} == {
        name: SIGNALS[name].fallback for name in falling_back
    }
    assert all(value is not None for _, value in readings.values()), readings
    assert all(WINDOW.reading(name)[0] == name for name in falling_back)
    values = placeholders(SPEC)
    checks = {
        name: [
            _check(f"count({expression(name, values)})", 1),
            _check(
                f"abs(max({expression(name, values)}) - {value!r}) <= bool "
                f"{1e-9 * max(1.0, abs(value))!r}",
                1,
            ),
        ]
        for name, (_, value) in readings.items()
        if value is not None
    }
    out = promtool_tests(tmp_path, checks, LACKING_PAGES)
    assert out.returncode == 0, out.stdout + out.stderr
    # On the full pod the same expressions give the signals' own values.
    own = {
        name: [
            _check(
                f"abs(max({expression(name, values)}) - {LOCAL[name]!r}) <= bool "
                f"{1e-9 * max(1.0, abs(LOCAL[name]))!r}",
                1,
            )
        ]
        for name in falling_back
    }
    (tmp_path / "own").mkdir()
    out = promtool_tests(tmp_path / "own", own)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_exporters_latency_quantiles_are_prometheus_own(tmp_path: Path) -> None:
    """What the instance quantiles copy, computed by the exporter from its polls, equals what
    Prometheus computes from the raw buckets over the same window (two engines pooled)."""
    checks = {}
    for histogram, family in SUMMARIZED.items():
        for q in WINDOW_QUANTILES:
            ours = f'max(inferwatch_{family}{{quantile="{q}"}})'
            theirs = (
                f"max(histogram_quantile({q}, sum without (engine) "
                f"(rate(inferwatch_{histogram}_bucket[{WINDOW_SECONDS}s]))))"
            )
            checks[f"{family} {q}"] = [
                _check(f"count(inferwatch_{family}{{quantile='{q}'}})", 1),
                _check(f"abs({ours} - {theirs}) <= bool 1e-9", 1),
            ]
    out = promtool_tests(tmp_path, checks)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == 1, out.stdout


def test_gpu_busy_is_the_mean_over_the_gpus() -> None:
    # The case: GPUs 50 % and 30 % busy are 40 % busy, not 80 %.
    assert LOCAL["gpu_busy"] == pytest.approx(0.4)


def test_multi_engine_signals_combine_engines_as_the_rules_do() -> None:
    assert LOCAL["queued_while_idle_ratio"] == pytest.approx(0.2)  # the worst engine's
    assert LOCAL["kv_usage"] == pytest.approx(0.8)  # engine 1's mean over the window
    assert LOCAL["running"] == pytest.approx(6.0 + 9.0)  # both engines, mean over the window
    assert LOCAL["request_rate"] == pytest.approx(3.9)  # both engines, every reason
    assert LOCAL["gpu_throttled"] == pytest.approx(0.5)  # GPU 0, thermal, half the window


def test_the_itl_tail_is_counted_at_a_bucket_bound_or_not_at_all() -> None:
    # Above 0.5 s: engine 1's one gap per second in (0.5, +Inf] of the 235 both engines see.
    assert LOCAL["itl_tail_share"] == pytest.approx(1 / 235)
    # A bound that is none of the server's bucket bounds cannot be counted: no value (the
    # rule's bucket matcher finds no series either), never an interpolation.
    elsewhere = spec_from_config({"thresholds": {"itl_tail_bound_seconds": 0.3}})
    window = Window(PAGES[0], PAGES[-1], seconds=WINDOW_SECONDS, spec=elsewhere)
    assert window.signal("itl_tail_share") is None


def test_a_router_whole_agrees_in_promql_and_locally(tmp_path: Path) -> None:
    """The router whole, every worker added (the sparklines of the sidecar next to it), on
    real vllm-router pages from one replica down to its circuit open: both forms agree."""
    one_down, cb_open = _router_page("-one-down"), _router_page("-one-down-cb-open")
    window = Window(one_down, cb_open, seconds=WINDOW_SECONDS, spec=SPEC)
    values, checks = placeholders(SPEC), {}
    for name in sorted(ROUTER_PAGE - PER_WORKER):
        local = window.value(SIGNALS[name].local)
        assert local is not None, name
        promql = f"({SIGNALS[name].promql % values})"
        checks[name] = [
            _check(f"count({promql})", 1),
            _check(f"abs(max({promql}) - {local!r}) <= bool 1e-9", 1),
        ]
    # 6 tries since one-down (77 to 83), 5 answered; one retry; both workers still routed to.
    assert window.signal("router_failure_share") == pytest.approx(1 / 6)
    assert window.signal("router_retry_rate") == pytest.approx(1 / WINDOW_SECONDS)
    assert window.signal("router_workers_active") == 2
    out = promtool_tests(tmp_path, checks, [one_down] * STEPS + [cb_open])
    assert out.returncode == 0, out.stdout + out.stderr
