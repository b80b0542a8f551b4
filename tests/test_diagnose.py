"""diagnose: the spec's conditions over two scrapes of an exporter, and its CLI.

The two pages are inferwatch's rendering of two real captures of one vLLM server, taken
during a burst that overflowed its KV cache and after it. Between them (taken as 10 s):
33 preemptions (3.3/s), 8 TTFT observations, 4 in (0.5, 0.75] s and 4 in (1, 2.5] s (p95
= 1 + 1.5 x (7.6 - 4) / 4 = 2.35 s), 24 queue-time observations with a mean of 0.2744 s
against a mean TTFT of 0.8575 s (a 32 % queue share), and an ITL p95 inside its first
bucket (under 10 ms).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from aiohttp import web

from inferwatch.collect.textparse import read_page
from inferwatch.method import slo
from inferwatch.method.alerts import ALERTS, RELATIONS
from inferwatch.method.findings import EXIT, Burn, Finding, Report, evaluate
from inferwatch.method.fleet import fleet_of
from inferwatch.method.local import Window
from inferwatch.method.signals import SIGNALS
from inferwatch.method.spec import spec_from_config
from inferwatch.model import GpuHealth, GpuSample
from inferwatch.tools.diagnose import EXIT_UNREADABLE
from inferwatch.tools.report import render, report_json

from conftest import exporter_page, fixture_text

LABELS = {"backend": "vllm", "model": "tiny"}


def page(fixture: str) -> str:
    return exporter_page(fixture_text(fixture))


DURING = page("vllm-0.32.0-cpu-loaded-kv-full.prom")
AFTER = page("vllm-0.32.0-cpu-after-preemptions.prom")
WINDOW = Window(read_page(DURING), read_page(AFTER), seconds=10.0)


def value(signal: str) -> float | None:
    return WINDOW.value(SIGNALS[signal].local)


def test_signals_over_the_window() -> None:
    assert value("preemption_rate") == pytest.approx(3.3)
    assert value("request_rate") == pytest.approx(2.4)  # 24 finished, reason "length"
    assert value("ttft_p95") == pytest.approx(2.35)
    assert value("queue_share") == pytest.approx(0.32, abs=0.001)
    assert value("itl_p95") < 0.01
    assert value("kv_usage") == 0.5  # avg_over_time: full during the burst, empty after
    assert value("gpu_busy") is None  # no NVML on these pages
    assert value("ttft_over_baseline") is None  # no baseline


def test_burst_reads_as_kv_pressure_with_a_slow_first_token() -> None:
    spec = spec_from_config({})
    findings = evaluate(WINDOW, spec, LABELS)
    assert [f.alert.name for f in findings] == ["InferenceKVCachePressure"]
    report = Report(
        "http://exporter:10177", "10.0s", spec, {"ttft_p95": 2.35, "itl_p95": 0.0096}, findings
    )
    text = render(report)
    assert "phase: prefill  (TTFT p95 2.35 s > 2 s; ITL p95 9.6 ms <= 100 ms)" in text
    assert "layer: memory" in text
    assert "WARNING  InferenceKVCachePressure  decode / memory  backend=vllm model=tiny" in text
    assert "KV-cache use 50 % > 90 %; or preemptions/s 3.3 > 0.02" in text
    assert "runbook: alerts/runbooks/InferenceKVCachePressure.md" in text
    assert report.exit_code() == 3


def test_same_conditions_as_the_rules_with_config_thresholds() -> None:
    # A 32 % queue share over a 2.35 s TTFT p95 is queueing once the threshold is 30 %.
    spec = spec_from_config({"thresholds": {"queue_share_high": 0.3}})
    names = {f.alert.name for f in evaluate(WINDOW, spec, LABELS)}
    assert names == {"InferenceKVCachePressure", "InferenceQueueingDelay"}


def test_a_finding_alertmanager_inhibits_is_listed_under_its_cause() -> None:
    spec = spec_from_config({})
    queueing = [
        Finding(ALERTS["InferenceQueueingDelay"], {"backend": "vllm", "model": m})
        for m in ("tiny", "other")
    ]
    stall = Finding(ALERTS["InferenceQueuedWhileIdle"], {"instance": "a:10177", "model": "tiny"})
    report = Report("x", "5m", spec, {"ttft_p95": None, "itl_p95": None}, [*queueing, stall])
    assert [(f.alert.name, f.labels["model"], f.explained_by) for f in report.findings] == [
        ("InferenceQueueingDelay", "other", None),  # another model: not the stall's doing
        ("InferenceQueuedWhileIdle", "tiny", None),
        ("InferenceQueueingDelay", "tiny", "InferenceQueuedWhileIdle"),  # right under it
    ]
    assert "explained by InferenceQueuedWhileIdle (inhibited in Alertmanager)" in render(report)
    assert [f["explained_by"] for f in report_json(report)["findings"]] == [
        None,
        None,
        "InferenceQueuedWhileIdle",
    ]


def test_a_failing_canary_is_listed_after_the_cause_yet_counts_as_critical() -> None:
    spec = spec_from_config({})
    pod = {"instance": "a:10177", "backend": "vllm", "model": "tiny"}
    canary = Finding(ALERTS["InferenceCanaryFailing"], pod, severity="critical")
    stall = Finding(ALERTS["InferenceQueuedWhileIdle"], pod)
    report = Report("x", "5m", spec, {"ttft_p95": None, "itl_p95": None}, [canary, stall])
    assert [f.alert.name for f in report.findings] == [
        "InferenceQueuedWhileIdle",  # why
        "InferenceCanaryFailing",  # what users see
    ]
    assert report.worst() == "critical" and report.exit_code() == 4


def test_a_burning_slo_without_a_cause_says_so_and_counts_for_the_exit_status() -> None:
    spec = spec_from_config({})
    tiny = {"namespace": "prod", "backend": "vllm", "model": "tiny"}
    errors = Burn("errors", tiny, [slo.SLOW], "warning", dict.fromkeys(("1h", "6h"), None))
    other = Finding(ALERTS["InferenceKVCachePressure"], {"instance": "b:10177", "model": "other"})
    report = Report("x", "5m", spec, {"ttft_p95": None, "itl_p95": None}, [other], [errors])
    text = render(report)
    # Judged with the defaults: the uncalibrated thresholds are named under the header.
    assert text.split("\n")[2].startswith("uncalibrated (defaults; the findings on them are info")
    assert text.split("\n")[4:9] == [
        "SLO burning: backend=vllm model=tiny namespace=prod",
        "WARNING  InferenceSLOSlowBurn  errors (server errors)",
        "         burn rate n/a over 1h, n/a over 6h; error budget remaining n/a",
        "         runbook: alerts/runbooks/InferenceSLOSlowBurn.md",
        "  causes: no alert condition of the heuristics spec holds for this model (see the "
        "triage dashboard)",
    ]
    assert text.index("SLO burning") < text.index("phase: ") < text.index("KVCachePressure")
    assert report.exit_code() == 3  # the slow burn's warning; the finding alone: also 3
    alone = Report("x", "5m", spec, {}, [], [errors])
    assert alone.exit_code() == 3 and "healthy" not in render(alone)
    assert report_json(report)["slos"] == [
        {
            "labels": tiny,
            "objectives": [
                {
                    "slo": "errors",
                    "severity": "warning",
                    "alerts": [slo.SLOW],
                    "burn_rates": {"1h": None, "6h": None},
                    "error_budget_remaining": None,
                    "runbook": "alerts/runbooks/InferenceSLOSlowBurn.md",
                }
            ],
            "causes": [],
        }
    ]
    assert [f["alert"] for f in report_json(report)["findings"]] == ["InferenceKVCachePressure"]


def test_burning_objectives_are_ranked_worst_first_per_model() -> None:
    spec = spec_from_config({})
    a, b = ({"backend": "vllm", "model": m} for m in ("a", "b"))
    burns = [
        Burn("errors", a, [slo.SLOW], "warning"),
        Burn("e2e", b, [slo.SLOW], "warning"),
        Burn("ttft", b, [slo.FAST, slo.SLOW], "critical"),
        Burn("itl", b, [slo.FAST], "critical"),
    ]
    report = Report("x", "5m", spec, {"ttft_p95": None, "itl_p95": None}, [], burns)
    heads = [line for line in render(report).split("\n") if line[:1].isupper()]
    assert heads[:6] == [
        "SLO burning: backend=vllm model=b",
        "CRITICAL InferenceSLOFastBurn, InferenceSLOSlowBurn  ttft (time to first token)",
        "CRITICAL InferenceSLOFastBurn  itl (inter-token latency)",
        "WARNING  InferenceSLOSlowBurn  e2e (end-to-end latency)",
        "SLO burning: backend=vllm model=a",
        "WARNING  InferenceSLOSlowBurn  errors (server errors)",
    ]
    assert report.exit_code() == 4


def test_a_quiet_window_is_healthy() -> None:
    quiet = Window(read_page(AFTER), read_page(AFTER), seconds=10.0)
    spec = spec_from_config({})
    report = Report(
        "x", "10.0s", spec, {"ttft_p95": None, "itl_p95": None}, evaluate(quiet, spec, LABELS)
    )
    assert report.findings == []
    assert report.exit_code() == 0
    assert "healthy: no alert condition of the heuristics spec holds" in render(report)
    assert report_json(report)["slos"] == []  # the key is always there


def diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inferwatch", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_cli_against_a_live_exporter_page(aiohttp_server) -> None:
    pages = iter([DURING, AFTER])

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=next(pages, AFTER), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    out = await asyncio.to_thread(diagnose, "--exporter", url, "--interval", "1")
    assert out.returncode == 3, out.stderr
    assert "WARNING  InferenceKVCachePressure" in out.stdout
    assert "phase: prefill" in out.stdout  # TTFT p95 2.35 s


def test_cli_unreachable_source_is_one_line_and_exit_5() -> None:
    out = diagnose("--exporter", "http://127.0.0.1:9", "--interval", "1")
    assert out.returncode == EXIT_UNREADABLE
    assert out.stderr.count("\n") == 1 and "cannot connect" in out.stderr


def test_cli_needs_exactly_one_source() -> None:
    out = diagnose()
    assert (
        out.returncode == 2
        and "one of the arguments --prometheus --exporter is required" in out.stderr
    )
    out = diagnose("--prometheus", "localhost:9090")
    assert out.returncode == 2 and "is not an http:// or https:// URL" in out.stderr


def test_a_series_missing_from_the_first_page_has_no_increase() -> None:
    # The first page is a failed poll's (no backend series): the counters' whole values
    # are not the window's increase (PromQL's increase needs two samples too).
    down = read_page('inferwatch_backend_up{backend="vllm"} 0\n')
    up = read_page(
        'inferwatch_backend_up{backend="vllm"} 1\n'
        'inferwatch_preemptions_total{backend="vllm",model="tiny"} 5000\n'
        'inferwatch_frontend_cpu_seconds_total{backend="vllm",model="tiny"} 900\n'
    )
    window = Window(down, up, 10.0)
    assert window.value(SIGNALS["preemption_rate"].local) is None
    assert window.value(SIGNALS["frontend_cpu"].local) is None
    later = read_page('inferwatch_preemptions_total{backend="vllm",model="tiny"} 5002\n')
    assert Window(up, later, 10.0).value(SIGNALS["preemption_rate"].local) == 0.2


def test_a_saturated_nvlink_is_the_communication_layer() -> None:
    """Two pages 10 s apart of a pod whose GPU received 90 % of its NVLink peak."""
    peak = 18 * 26.562e9  # an H100 SXM's 18 links, per direction

    def nvlink_page(received: float) -> str:
        gpu = GpuSample(
            0,
            "GPU-0",
            "NVIDIA H100 80GB HBM3",
            nvlink_bytes_total={"tx": 0.0, "rx": received},
            nvlink_peak_bytes_per_second=peak,
        )
        return exporter_page(fixture_text("vllm-0.32.0-cpu-after-preemptions.prom"), (gpu,))

    window = Window(read_page(nvlink_page(0.0)), read_page(nvlink_page(9 * peak)), seconds=10.0)
    assert window.value(SIGNALS["nvlink_share"].local) == pytest.approx(0.9)
    spec = spec_from_config({})
    report = Report("x", "10.0s", spec, {}, evaluate(window, spec, LABELS))
    assert [f.alert.name for f in report.findings] == ["InferenceInterconnectSaturated"]
    assert "layer: communication" in render(report)


def test_near_capacity_is_found_with_its_numbers_and_explains_the_queueing() -> None:
    """The burst's 2.4 finished requests/s against a baseline that carried 2.5 per replica."""

    def with_capacity(text: str, rate: float) -> str:
        gauge = "inferwatch_baseline_capacity_requests_per_second"
        shape = 'backend="vllm",model="tiny",prompt_tokens="64",output_tokens="64"'
        return f"{text}# TYPE {gauge} gauge\n{gauge}{{{shape}}} {rate}\n"

    spec = spec_from_config({"thresholds": {"queue_share_high": 0.3}})
    window = Window(
        read_page(with_capacity(DURING, 2.5)), read_page(with_capacity(AFTER, 2.5)), 10.0
    )
    assert window.value(SIGNALS["model_capacity_use"].local) == pytest.approx(0.96)
    report = Report("x", "10.0s", spec, {}, evaluate(window, spec, LABELS))
    found = {f.alert.name: f.explained_by for f in report.findings}
    # The burst's KV cache preempts: the capacity ticket is listed under it, and the
    # queueing under the deepest cause that explains it, never above.
    assert found["InferenceNearCapacity"] == "InferenceKVCachePressure"
    assert found["InferenceQueueingDelay"] == "InferenceNearCapacity"
    assert (
        "InferenceNearCapacity",
        (
            "InferenceQueueingDelay",
            "InferenceLatencyRegression",
            "InferencePrefillBottleneck",
            "InferenceDecodeBottleneck",
            "InferencePrefillStallsDecode",
        ),
        ("model",),
    ) in RELATIONS
    assert "share of the measured capacity in use (fleet) 96 % > 90 %" in render(report)
    # 10 % below the threshold: 2.4 of 3 requests/s, 80 %.
    calm = Window(read_page(with_capacity(DURING, 3)), read_page(with_capacity(AFTER, 3)), 10.0)
    assert "InferenceNearCapacity" not in {f.alert.name for f in evaluate(calm, spec, LABELS)}


def test_a_gpu_that_fell_off_the_bus_is_the_hardware_layer_and_pages() -> None:
    """Two pages 10 s apart of a pod whose GPU reported an XID 79 between them."""

    def gpu_page(xid_79: float) -> str:
        gpu = GpuSample(
            0,
            "GPU-0",
            "NVIDIA H100 80GB HBM3",
            health=GpuHealth(xid_errors_total={"79": xid_79, "13": 0.0}),
        )
        return exporter_page(fixture_text("vllm-0.32.0-cpu-after-preemptions.prom"), (gpu,))

    window = Window(read_page(gpu_page(0.0)), read_page(gpu_page(1.0)), seconds=10.0)
    assert window.value(SIGNALS["gpu_xid_rate"].local) == pytest.approx(0.1)
    spec = spec_from_config({})
    report = Report("x", "10.0s", spec, {}, evaluate(window, spec, LABELS))
    assert [f.alert.name for f in report.findings] == ["InferenceGPUFailing"]
    text = render(report)
    assert "layer: hardware" in text
    assert "CRITICAL InferenceGPUFailing  any / hardware" in text
    assert "XID errors that need attention/s (GPU) 0.1 > 0" in text
    assert report.exit_code() == EXIT["critical"]
    # An XID 13 is the program's fault: nothing.
    quiet = Window(read_page(gpu_page(0.0)), read_page(gpu_page(0.0)), seconds=10.0)
    assert not evaluate(quiet, spec, LABELS)


def test_the_fleet_view_compares_replicas_of_one_role() -> None:
    """Prefill instances a and b, decode instances c and d of one model: each role's
    replicas are one group; the waiting requests, read without the role, are found."""
    model = {"namespace": "prod", "backend": "vllm", "model": "tiny"}
    load = {"a": ("prefill", 18), "b": ("prefill", 2), "c": ("decode", 5), "d": ("decode", 5)}
    readings = {
        "in_flight": [({**model, "instance": i, "role": r}, v) for i, (r, v) in load.items()],
        "waiting": [({**model, "instance": i}, 1.0 if i == "a" else 0.0) for i in load],
    }
    fleet = fleet_of(readings, [], ("namespace", "backend", "model"))
    groups = {
        m.labels["role"]: [(r.labels["instance"], r.share, r.waiting) for r in m.replicas]
        for m in fleet.models
    }
    assert groups == {
        "prefill": [("a", 0.9, 1.0), ("b", 0.1, 0.0)],
        "decode": [("c", 0.5, 0.0), ("d", 0.5, 0.0)],
    }


def test_the_fleet_view_lists_the_capacity_ticket_under_its_model_not_a_replica() -> None:
    """Every replica near its capacity at once: the ticket is about the model across its
    replicas, the queue it explains is not listed again, and another model's ticket is not
    this one's."""
    model = {"namespace": "prod", "backend": "vllm", "model": "tiny"}
    readings = {"in_flight": [({**model, "instance": i}, 4.0) for i in ("a", "b")]}
    findings = [
        Finding(ALERTS["InferenceNearCapacity"], model),
        Finding(ALERTS["InferenceNearCapacity"], {**model, "model": "big"}),
        Finding(ALERTS["InferenceQueueingDelay"], model, explained_by="InferenceNearCapacity"),
    ]
    fleet = fleet_of(readings, findings, ("namespace", "backend", "model"))
    (tiny,) = fleet.models
    assert [a.name for a in tiny.causes] == ["InferenceNearCapacity"]
    assert [r.causes for r in tiny.replicas] == [(), ()]
    spec = spec_from_config({})
    report = Report("x", "5m", spec, {}, findings, fleet=fleet)
    assert report_json(report)["fleet"]["models"][0]["causes"] == ["InferenceNearCapacity"]
    head = next(line for line in render(report).splitlines() if line.startswith("fleet:"))
    assert head.endswith("InferenceNearCapacity (baseline)"), head
